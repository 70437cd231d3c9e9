//! The link's two environment settings, read once at construction: receive slots per peer
//! (`FH_AM_RECV_DEPTH`) and the slot size, i.e. the longest message (`FH_AM_MAX_SIZE`). The
//! defaults are the peer layer's (`net::settings`, the one the library runs with and
//! docs/settings.md lists); this parser is for programs that build a link without `Peers`. A value
//! that does not parse is an error naming the variable, never a silent default.

use crate::net::settings::{DEFAULT_MAX_SIZE, DEFAULT_RECV_DEPTH};
use std::fmt;

/// Environment variable: receive slots each rank posts per peer (the sender's initial credits).
pub(crate) const RECV_DEPTH_ENV: &str = "FH_AM_RECV_DEPTH";
/// Environment variable: bytes per receive slot, the longest message a link carries.
pub(crate) const MAX_SIZE_ENV: &str = "FH_AM_MAX_SIZE";

/// Bounds keep one peer's slots well inside what an HCA's receive queue and a sane MR allow.
const RECV_DEPTH_RANGE: (u32, u32) = (2, 16384);
/// At least 8 bytes (one AM header); at most 1 MiB (a slot is copied, never zero-copy).
const MAX_SIZE_RANGE: (usize, usize) = (8, 1 << 20);

/// Receive-side sizing of a `VerbsLink`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkSettings {
    /// Receive slots per peer (`Link::recv_slots`).
    pub recv_depth: u32,
    /// Bytes per slot (`Link::max_msg`).
    pub max_size: usize,
}

impl Default for LinkSettings {
    fn default() -> Self {
        LinkSettings {
            recv_depth: DEFAULT_RECV_DEPTH,
            max_size: DEFAULT_MAX_SIZE,
        }
    }
}

/// A setting that did not parse or is out of range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingsError(pub String);

impl fmt::Display for SettingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SettingsError {}

impl LinkSettings {
    /// Read `FH_AM_RECV_DEPTH` and `FH_AM_MAX_SIZE` from the environment (unset or empty = default).
    pub fn from_env() -> Result<Self, SettingsError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Same as `from_env` with the variables looked up by `get` (tests pass a map).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, SettingsError> {
        let d = LinkSettings::default();
        let recv_depth = parse(
            &get,
            RECV_DEPTH_ENV,
            d.recv_depth as u64,
            RECV_DEPTH_RANGE.0 as u64,
            RECV_DEPTH_RANGE.1 as u64,
        )?;
        let max_size = parse(
            &get,
            MAX_SIZE_ENV,
            d.max_size as u64,
            MAX_SIZE_RANGE.0 as u64,
            MAX_SIZE_RANGE.1 as u64,
        )?;
        Ok(LinkSettings {
            recv_depth: recv_depth as u32,
            max_size: max_size as usize,
        })
    }

    /// Check values built in code the same way the environment's are.
    pub(crate) fn validate(&self) -> Result<(), SettingsError> {
        let check = |name, v: u64, lo: u64, hi: u64| {
            if v < lo || v > hi {
                Err(SettingsError(format!(
                    "{name}={v} is out of range {lo}..={hi}"
                )))
            } else {
                Ok(())
            }
        };
        check(
            RECV_DEPTH_ENV,
            self.recv_depth as u64,
            RECV_DEPTH_RANGE.0 as u64,
            RECV_DEPTH_RANGE.1 as u64,
        )?;
        check(
            MAX_SIZE_ENV,
            self.max_size as u64,
            MAX_SIZE_RANGE.0 as u64,
            MAX_SIZE_RANGE.1 as u64,
        )
    }
}

fn parse(
    get: &impl Fn(&str) -> Option<String>,
    name: &str,
    default: u64,
    lo: u64,
    hi: u64,
) -> Result<u64, SettingsError> {
    let Some(raw) = get(name) else {
        return Ok(default);
    };
    let s = raw.trim();
    if s.is_empty() {
        return Ok(default);
    }
    let v: u64 = s
        .parse()
        .map_err(|_| SettingsError(format!("{name}={raw:?} is not a number")))?;
    if v < lo || v > hi {
        return Err(SettingsError(format!(
            "{name}={v} is out of range {lo}..={hi}"
        )));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(pairs: &[(&str, &str)]) -> Result<LinkSettings, SettingsError> {
        let map: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        LinkSettings::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn defaults_when_unset_or_empty() {
        assert_eq!(with(&[]).unwrap(), LinkSettings::default());
        assert_eq!(
            with(&[(RECV_DEPTH_ENV, " ")]).unwrap(),
            LinkSettings::default()
        );
        assert_eq!(LinkSettings::default().recv_depth, 32);
        assert_eq!(LinkSettings::default().max_size, 4096);
    }

    #[test]
    fn values_are_read() {
        let s = with(&[(RECV_DEPTH_ENV, "16"), (MAX_SIZE_ENV, " 256 ")]).unwrap();
        assert_eq!((s.recv_depth, s.max_size), (16, 256));
    }

    #[test]
    fn bad_values_name_the_variable() {
        let e = with(&[(RECV_DEPTH_ENV, "lots")]).unwrap_err();
        assert!(
            e.0.contains(RECV_DEPTH_ENV) && e.0.contains("not a number"),
            "{e}"
        );
        let e = with(&[(MAX_SIZE_ENV, "-4")]).unwrap_err();
        assert!(e.0.contains(MAX_SIZE_ENV), "{e}");
        let e = with(&[(MAX_SIZE_ENV, "4")]).unwrap_err();
        assert!(e.0.contains("out of range"), "{e}");
        let e = with(&[(RECV_DEPTH_ENV, "1")]).unwrap_err();
        assert!(e.0.contains("out of range"), "{e}");
        assert!(LinkSettings {
            recv_depth: 0,
            max_size: 64
        }
        .validate()
        .is_err());
        assert!(LinkSettings::default().validate().is_ok());
    }
}
