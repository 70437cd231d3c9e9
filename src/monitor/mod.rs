//! Memory-event monitor: learns that a virtual range stopped being backed by the pages it had and
//! tells its listeners. It holds no cache state.
//!
//! SEAM: listeners implement [`MemoryListener::on_unmap`], called from hook context (inside a
//! patched libc function, or on the userfaultfd reader thread). A listener must not allocate, must
//! not block on a lock an allocating path may hold, and must not call into verbs.

/// Receives "this range is (about to be) gone" events.
pub trait MemoryListener: Send + Sync {
    fn on_unmap(&self, addr: usize, len: usize);
}
