//! `fork` safety for the shim's own locks: the prepare handler takes them, the parent and child
//! handlers release them, so a child never inherits one locked by a thread that does not exist
//! in it.
//!
//! Order. The library registers its own handlers (`firehose`'s `src/rt/fork.rs`, with the locks
//! its owners register: monitor install, userfaultfd state, listener registry, reader ids) at its
//! first use, after ours (we register in the constructor), and glibc runs prepare handlers in
//! reverse order of registration: the
//! library's locks are taken first, then ours, in the order of [`Guards`]. No path holds one of
//! ours while it takes one of the library's (a cache is never dropped under the map's lock) or
//! another of ours out of this order.
//!
//! Caches do not cross fork. The library tells every inherited cache `forked` (it quarantines
//! itself: it belongs to the parent, whose verbs objects the child shares); the child handler
//! here forgets the domain map without dropping anything in it, so the child builds new caches
//! on its first registrations and never reuses an inherited one. Registering with verbs in a
//! child is then up to rdma-core and the kernel (the child shares the parent's uverbs context).

use std::cell::UnsafeCell;
use std::sync::MutexGuard;

use crate::cost_model::{Fit, DEREG, REG, RESIDENT_DEREG, RESIDENT_REG};
use crate::wrapper::Slot;

/// The locks held across `fork`, in acquisition order.
struct Guards {
    _pool: MutexGuard<'static, Vec<&'static Slot>>,
    pds: crate::pd_cache::ForkGuard,
    _reg: MutexGuard<'static, Fit>,
    _dereg: MutexGuard<'static, Fit>,
    /// The sampled re-registrations' fits: a child forked while a thread recorded a sample
    /// would otherwise hang in its first `fh_preload_stats`.
    _resident_reg: MutexGuard<'static, Fit>,
    _resident_dereg: MutexGuard<'static, Fit>,
}

/// Guards held between prepare and parent/child. Only touched by the forking thread, inside
/// `fork`, with the guards' own mutexes serialising concurrent forks.
struct Held(UnsafeCell<Option<Guards>>);

// SAFETY: accessed only by the thread that runs the atfork handlers of one `fork` call, and
// concurrent forks serialise on the first mutex taken in `prepare` (the slot is written after
// that lock is held and emptied before it is released) and on glibc's atfork lock.
unsafe impl Sync for Held {}

static HELD: Held = Held(UnsafeCell::new(None));

fn lock<T>(m: &'static std::sync::Mutex<T>) -> MutexGuard<'static, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

extern "C" fn prepare() {
    let _ = std::panic::catch_unwind(|| {
        let g = Guards {
            _pool: crate::wrapper::fork_lock(),
            pds: crate::pd_cache::fork_lock(),
            _reg: lock(&REG),
            _dereg: lock(&DEREG),
            _resident_reg: lock(&RESIDENT_REG),
            _resident_dereg: lock(&RESIDENT_DEREG),
        };
        // SAFETY: see `Held`.
        unsafe { *HELD.0.get() = Some(g) };
    });
}

extern "C" fn child() {
    let _ = std::panic::catch_unwind(|| {
        // The counters are the parent's copy: a summary from the child would double-count them.
        crate::settings::forget_stats_fd();
        // The child's registrations are its own: it starts caching, with an empty window.
        crate::bypass::restart_in_child();
        // SAFETY: see `Held`. This process has one thread now.
        if let Some(g) = unsafe { (*HELD.0.get()).as_mut() } {
            g.pds.forget_in_child();
        }
    });
    release();
}

extern "C" fn release() {
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: see `Held`; dropping the guards unlocks in this process's copy of the mutexes.
        let g = unsafe { (*HELD.0.get()).take() };
        drop(g);
    });
}

/// Register the handlers (once, from the constructor).
pub(crate) fn install() {
    // SAFETY: registering plain functions that never unwind.
    unsafe { libc::pthread_atfork(Some(prepare), Some(release), Some(child)) };
}
