//! Re-entrancy guard for the hook path.
//!
//! A listener may itself free or unmap memory (which enters our hooks again on the same thread);
//! nested calls must skip notification and just do the syscall, or we would recurse without end.
//! The thread-local is const-initialised and has no destructor, so touching it never allocates
//! (for a library loaded at start-up or preloaded, it lives in static TLS).

use std::cell::Cell;

use crate::seam::UnmapEvent;

thread_local! {
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// Run the listeners for [addr, addr+len) unless this thread is already inside a notification.
/// Returns whether they ran.
pub fn notify_guarded(addr: usize, len: usize, ev: UnmapEvent) -> bool {
    if len == 0 {
        return false;
    }
    // `try_with` fails only while the thread's TLS is being torn down: then skip the guard.
    let entered = IN_HOOK.try_with(|g| !g.replace(true)).unwrap_or(true);
    if !entered {
        return false;
    }
    super::registry::notify_all(addr, len, ev);
    let _ = IN_HOOK.try_with(|g| g.set(false));
    true
}

/// True while this thread is running listeners (lets the uffd reader mark itself too).
pub fn in_hook() -> bool {
    IN_HOOK.try_with(|g| g.get()).unwrap_or(false)
}
