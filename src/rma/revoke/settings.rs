//! Settings of remote invalidation.
//!
//! | variable                 | values                     | default | meaning |
//! |--------------------------|----------------------------|---------|---------|
//! | `FH_REMOTE_INVALIDATION` | `0`/`1` (`no`/`yes`, `off`/`on`) | `1` | revoke peers' firehoses on memory this rank unmaps |
//! | `FH_REVOKE_TIMEOUT`      | ms, `0..=3600000`          | `1000`  | longest an unmapping thread waits for the revoke; `0`: never wait (revokes still run, asynchronously) |
//!
//! Why 1 s: a revoke is one message round trip to each holder plus the release of its in-flight
//! RDMA (microseconds on a NIC, milliseconds on Soft-RoCE under emulation); a holder that does
//! not answer within a second is computing without a progress thread, and an application's
//! `free` should not hang on it for longer. Every rank should use the same values.

use crate::config::ConfigError;
use crate::status::{fh_status, FhResult};
use std::time::Duration;

pub const DEFAULT_TIMEOUT_MS: u64 = 1000;
const MAX_TIMEOUT_MS: u64 = 3_600_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RevokeSettings {
    pub enabled: bool,
    /// Longest wait of an unmapping thread (zero: never waits).
    pub timeout: Duration,
}

impl Default for RevokeSettings {
    fn default() -> Self {
        RevokeSettings {
            enabled: true,
            timeout: Duration::from_millis(DEFAULT_TIMEOUT_MS),
        }
    }
}

impl RevokeSettings {
    /// Defaults overridden by the process environment; the reason on stderr on error.
    pub fn from_env() -> FhResult<RevokeSettings> {
        Self::from_lookup(|k| std::env::var(k).ok()).map_err(|e| {
            eprintln!("{e}");
            fh_status::FH_ERR_BAD_CONFIG
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
        if let Some(v) = get("FH_REVOKE_TIMEOUT") {
            let t = v.trim();
            let ms = (!t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
                .then(|| t.parse::<u64>().ok())
                .flatten()
                .filter(|&n| n <= MAX_TIMEOUT_MS)
                .ok_or_else(|| bad("FH_REVOKE_TIMEOUT", &v, "milliseconds in 0..=3600000"))?;
            s.timeout = Duration::from_millis(ms);
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
        for (var, val) in [
            ("FH_REMOTE_INVALIDATION", "2"),
            ("FH_REMOTE_INVALIDATION", ""),
            ("FH_REVOKE_TIMEOUT", "-1"),
            ("FH_REVOKE_TIMEOUT", "1s"),
            ("FH_REVOKE_TIMEOUT", "3600001"),
            ("FH_REVOKE_TIMEOUT", ""),
        ] {
            let e = with(&[(var, val)]).unwrap_err();
            assert_eq!(e.var, var, "{val:?}");
            assert!(e.to_string().contains(var));
        }
    }
}
