//! am_bench: the active-message layer of `net::Peers` measured under `mpirun -np 2` (rank 0 ->
//! rank 1): request/reply round trip, one-way message rate, and how attentive a rank is while it
//! computes (with and without `FH_PROGRESS_THREAD`). Tables in perftest's layout, or `--json`.
//! `scripts/bench-am` runs it side by side with perftest and ucx_perftest in one VM boot.

// The TSC interval clock of reg_write_bw (a clock_gettime is microseconds under TCG).
#[allow(dead_code)]
#[path = "../reg_write_bw/clock.rs"]
mod clock;

mod args;
mod attn;
#[path = "../../cli.rs"]
mod cli;
mod lat;
mod pace;
mod rate;
mod report;
mod summary;

use firehose::internals::net::bootstrap;
use firehose::internals::net::{Peers, PeersConfig};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Handler ids. ECHO replies with its payload; SINK counts one-way messages; COUNT replies with
/// that count (sent after a burst, its reply says every message before it was handled: the link
/// is in order and so are the handlers); STOP ends the responder's current loop.
pub const ECHO: u16 = 1;
pub const SINK: u16 = 2;
pub const COUNT: u16 = 3;
pub const STOP: u16 = 4;

/// What the handlers share with the measuring code.
pub struct Ctx {
    pub peers: Peers,
    pub sunk: Arc<AtomicU64>,
    pub stop: Arc<AtomicBool>,
    pub clock: clock::Clock,
}

pub fn fail(msg: impl std::fmt::Display) -> ! {
    eprintln!("am_bench: FAIL: {msg}");
    std::process::exit(1);
}

impl Ctx {
    /// Rank 1's loop between tests: progress (busy) until rank 0 says STOP.
    pub fn serve(&self) {
        while !self.stop.swap(false, Ordering::AcqRel) {
            if let Err(e) = self.peers.progress() {
                fail(format!("rank {}: progress: {e:?}", self.peers.rank()));
            }
        }
    }

    /// Rank 0: ends rank 1's current loop.
    pub fn stop_responder(&self) {
        if let Err(e) = self.peers.am().send_oneway(1, STOP, &[]) {
            fail(format!("STOP to rank 1: {e:?}"));
        }
    }

    pub fn barrier(&self, what: &str) {
        if let Err(e) = self.peers.barrier() {
            fail(format!(
                "rank {}: barrier ({what}): {e:?}",
                self.peers.rank()
            ));
        }
    }
}

fn setup() -> Ctx {
    let mut cfg = PeersConfig::from_env().unwrap_or_else(|e| fail(format!("config: {e:?}")));
    let boot = bootstrap::from_env().unwrap_or_else(|e| fail(format!("bootstrap: {e}")));
    // The attentiveness test is about the responder: a progress thread on rank 0, which
    // busy-polls its own wait, would only take CPU from the ranks being measured.
    if boot.rank() != 1 {
        cfg.settings.progress_thread = false;
        cfg.settings.progress_auto = false;
    }
    // Rank 0 busy-polls its waits, as ib_send_lat does (FH_AM_SPIN_US, if set, still decides):
    // what is measured is the link and the responder, not how soon a sleeping requester wakes.
    if boot.rank() == 0 && std::env::var_os("FH_AM_SPIN_US").is_none() {
        cfg.settings.spin = std::time::Duration::from_secs(1);
    }
    if boot.size() < 2 {
        fail("run under mpirun -np 2 (or more; ranks above 1 stay idle)");
    }
    cfg.bootstrap = Some(boot);
    let peers = Peers::new(cfg).unwrap_or_else(|e| fail(format!("Peers::new: {e:?}")));
    let sunk = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let am = peers.am();
    am.register_request(ECHO, |_, p, r| {
        let _ = r.reply(p);
    });
    let s = sunk.clone();
    am.register_oneway(SINK, move |_, _| {
        s.fetch_add(1, Ordering::Relaxed);
    });
    let s = sunk.clone();
    am.register_request(COUNT, move |_, _, r| {
        let _ = r.reply(&s.load(Ordering::Relaxed).to_le_bytes());
    });
    let st = stop.clone();
    am.register_oneway(STOP, move |_, _| st.store(true, Ordering::Release));
    Ctx {
        peers,
        sunk,
        stop,
        clock: clock::Clock::new(clock::Kind::default_for_target()),
    }
}

fn main() {
    let a = match args::parse(std::env::args_os().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("am_bench: {e}");
            }
            eprint!("{}", args::USAGE);
            std::process::exit(if e.is_empty() { 0 } else { 2 });
        }
    };
    let ctx = setup();
    let me = ctx.peers.rank();
    if me == 0 && !a.json {
        print!("{}", report::header(&ctx, &a));
    }
    for t in &a.tests {
        ctx.barrier(t.name());
        let out = match t {
            args::Test::Lat => lat::run(&ctx, &a).map(|r| report::lat(&r, &a)),
            args::Test::Rate => rate::run(&ctx, &a).map(|r| report::rate(&r, &a)),
            args::Test::Attn => attn::run(&ctx, &a).map(|r| report::attn(&r, &a)),
        };
        if let Some(text) = out {
            print!("{text}");
        }
    }
    ctx.barrier("end");
    let _ = ctx.peers.finalize();
}
