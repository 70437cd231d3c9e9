//! "This thread is inside the library": a per-thread depth, raised by every C entry point
//! (`ffi_guard!`), by the remote-pinning driver's own calls (`rma::Rma`), and for good by the
//! library's own threads (progress, revoke worker).
//!
//! Why: a memory listener that may *wait* in hook context (the revoke listener of
//! `rma::revoke`, on [`crate::seam::UnmapEvent::Done`]) waits for a helper thread that takes the
//! library's locks (the Firehose engine, the active-message endpoint, the pin-down cache). A
//! thread inside the library may hold one of them while it frees memory; if it waited there, it
//! would wait for itself. So a listener never waits on a thread that [`is_inside`]: it only
//! queues its work. (Except in libc's heap trimming, where reading this thread-local could be its
//! first touch, which in a library loaded with dlopen allocates under the arena mutex libc holds:
//! there the revoke listener does not read it, and its wait is bounded by `FH_REVOKE_STALL`.)
//!
//! The thread-local is const-initialised and has no destructor, so touching it never allocates
//! (safe in hook context); during thread teardown it reads as "inside" (never wait then).

use std::cell::Cell;
use std::marker::PhantomData;

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Keeps this thread marked as inside the library until dropped (nests).
#[must_use = "the thread counts as inside only while the guard lives"]
pub struct Inside {
    /// Not `Send`: it must be dropped on the thread that made it.
    _thread: PhantomData<*const ()>,
}

/// Marks this thread as inside the library until the guard is dropped.
#[inline]
pub fn enter() -> Inside {
    let _ = DEPTH.try_with(|d| d.set(d.get().saturating_add(1)));
    Inside {
        _thread: PhantomData,
    }
}

impl Drop for Inside {
    #[inline]
    fn drop(&mut self) {
        let _ = DEPTH.try_with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// Marks the calling thread as the library's own, for the rest of its life.
pub fn mark_thread() {
    std::mem::forget(enter());
}

/// Whether this thread is inside the library (or is one of its threads, or is being torn down).
#[inline]
pub fn is_inside() -> bool {
    DEPTH.try_with(|d| d.get() != 0).unwrap_or(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nests_and_is_per_thread() {
        assert!(!is_inside());
        {
            let _a = enter();
            assert!(is_inside());
            {
                let _b = enter();
                assert!(is_inside());
            }
            assert!(is_inside(), "the outer guard still holds");
            std::thread::spawn(|| assert!(!is_inside(), "another thread is not inside"))
                .join()
                .unwrap();
        }
        assert!(!is_inside());
        std::thread::spawn(|| {
            mark_thread();
            assert!(is_inside());
        })
        .join()
        .unwrap();
        assert!(!is_inside());
    }
}
