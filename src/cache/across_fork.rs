//! The parent's side of `fork` (the child's is `quarantine`, in `invalidate.rs`): what the cache's
//! `ForkMode` asks for, told by the atfork handlers through the listener registry
//! (`crate::rt::fork`). Why a fork concerns registrations at all: `pin/fork_mode.rs`.

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
    /// modes, deregister every idle region (and those the helper had yet to unpin, waiting for
    /// the ones it is unpinning now), so the child gets their pages. Returns how many.
    ///
    /// From here to the parent handler the helper pins nothing ahead. Not covered: a region
    /// released by another thread between this and the fork itself. And a `fork` from a signal
    /// handler that interrupted this thread inside the cache (its mutex or reader section may be
    /// this thread's): skipped when the thread is inside a C API call, a hang otherwise, as
    /// glibc's own `fork` hangs when the handler interrupted `malloc` (glibc offers `_Fork` for
    /// signal handlers).
    pub(crate) fn release_before_fork(&self) -> usize {
        if self.fork_mode() == ForkMode::Keep || self.is_forked() || crate::rt::inside::is_inside()
        {
            return 0;
        }
        // Before the flush takes the mutex: a helper miss that takes it later sees the flag.
        self.forking.store(true, Ordering::SeqCst);
        let n = self.flush();
        while self.deferred_busy.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
        n
    }

    /// atfork parent, after the fork (or after a failed one): in `Retire` mode every cached region
    /// is detached (hook-safe: no lock, no allocation). Held ones stay valid for their holders and
    /// are deregistered at their release; the next request for any range pins anew. The helper
    /// may pin ahead again.
    pub(crate) fn retire_after_fork(&self) {
        if self.fork_mode() == ForkMode::Retire && !self.is_forked() {
            self.invalidate_all();
        }
        self.forking.store(false, Ordering::SeqCst);
    }

    /// Every region detached at the next call, whatever its range (hook-safe). Through the gate's
    /// overflow bit, as a full invalidation ring: the next drain takes the whole index.
    pub(crate) fn invalidate_all(&self) {
        if self.is_forked() {
            return;
        }
        self.gate.announce();
        self.gate.overflowed();
    }
}
