//! `fork` safety for the shim's own locks: the prepare handler takes them, the parent and child
//! handlers release them, so a child never inherits one locked by a thread that does not exist
//! in it. (The caches' internal locks are per protection domain; a child cannot use its parent's
//! verbs objects anyway, so it only ever builds new caches. The monitor owns its own fork story.)

use std::any::Any;
use std::cell::UnsafeCell;

/// Guards held between prepare and parent/child. Only touched by the forking thread, inside
/// `fork`, with the guards' own mutexes serialising concurrent forks.
struct Held(UnsafeCell<Option<Vec<Box<dyn Any>>>>);

// SAFETY: accessed only by the thread that runs the atfork handlers of one `fork` call, and
// concurrent forks serialise on the registry mutex taken first in `prepare` (the slot is written
// after that lock is held and emptied before it is released).
unsafe impl Sync for Held {}

static HELD: Held = Held(UnsafeCell::new(None));

extern "C" fn prepare() {
    let _ = std::panic::catch_unwind(|| {
        // Fixed order; no other path holds two of these at once.
        let g: Vec<Box<dyn Any>> = vec![
            Box::new(crate::wrapper::fork_lock()),
            Box::new(crate::pd_cache::fork_lock()),
            Box::new(crate::pd_cache::fork_lock_retired()),
        ];
        // SAFETY: see `Held`.
        unsafe { *HELD.0.get() = Some(g) };
    });
}

static IN_CHILD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// True in a process created by `fork` after the shim was loaded.
pub fn in_child() -> bool {
    IN_CHILD.load(std::sync::atomic::Ordering::Relaxed)
}

extern "C" fn child() {
    IN_CHILD.store(true, std::sync::atomic::Ordering::Relaxed);
    // The counters are the parent's copy: a summary from the child would double-count them.
    crate::settings::forget_stats_fd();
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
pub fn install() {
    // SAFETY: registering plain functions that never unwind.
    unsafe { libc::pthread_atfork(Some(prepare), Some(release), Some(child)) };
}
