//! Settings of remote invalidation.
//!
//! | variable                 | values                     | default | meaning |
//! |--------------------------|----------------------------|---------|---------|
//! | `FH_REMOTE_INVALIDATION` | `0`/`1` (`no`/`yes`, `off`/`on`) | `1` | revoke peers' firehoses on memory this rank unmaps |
//! | `FH_REVOKE_TIMEOUT`      | ms, `0..=3600000`          | `1000`  | longest an unmapping thread waits for the revoke; `0`: never wait (revokes still run, asynchronously) |
//! | `FH_REVOKE_STALL`        | ms, `0..=3600000`          | `100`   | when libc trims a heap (from `free`, `malloc_trim`), stop waiting once the `fh-revoke` thread has shown no progress for this long; `0`: never wait in those |
//!
//! Why 1 s: a revoke is one message round trip to each holder plus the release of its in-flight
//! RDMA (microseconds on a NIC, milliseconds on Soft-RoCE under emulation); a holder that does
//! not answer within a second is computing without a progress thread, and an application's
//! `free` should not hang on it for longer. Every rank should use the same values.
//!
//! Why a stall limit, and 100 ms: glibc trims heaps from `free`/`malloc_trim` with a malloc
//! arena's mutex held, and the `fh-revoke` thread allocates: when it needs that arena it cannot
//! move until the waiting thread returns, so waiting out the timeout would only stall the
//! application. A working revoke thread shows progress about every millisecond (its naps on the
//! link are 1 ms), so 100 ms of silence is a hundred missed turns; a test loop that beats every
//! millisecond missed a 20 ms limit once on a loaded CI host, hence the margin. A working thread
//! descheduled that long also ends the wait early; that happens only in heap trimming, for memory
//! the application has already freed, and the revoke then finishes in the background as after a
//! timeout.

use crate::config::ConfigError;
use crate::rma::RmaError;
use std::time::Duration;

pub(crate) const DEFAULT_TIMEOUT_MS: u64 = 1000;
pub(crate) const DEFAULT_STALL_MS: u64 = 100;
const MAX_TIMEOUT_MS: u64 = 3_600_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RevokeSettings {
    pub enabled: bool,
    /// Longest wait of an unmapping thread (zero: never waits).
    pub timeout: Duration,
    /// When libc trims a heap: longest wait while the worker shows no progress.
    pub stall: Duration,
}

impl Default for RevokeSettings {
    fn default() -> Self {
        RevokeSettings {
            enabled: true,
            timeout: Duration::from_millis(DEFAULT_TIMEOUT_MS),
            stall: Duration::from_millis(DEFAULT_STALL_MS),
        }
    }
}

impl RevokeSettings {
    /// Defaults overridden by the process environment; the reason on stderr on error.
    pub fn from_env() -> Result<RevokeSettings, RmaError> {
        Self::from_lookup(|k| std::env::var(k).ok()).map_err(|e| {
            crate::fh_error!("{e}");
            RmaError::BadConfig
        })
    }

    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut s = RevokeSettings::default();
        let bad = |var: &'static str, v: &str, want: &str| ConfigError {
            var,
            msg: format!("{v:?} is not {want}"),
        };
        if let Some(v) = get("FH_REMOTE_INVALIDATION") {
            s.enabled = match v.trim().to_ascii_lowercase().as_str() {
                "1" | "yes" | "on" | "true" => true,
                "0" | "no" | "off" | "false" => false,
                _ => return Err(bad("FH_REMOTE_INVALIDATION", &v, "0 or 1")),
            };
        }
        let ms = |var: &'static str| -> Result<Option<Duration>, ConfigError> {
            let Some(v) = get(var) else { return Ok(None) };
            let t = v.trim();
            (!t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
                .then(|| t.parse::<u64>().ok())
                .flatten()
                .filter(|&n| n <= MAX_TIMEOUT_MS)
                .map(|n| Some(Duration::from_millis(n)))
                .ok_or_else(|| bad(var, &v, "milliseconds in 0..=3600000"))
        };
        if let Some(d) = ms("FH_REVOKE_TIMEOUT")? {
            s.timeout = d;
        }
        if let Some(d) = ms("FH_REVOKE_STALL")? {
            s.stall = d;
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Result<RevokeSettings, ConfigError> {
        RevokeSettings::from_lookup(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn defaults_overrides_errors() {
        assert_eq!(with(&[]).unwrap(), RevokeSettings::default());
        assert!(RevokeSettings::default().enabled);
        let s = with(&[
            ("FH_REMOTE_INVALIDATION", "off"),
            ("FH_REVOKE_TIMEOUT", "0"),
        ])
        .unwrap();
        assert!(!s.enabled);
        assert_eq!(s.timeout, Duration::ZERO);
        assert_eq!(
            with(&[("FH_REVOKE_TIMEOUT", " 250 ")]).unwrap().timeout,
            Duration::from_millis(250)
        );
        assert_eq!(RevokeSettings::default().stall, Duration::from_millis(100));
        assert_eq!(
            with(&[("FH_REVOKE_STALL", "0")]).unwrap().stall,
            Duration::ZERO
        );
        for (var, val) in [
            ("FH_REMOTE_INVALIDATION", "2"),
            ("FH_REMOTE_INVALIDATION", ""),
            ("FH_REVOKE_TIMEOUT", "-1"),
            ("FH_REVOKE_TIMEOUT", "1s"),
            ("FH_REVOKE_TIMEOUT", "3600001"),
            ("FH_REVOKE_TIMEOUT", ""),
            ("FH_REVOKE_STALL", "x"),
            ("FH_REVOKE_STALL", "3600001"),
        ] {
            let e = with(&[(var, val)]).unwrap_err();
            assert_eq!(e.var, var, "{val:?}");
            assert!(e.to_string().contains(var));
        }
    }
}
