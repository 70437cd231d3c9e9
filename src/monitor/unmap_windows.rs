//! Who else hears of a patched unmap while it runs: the monitor only reports ranges. Whoever
//! must see unmaps in flight (the helper thread's unmap log and pins ahead, `helper/`) installs
//! an [`UnmapWindows`] once; the hooks call it around every patched unmap (`hooks.rs`). With none
//! installed, the hooks call nothing. Hook-safe: one atomic load to find it.

use std::sync::atomic::{AtomicPtr, Ordering::Acquire, Ordering::Release};

/// Called from hook context (inside a patched libc function, possibly inside malloc): no
/// allocation, no lock, and waits only as documented.
pub struct UnmapWindows {
    /// A patched unmap of [start, end) begins (before the listeners run); the value is handed
    /// back to `end`.
    pub begin: fn(start: usize, end: usize) -> u64,
    /// It ended (after its system call and the listeners' `Done`).
    pub end: fn(u64),
    /// After `begin`, before the listeners and the system call, unless libc is trimming a heap
    /// (an arena mutex is held): wait, bounded, for what must finish with [start, end) first.
    pub before_unmap: fn(start: usize, end: usize),
}

static WINDOWS: AtomicPtr<UnmapWindows> = AtomicPtr::new(std::ptr::null_mut());

/// Install `w` (idempotent; the last one installed wins). Not from hook context.
pub fn set_unmap_windows(w: &'static UnmapWindows) {
    WINDOWS.store(w as *const UnmapWindows as *mut UnmapWindows, Release);
}

/// The installed windows, if any.
#[inline]
pub(crate) fn unmap_windows() -> Option<&'static UnmapWindows> {
    // SAFETY: null or from a `&'static` in `set_unmap_windows`.
    unsafe { WINDOWS.load(Acquire).as_ref() }
}
