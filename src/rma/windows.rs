//! Memory windows for the target's pins (`FH_MW`): every holder of a region gets a type 2
//! window of its own, bound through the queue pair to that holder, so the key it is given
//! works on its connection only and dies (the window is deallocated) as soon as it lets go of
//! the region, while the region stays registered for the next holder. See `target_pins` for how
//! regions are registered when windows are on.
//!
//! `FH_MW=auto` (the default) uses windows where the device binds type 2 windows, `on` requires
//! them (`fh_init` fails with `FH_ERR_BAD_CONFIG` where the device has none), `off` gives every
//! holder the region's own key (Firehose's original scheme: one key per region, valid on every
//! connection to this rank until the region is unpinned).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::net::verbs::VerbsLink;
use crate::net::Rank;
use crate::pin::verbs::{Mr, Mw, Pd};
use crate::pin::Access;
use firehose_proto::PinFailure;

/// The environment variable.
pub(crate) const MW_ENV: &str = "FH_MW";

/// `FH_MW`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WindowMode {
    Auto,
    On,
    Off,
}

impl WindowMode {
    pub(crate) fn parse(v: &str) -> Result<WindowMode, String> {
        match v.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(WindowMode::Auto),
            "on" | "1" | "yes" | "y" | "true" => Ok(WindowMode::On),
            "off" | "0" | "no" | "n" | "false" => Ok(WindowMode::Off),
            _ => Err(format!("{MW_ENV}={v}: expected auto, on or off")),
        }
    }

    pub(crate) fn from_env() -> Result<WindowMode, String> {
        match std::env::var(MW_ENV) {
            Ok(v) => Self::parse(&v),
            Err(_) => Ok(WindowMode::Auto),
        }
    }

    /// Whether to use windows, given whether the device binds type 2 windows; `Err` for `on`
    /// without them.
    pub(crate) fn decide(self, device_has_them: bool) -> Result<bool, String> {
        match (self, device_has_them) {
            (WindowMode::Off, _) => Ok(false),
            (WindowMode::Auto, has) => Ok(has),
            (WindowMode::On, true) => Ok(true),
            (WindowMode::On, false) => Err(format!(
                "{MW_ENV}=on, but the RDMA device binds no type 2 memory windows"
            )),
        }
    }
}

/// What the windows did, for stats (shared with the engine: the pins live under its lock).
#[derive(Debug, Default)]
pub(crate) struct WindowCounters {
    /// Windows bound (one per grant of a region to a peer).
    pub bound: AtomicU64,
    /// Windows deallocated (a holder let go: release, revoke ack, or the holder was lost).
    pub dropped: AtomicU64,
    /// Grants refused because no window could be allocated or bound.
    pub failed: AtomicU64,
    /// `drop_key` for a key no live window has (a bug if ever non-zero).
    pub unknown: AtomicU64,
}

/// A snapshot of the counters (`RmaStats::windows`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WindowStats {
    /// Windows are in use on this rank (`FH_MW` and the device).
    pub on: bool,
    pub bound: u64,
    pub dropped: u64,
    pub failed: u64,
    pub unknown: u64,
}

/// The live windows of one rank's target pins.
pub(crate) struct Windows {
    link: Arc<VerbsLink>,
    pd: Arc<Pd>,
    /// Live windows by key, with the peer each serves.
    live: HashMap<u32, (Rank, Mw)>,
    counters: Arc<WindowCounters>,
}

impl Windows {
    /// Windows bound through `link`'s queue pairs, allocated on `pd` (the link's).
    pub(crate) fn new(link: Arc<VerbsLink>, pd: Arc<Pd>) -> Windows {
        Windows {
            link,
            pd,
            live: HashMap::new(),
            counters: Arc::default(),
        }
    }

    pub(crate) fn counters(&self) -> Arc<WindowCounters> {
        self.counters.clone()
    }

    /// A window over `[addr, addr + len)` of `mr` for `peer` alone, with the remote rights
    /// `remote`; returns its key.
    pub(crate) fn bind(
        &mut self,
        peer: Rank,
        mr: &Mr,
        addr: u64,
        len: usize,
        remote: Access,
    ) -> Result<u32, PinFailure> {
        let fail = |f: PinFailure| {
            self.counters.failed.fetch_add(1, Ordering::Relaxed);
            Err(f)
        };
        let mut mw = match Mw::alloc(&self.pd) {
            Ok(mw) => mw,
            Err(_) => return fail(PinFailure::NoMemory),
        };
        let key = match self.link.bind_window(peer, &mut mw, mr, addr, len, remote) {
            Ok(k) => k,
            // A lost peer or a refused bind: this grant is refused, nothing was bound.
            Err(_) => return fail(PinFailure::Other),
        };
        self.live.insert(key, (peer, mw));
        self.counters.bound.fetch_add(1, Ordering::Relaxed);
        Ok(key)
    }

    /// `peer`'s window `key` dies now (deallocated: the device refuses it from this call on).
    pub(crate) fn unbind(&mut self, peer: Rank, key: u32) {
        match self.live.remove(&key) {
            Some((p, mw)) => {
                debug_assert_eq!(p, peer, "window {key:#x} was bound for rank {p}");
                drop(mw);
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
            None => {
                self.counters.unknown.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl Drop for Windows {
    /// Every window goes before this struct's `link`, which may hold the last reference to the
    /// queue pairs: a bound type 2 window holds its QP in the kernel, and destroying a QP that a
    /// window still holds waits on rxe (Linux 6.1) for 50 s, warns, and leaves the QP's CQs busy.
    /// (Fields drop in declaration order, `link` first: hence this, rather than relying on it.)
    fn drop(&mut self) {
        let n = self.live.len() as u64;
        self.live.clear();
        self.counters.dropped.fetch_add(n, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_decide() {
        assert_eq!(WindowMode::parse(""), Ok(WindowMode::Auto));
        assert_eq!(WindowMode::parse("AUTO"), Ok(WindowMode::Auto));
        assert_eq!(WindowMode::parse("on"), Ok(WindowMode::On));
        assert_eq!(WindowMode::parse("0"), Ok(WindowMode::Off));
        assert!(WindowMode::parse("maybe").is_err());
        assert_eq!(WindowMode::Auto.decide(true), Ok(true));
        assert_eq!(WindowMode::Auto.decide(false), Ok(false));
        assert_eq!(WindowMode::Off.decide(true), Ok(false));
        assert_eq!(WindowMode::On.decide(true), Ok(true));
        assert!(WindowMode::On.decide(false).is_err());
    }
}
