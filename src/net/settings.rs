//! Settings of the peer layer: defaults plus the `FH_AM_*` / `FH_PROGRESS_THREAD` variables.
//!
//! | variable             | values                               | default | why                   |
//! |----------------------|--------------------------------------|---------|-----------------------|
//! | `FH_AM_MAX_SIZE`     | bytes (suffix `k`/`m`), header incl. | `4k`    | one page: a Firehose move with put-in-move fits, and 32 peers x 32 slots x 4 KiB = 4 MiB of receive buffers stays cheap |
//! | `FH_AM_RECV_DEPTH`   | receive slots per peer, 4..=65535    | `32`    | 3 reserved (credits, bye) + 29 data: enough outstanding requests per peer for pipelining without pinning much |
//! | `FH_AM_TIMEOUT_MS`   | ms, or `inf`                         | `60000` | a wait that long is a dead or hung peer, reported as `FH_ERR_TIMEOUT`, never a hang |
//! | `FH_AM_PROBE_MS`     | ms (> 0)                             | `1000`  | a wait longer than this checks the peer (`Link::probe`): a peer that died silently is `FH_ERR_PEER_LOST` within about a second |
//! | `FH_AM_SPIN_US`      | µs a `wait` busy-polls before it sleeps, 0..=1000000 | `100` | a reply on a fast link is microseconds away and on Soft-RoCE under emulation tens of microseconds: a waiter that sleeps too early pays the scheduler's wake-up (hundreds of µs) on every round trip; after this long it sleeps, so many waiting threads do not all spin on one link |
//! | `FH_AM_MAX_QUEUED`   | bytes (suffix `k`/`m`/`g`) > 0, or `inf` | `16m` | bytes of messages that may wait for credits toward one peer; past it the peer (withholding credits) is given up on: see `am::queue_bound` |
//! | `FH_PROGRESS_THREAD` | `auto`, `0`/`1` (also `no`/`yes`, `off`/`on`) | `auto` | `auto`: on in a job of more than one rank, so a peer inside another library (`MPI_Barrier`), computing or asleep still answers moves and gets (the thread sleeps on the completion channel when idle); `0`: the application progresses when it calls in (runtimes that poll); `1`: on, also alone |
//! | `FH_PROGRESS_SPIN_US` | µs the progress thread keeps polling after its last event before it sleeps on the completion channel, 0..=1000000, or `inf` (never sleeps) | `100` | a wake-up through the completion channel costs a kernel event plus a scheduler wake-up (on Soft-RoCE under emulation 0.1-2 ms, against ~30 µs for a polled round trip): a message that follows another within this time is handled at polling speed, and the re-arm system calls are saved; `inf` gives the thread a core of its own for the best attentiveness |
//!
//! A bad value is `FH_ERR_BAD_CONFIG` with the variable named (on stderr from `from_env`).
//! The verbs link reads `recv_depth` from here too, so both agree on the credits.

use crate::config::{parse_size, ConfigError};
use crate::net::credits::RESERVED;
use crate::net::wire::HEADER_LEN;
use crate::net::NetError;
use std::time::Duration;

/// The peer layer's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetSettings {
    /// Largest message (header included) the active-message layer sends.
    pub max_size: usize,
    /// Receive slots each rank posts for each peer.
    pub recv_depth: u32,
    /// Longest a `wait` blocks; `None` = forever.
    pub timeout: Option<Duration>,
    /// A wait longer than this probes the peer (and again every interval).
    pub probe: Duration,
    /// How long a `wait` with nothing arriving keeps busy-polling before it sleeps briefly.
    pub spin: Duration,
    /// Bytes of messages that may wait for credits toward one peer (`usize::MAX`: no bound).
    pub max_queued: usize,
    /// Start a progress thread with the endpoint.
    pub progress_thread: bool,
    /// `FH_PROGRESS_THREAD=auto`: `Peers::new` sets `progress_thread` from the job's size (on
    /// with more than one rank). Ignored where no bootstrap runs (`Peers::from_link`, `Am::new`).
    pub progress_auto: bool,
    /// How long the progress thread polls after its last event before it sleeps on the link's
    /// completion channel; `None`: it never sleeps (polls, yielding the CPU now and then).
    pub progress_spin: Option<Duration>,
}

pub(crate) const DEFAULT_MAX_SIZE: usize = 4096;
pub(crate) const DEFAULT_RECV_DEPTH: u32 = 32;
pub(crate) const DEFAULT_TIMEOUT_MS: u64 = 60_000;
pub(crate) const DEFAULT_PROBE_MS: u64 = 1000;
pub(crate) const DEFAULT_SPIN_US: u64 = 100;
pub(crate) const DEFAULT_PROGRESS_SPIN_US: u64 = 100;
pub(crate) const DEFAULT_MAX_QUEUED: usize = crate::net::am::queue_bound::DEFAULT;

impl Default for NetSettings {
    fn default() -> Self {
        NetSettings {
            max_size: DEFAULT_MAX_SIZE,
            recv_depth: DEFAULT_RECV_DEPTH,
            timeout: Some(Duration::from_millis(DEFAULT_TIMEOUT_MS)),
            probe: Duration::from_millis(DEFAULT_PROBE_MS),
            spin: Duration::from_micros(DEFAULT_SPIN_US),
            max_queued: DEFAULT_MAX_QUEUED,
            progress_thread: false,
            progress_auto: true,
            progress_spin: Some(Duration::from_micros(DEFAULT_PROGRESS_SPIN_US)),
        }
    }
}

impl NetSettings {
    /// Defaults overridden by the process environment. Prints the reason to stderr on error.
    pub fn from_env() -> Result<NetSettings, NetError> {
        Self::from_lookup(|k| std::env::var(k).ok()).map_err(|e| {
            crate::fh_error!("{e}");
            NetError::BadConfig
        })
    }

    /// Defaults overridden by whatever `get` returns for each name (testable core).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<NetSettings, ConfigError> {
        let mut s = NetSettings::default();
        let bad = |var: &'static str, v: &str, want: &str| ConfigError {
            var,
            msg: format!("{v:?} is not {want}"),
        };
        if let Some(v) = get("FH_AM_MAX_SIZE") {
            s.max_size = parse_size(&v)
                .filter(|&n| n > HEADER_LEN && n <= u32::MAX as usize)
                .ok_or_else(|| {
                    bad(
                        "FH_AM_MAX_SIZE",
                        &v,
                        "a byte count above 16 (the header), e.g. 4k",
                    )
                })?;
        }
        if let Some(v) = get("FH_AM_RECV_DEPTH") {
            s.recv_depth = parse_u64(&v)
                .filter(|&n| n > RESERVED as u64 && n <= u16::MAX as u64)
                .ok_or_else(|| bad("FH_AM_RECV_DEPTH", &v, "a slot count in 4..=65535"))?
                as u32;
        }
        if let Some(v) = get("FH_AM_TIMEOUT_MS") {
            let t = v.trim().to_ascii_lowercase();
            s.timeout = if t == "inf" || t == "unlimited" {
                None
            } else {
                Some(Duration::from_millis(
                    parse_u64(&v).filter(|&n| n > 0).ok_or_else(|| {
                        bad(
                            "FH_AM_TIMEOUT_MS",
                            &v,
                            "a positive number of milliseconds or inf",
                        )
                    })?,
                ))
            };
        }
        if let Some(v) = get("FH_AM_PROBE_MS") {
            s.probe =
                Duration::from_millis(parse_u64(&v).filter(|&n| n > 0).ok_or_else(|| {
                    bad("FH_AM_PROBE_MS", &v, "a positive number of milliseconds")
                })?);
        }
        if let Some(v) = get("FH_AM_SPIN_US") {
            s.spin = Duration::from_micros(
                parse_u64(&v)
                    .filter(|&n| n <= 1_000_000)
                    .ok_or_else(|| bad("FH_AM_SPIN_US", &v, "microseconds in 0..=1000000"))?,
            );
        }
        if let Some(v) = get("FH_AM_MAX_QUEUED") {
            // `inf` (also `unlimited`): no bound.
            s.max_queued = parse_size(&v).filter(|&n| n > 0).ok_or_else(|| {
                bad(
                    "FH_AM_MAX_QUEUED",
                    &v,
                    "a positive byte count (e.g. 16m) or inf",
                )
            })?;
        }
        if let Some(v) = get("FH_PROGRESS_SPIN_US") {
            let t = v.trim().to_ascii_lowercase();
            s.progress_spin = if t == "inf" || t == "forever" {
                None
            } else {
                Some(Duration::from_micros(
                    parse_u64(&v).filter(|&n| n <= 1_000_000).ok_or_else(|| {
                        bad(
                            "FH_PROGRESS_SPIN_US",
                            &v,
                            "microseconds in 0..=1000000, or inf",
                        )
                    })?,
                ))
            };
        }
        if let Some(v) = get("FH_PROGRESS_THREAD") {
            (s.progress_auto, s.progress_thread) = match v.trim().to_ascii_lowercase().as_str() {
                "auto" => (true, false),
                "1" | "yes" | "on" | "true" => (false, true),
                "0" | "no" | "off" | "false" => (false, false),
                _ => return Err(bad("FH_PROGRESS_THREAD", &v, "auto, 0 or 1")),
            };
        }
        Ok(s)
    }

    /// The settings an endpoint of a job of `ranks` ranks runs with: `auto` resolved (a progress
    /// thread when there is a peer to answer).
    pub fn for_job(mut self, ranks: u32) -> NetSettings {
        if self.progress_auto {
            self.progress_thread = ranks > 1;
        }
        self
    }
}

fn parse_u64(v: &str) -> Option<u64> {
    let v = v.trim();
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(vars: &[(&str, &str)]) -> Result<NetSettings, ConfigError> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        NetSettings::from_lookup(|k| m.get(k).cloned())
    }

    /// `auto` (the default) gives a job with peers a progress thread and a lone rank none; an
    /// explicit value holds at any size (`0` for runtimes that poll).
    #[test]
    fn progress_thread_auto_follows_the_job_size() {
        let auto = with(&[]).unwrap();
        assert!(!auto.for_job(1).progress_thread);
        assert!(auto.for_job(2).progress_thread && auto.for_job(4).progress_thread);
        assert_eq!(with(&[("FH_PROGRESS_THREAD", "auto")]).unwrap(), auto);
        assert!(
            !with(&[("FH_PROGRESS_THREAD", "0")])
                .unwrap()
                .for_job(4)
                .progress_thread
        );
        assert!(
            with(&[("FH_PROGRESS_THREAD", "on")])
                .unwrap()
                .for_job(1)
                .progress_thread
        );
        assert!(with(&[("FH_PROGRESS_THREAD", "sometimes")]).is_err());
    }

    #[test]
    fn defaults_and_overrides() {
        assert_eq!(with(&[]).unwrap(), NetSettings::default());
        let s = with(&[
            ("FH_AM_MAX_SIZE", "8k"),
            ("FH_AM_RECV_DEPTH", "4"),
            ("FH_AM_TIMEOUT_MS", "inf"),
            ("FH_AM_PROBE_MS", "20"),
            ("FH_AM_SPIN_US", "0"),
            ("FH_AM_MAX_QUEUED", "64k"),
            ("FH_PROGRESS_THREAD", "1"),
            ("FH_PROGRESS_SPIN_US", "0"),
        ])
        .unwrap();
        assert_eq!(
            s,
            NetSettings {
                max_size: 8192,
                recv_depth: 4,
                timeout: None,
                probe: Duration::from_millis(20),
                spin: Duration::ZERO,
                max_queued: 64 << 10,
                progress_thread: true,
                progress_auto: false,
                progress_spin: Some(Duration::ZERO),
            }
        );
        assert_eq!(
            with(&[("FH_PROGRESS_SPIN_US", " INF ")])
                .unwrap()
                .progress_spin,
            None
        );
        assert_eq!(NetSettings::default().max_queued, 16 << 20);
        assert_eq!(
            with(&[("FH_AM_MAX_QUEUED", " INF ")]).unwrap().max_queued,
            usize::MAX
        );
        assert_eq!(
            with(&[("FH_AM_TIMEOUT_MS", "250")]).unwrap().timeout,
            Some(Duration::from_millis(250))
        );
    }

    #[test]
    fn errors_name_the_variable() {
        for (var, val) in [
            ("FH_AM_MAX_SIZE", "16"),
            ("FH_AM_MAX_SIZE", "big"),
            ("FH_AM_RECV_DEPTH", "3"),
            ("FH_AM_RECV_DEPTH", "65536"),
            ("FH_AM_RECV_DEPTH", "-1"),
            ("FH_AM_TIMEOUT_MS", "0"),
            ("FH_AM_TIMEOUT_MS", "1s"),
            ("FH_AM_PROBE_MS", ""),
            ("FH_AM_SPIN_US", "2000000"),
            ("FH_AM_SPIN_US", "-5"),
            ("FH_AM_MAX_QUEUED", "0"),
            ("FH_AM_MAX_QUEUED", "lots"),
            ("FH_AM_MAX_QUEUED", ""),
            ("FH_AM_MAX_QUEUED", "-1"),
            ("FH_PROGRESS_THREAD", "2"),
            ("FH_PROGRESS_SPIN_US", "1000001"),
            ("FH_PROGRESS_SPIN_US", "-1"),
            ("FH_PROGRESS_SPIN_US", "1ms"),
        ] {
            let e = with(&[(var, val)]).unwrap_err();
            assert_eq!(e.var, var, "{val:?}");
            assert!(e.to_string().contains(var));
        }
    }
}
