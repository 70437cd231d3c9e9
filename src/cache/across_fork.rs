//! The parent's side of `fork` (the child's is `quarantine`, in `invalidate.rs`): what the cache's
//! `ForkMode` asks for, told by the atfork handlers through the listener registry
//! (`crate::fork`). Why a fork concerns registrations at all: `pin/fork_mode.rs`.

use std::sync::atomic::Ordering;

use super::core::Cache;
use crate::pin::fork_mode::ForkMode;

impl Cache {
    /// What a `fork` in this process does to this cache (its maker resolves `FH_FORK_MODE`).
    pub fn set_fork_mode(&self, mode: ForkMode) {
        self.fork_mode.store(mode as u8, Ordering::Relaxed);
    }

    pub fn fork_mode(&self) -> ForkMode {
        ForkMode::from_u8(self.fork_mode.load(Ordering::Relaxed))
    }

    /// atfork prepare, before any of the library's fork locks is taken: in `Release` and `Retire`
    /// modes, deregister every idle region (and those the helper had yet to unpin), so the child
    /// gets their pages. Returns how many.
    ///
    /// Skipped when the forking thread is inside the library (a `fork` from a signal handler that
    /// interrupted a call): the cache's mutex may be its own.
    pub(crate) fn release_before_fork(&self) -> usize {
        if self.fork_mode() == ForkMode::Keep || self.is_forked() || crate::inside::is_inside() {
            return 0;
        }
        self.flush()
    }

    /// atfork parent, after the fork: in `Retire` mode every cached region is detached (hook-safe:
    /// no lock, no allocation). Held ones stay valid for their holders and are deregistered at
    /// their release; the next request for any range pins anew.
    pub(crate) fn retire_after_fork(&self) {
        if self.fork_mode() == ForkMode::Retire && !self.is_forked() {
            self.invalidate_all();
        }
    }

    /// Every region detached at the next call, whatever its range (hook-safe). Through the gate's
    /// overflow bit, as a full invalidation ring: the next drain takes the whole index.
    pub fn invalidate_all(&self) {
        if self.is_forked() {
            return;
        }
        self.gate.0.announce();
        self.gate.0.overflowed();
    }
}
