//! Memory-event monitor: learns that a virtual range stopped being backed by the pages it had and
//! tells its listeners. It holds no cache state.
//!
//! Owns: the libc patches and hooks, the userfaultfd and its reader thread, the listener
//! registry, the install lock. May call: `rt` only (`seam`, `fork`, `inside`, `counted`,
//! `range_counts`, `monotonic`). It reports ranges; who listens (caches, the helper, remote
//! invalidation) subscribes, and what else waits on an unmap installs `UnmapWindows`.
//!
//! SEAM: listeners implement [`MemoryListener::on_unmap`], called from hook context (inside a
//! patched libc function, or on the userfaultfd reader thread). A listener must not allocate, must
//! not block on a lock an allocating path may hold, and must not call into verbs.
//!
//! Event sources (enable with [`install`]):
//! - `fh_notify_unmapped` / [`notify_unmapped`]: the application tells us.
//! - libc entry patching (`patch.rs`, `hooks.rs`, x86_64): munmap/mremap/madvise/mmap(MAP_FIXED)/
//!   shmdt/shmat(SHM_REMAP), synchronously *before* the pages go (`UnmapEvent::Before`), including
//!   glibc's internal calls from free/realloc/malloc_trim (they jump to the same code we patch);
//!   and, for listeners that want it (`wants_done`), again after a successful call, before it
//!   returns (`UnmapEvent::Done`: the remote-pinning driver waits there for its revocation).
//!   A successful `mmap` or moving/growing `mremap` reports the new range after the call
//!   (`UnmapEvent::Fresh`): a registration found there belongs to pages some raw unmap took away
//!   (its userfaultfd event may not be read yet), so another thread mapping the hole never
//!   inherits it.
//! - userfaultfd (`uffd/`): UNMAP/REMOVE/REMAP events for the ranges a [`UffdWatcher`] watches
//!   (exactly the pinned ranges, registered while pinned); catches raw syscalls and brk shrinking,
//!   but only *after* the unmap (`UnmapEvent::Late`).
//!
//! Listener rules beyond the seam above: on the `fh-uffd` thread a listener must not munmap /
//! free memory of a *watched* mapping (the kernel would wait for that same thread to read the
//! event: self-deadlock), and must not block on a lock that a thread may hold while unmapping
//! watched memory (that thread waits for the reader). `Cache::invalidate` (non-blocking, no
//! allocation) satisfies both.
//!
//! fork: the monitor registers its process-wide locks with `crate::rt::fork` (`INSTALL` here, the
//! userfaultfd state, the registry's writers: their places in the order are written next to each
//! registration), and the registry tells every listener [`MemoryListener::forked`] in the child.
//!
//! The helper thread's protocols (its unmap log and pins ahead, `crate::helper`) are not here:
//! the hooks call whatever [`UnmapWindows`] was installed (`unmap_windows.rs`), and the monitor
//! imports nothing of the helper.
//!
//! Files: `registry.rs` (listener slots), `guard.rs` (re-entrancy), `patch.rs` (code patching),
//! `hooks.rs` (replacement functions), `caller.rs` (their entries: libc's own calls told apart),
//! `ranges.rs` (what range each call invalidates), `options.rs` (what `install` is asked for and
//! reports), `maps.rs` (allocation-free /proc/self/maps reader), `unmap_windows.rs` (who else
//! hears of a patched unmap while it runs), `uffd/` (userfaultfd; live watches per address are
//! counted with `crate::rt::range_counts`),
//! `prune_ring.rs` (reader -> watch path, lock-free: ranges that went away), `switches.rs`
//! (test-only disabling of single paths).

mod caller;
mod guard;
mod hooks;
mod maps;
mod options;
mod patch;
mod prune_ring;
pub mod ranges;
mod registry;
mod switches;
mod uffd;
mod unmap_windows;

use std::sync::{Mutex, MutexGuard};

use crate::rt::fork::{self, ForkHook, HeldAcrossFork};

#[cfg(any(test, feature = "test-support"))]
pub use caller::tells_libc_apart;
pub use hooks::Hooked;
pub use options::{MonitorOptions, MonitorStatus};
#[cfg(any(test, feature = "test-support"))]
pub use registry::set_listener_limit_for_tests;
#[cfg(any(test, feature = "test-support"))]
pub use registry::{listener_count, MAX_LISTENERS};
pub use registry::{subscribe, Subscription};
pub use uffd::UffdWatcher;
pub use uffd::{watch_costs, WatchCosts};
pub use unmap_windows::{set_unmap_windows, UnmapWindows};

pub use uffd::quiesce;

/// Whether new mappings are reported (`UnmapEvent::Fresh`); false only under the test switch
/// `FH_TEST_DISABLE_HOOKS=fresh` (read at `install`), which the shim's exported `mmap` obeys too.
pub fn reports_fresh() -> bool {
    hooks::reports_fresh()
}

/// Watch a range with userfaultfd now (what `UffdWatcher::watch` does: count it and register
/// its pages); returns how many ranges were registered (1, or 0 when userfaultfd is off or refused
/// it). Pair it with one [`uffd_unwatch`] of the same range.
pub fn uffd_watch(addr: usize, len: usize) -> usize {
    uffd::watch(addr, len)
}

/// Undo one [`uffd_watch`] of the same range: its pages are unregistered once no watch covers
/// them.
pub fn uffd_unwatch(addr: usize, len: usize) {
    uffd::unwatch(addr, len)
}

/// Test hook: the userfaultfd reader fails as if a `read` had failed, retires and closes the fd
/// (which unregisters everything); userfaultfd stays off in this process.
#[cfg(any(test, feature = "test-support"))]
#[doc(hidden)]
pub fn test_fail_uffd_reader() {
    uffd::test_fail_reader()
}

pub use crate::rt::seam::{MemoryListener, UnmapEvent};

/// Tests: fan out an event of any kind, as the hooks or the reader would.
#[cfg(test)]
pub(crate) fn notify_event_for_tests(addr: usize, len: usize, ev: UnmapEvent) {
    guard::notify_guarded(addr, len, ev);
}

/// Fan an event out to all listeners as [`UnmapEvent::Told`] (used by `fh_notify_unmapped` and
/// the shim's hooks). Hook-safe: no allocation, no lock, no wait. A call made from inside a
/// listener (on the same thread) is dropped, so a listener that unmaps memory cannot recurse.
pub fn notify_unmapped(addr: usize, len: usize) {
    guard::notify_guarded(addr, len, UnmapEvent::Told);
}

/// Place 10 of `rt::fork`'s order: `install` takes the userfaultfd state (20) under it.
static INSTALL: Mutex<()> = Mutex::new(());

fn lock_install() -> MutexGuard<'static, ()> {
    INSTALL.lock().unwrap_or_else(|e| e.into_inner())
}

/// `INSTALL`, held across `fork`.
static FORK_HOOK: ForkHook = ForkHook {
    order: 10,
    prepare: || {
        // SAFETY: this hook's prepare, the lock just taken.
        unsafe { HELD.put(lock_install()) }
    },
    parent: || {
        // SAFETY: this hook's parent.
        drop(unsafe { HELD.take() })
    },
    child: || {
        // SAFETY: this hook's child.
        drop(unsafe { HELD.take() })
    },
};
static HELD: HeldAcrossFork<MutexGuard<'static, ()>> = HeldAcrossFork::new();

/// The monitor's places in `rt::fork`'s order: the listeners (1), `INSTALL` (10), the
/// userfaultfd state (20), the registry's writers (30). Before any of them is first taken, never
/// with one held.
fn register_fork_hooks() {
    registry::register_fork_hooks();
    fork::register(&FORK_HOOK);
    fork::register(&uffd::FORK_HOOK);
}

/// Install once per process (idempotent; later calls may enable more). Returns what is active.
///
/// Patching rewrites libc code while other threads may be running it: call this early (before
/// threads start calling munmap/mmap), e.g. at library init. A thread executing the first bytes of
/// a patched function at the exact moment of the write could see torn instructions.
pub fn install(opts: MonitorOptions) -> MonitorStatus {
    // Before the lock: registering the atfork handlers must not happen under one of our locks.
    register_fork_hooks();
    let _g = lock_install();
    switches::load_from_env();
    if opts.patch_libc {
        patch::install_hooks();
    }
    if opts.userfaultfd && !switches::disabled(switches::UFFD) {
        uffd::open();
    }
    status()
}

/// Start userfaultfd's reader thread now if userfaultfd is on (see `uffd::start_reader`): what
/// the first watched registration would otherwise wait for.
pub fn start_uffd_reader() {
    if !switches::disabled(switches::UFFD) {
        uffd::start_reader();
    }
}

/// What is active now.
pub fn status() -> MonitorStatus {
    let mut s = MonitorStatus::default();
    patch::fill_status(&mut s);
    uffd::fill_status(&mut s);
    s
}
