//! What the link test programs (net-link, rdma-link) share: their settings from the environment,
//! and running N ranks as threads of one process over one device (`LocalGroup` bootstrap), where
//! the first rank to fail ends the run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use firehose::internals::net::bootstrap::local::{LocalBootstrap, LocalGroup};
use firehose::internals::net::verbs::{gid_index_from_env, LinkSettings, VerbsLinkConfig};
use firehose::internals::net::Bootstrap;
use firehose::internals::pin::verbs::Context;

use crate::{open_device_or_verdict, EXIT_FAIL, EXIT_PASS};

/// A non-empty environment variable.
pub fn env(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

/// A numeric environment variable, `default` when unset; a non-number is an error naming it.
pub fn env_num(k: &str, default: u64) -> Result<u64, String> {
    env(k).map_or(Ok(default), |v| {
        v.parse().map_err(|_| format!("{k}={v:?} is not a number"))
    })
}

/// The settings every link test reads: the device (`FH_DEVICE`, else `FH_RDMA_DEV`), the link's
/// configuration (`FH_IB_PORT`, `FH_GID_INDEX`, `FH_AM_RECV_DEPTH`, `FH_AM_MAX_SIZE`), and
/// whether `FH_TEST_BREAK` asks the program to break its own check once.
pub struct LinkEnv {
    pub device: Option<String>,
    pub cfg: VerbsLinkConfig,
    pub break_requested: bool,
}

impl LinkEnv {
    pub fn from_env() -> Result<Self, String> {
        let port =
            u8::try_from(env_num("FH_IB_PORT", 1)?).map_err(|_| "FH_IB_PORT out of range")?;
        Ok(LinkEnv {
            device: env("FH_DEVICE").or_else(|| env("FH_RDMA_DEV")),
            cfg: VerbsLinkConfig {
                port,
                gid_index: gid_index_from_env().map_err(|e| e.to_string())?,
                settings: LinkSettings::from_env().map_err(|e| e.to_string())?,
                ..VerbsLinkConfig::default()
            },
            break_requested: env("FH_TEST_BREAK").is_some_and(|v| v != "0"),
        })
    }
}

/// A link test's options: the link's settings and its one count (messages or rounds).
pub struct Options {
    pub link: LinkEnv,
    pub count: u32,
}

/// The whole run of a link test: reads `LinkEnv` and the count (`count_var`, `count_default`
/// when unset), arms `break_once` from `FH_TEST_BREAK`, and runs `rank_main` on `ranks` ranks
/// (`run_ranks`). Returns the exit code; a bad setting is `FAIL`.
pub fn run_link_test(
    name: &str,
    ranks: u32,
    within: Duration,
    (count_var, count_default): (&str, u64),
    break_once: &AtomicBool,
    rank_main: fn(&Arc<Context>, LocalBootstrap, &Options) -> Result<String, String>,
) -> i32 {
    let options = || -> Result<Options, String> {
        let link = LinkEnv::from_env()?;
        break_once.store(link.break_requested, Ordering::SeqCst);
        Ok(Options {
            count: env_num(count_var, count_default)? as u32,
            link,
        })
    };
    match options() {
        Ok(o) => run_ranks(
            name,
            ranks,
            o.link.device.clone().as_deref(),
            within,
            o,
            rank_main,
        ),
        Err(e) => {
            println!("FAIL: {e}");
            EXIT_FAIL
        }
    }
}

/// Opens `device` (no device: SKIP), runs `rank_main` for `ranks` ranks on their own threads,
/// prints each rank's summary, and returns the exit code: the first failure (or a rank silent
/// for `within`) is `FAIL` at once, since the other ranks may then wait in a collective forever.
pub fn run_ranks<O: Send + Sync + 'static>(
    name: &str,
    ranks: u32,
    device: Option<&str>,
    within: Duration,
    opts: O,
    rank_main: fn(&Arc<Context>, LocalBootstrap, &O) -> Result<String, String>,
) -> i32 {
    // No device at all is a skip; a device that exists but cannot be used is a failure.
    let ctx = match open_device_or_verdict(device) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let opts = Arc::new(opts);
    let (tx, rx) = mpsc::channel();
    for b in LocalGroup::new(ranks) {
        let (ctx, opts, tx) = (Arc::clone(&ctx), Arc::clone(&opts), tx.clone());
        std::thread::spawn(move || {
            let rank = b.rank();
            let r = rank_main(&ctx, b, &opts).map_err(|e| format!("rank {rank}: {e}"));
            let _ = tx.send(r);
        });
    }
    drop(tx);
    for _ in 0..ranks {
        match rx.recv_timeout(within) {
            Ok(Ok(summary)) => println!("{summary}"),
            Ok(Err(e)) => {
                println!("FAIL: {e}");
                return EXIT_FAIL;
            }
            Err(_) => {
                println!("FAIL: a rank neither finished nor failed in {within:?}");
                return EXIT_FAIL;
            }
        }
    }
    println!("PASS: {name} on {} ({ranks} ranks)", ctx.name());
    EXIT_PASS
}
