//! The one place where the cache and the monitor meet. Neither layer implements the other's
//! traits: both implement or call these two, and only `ffi` and the shim wire them together.
//!
//! - [`MemoryListener`]: monitor -> cache. "This range is (about to be) gone." Called from hook
//!   context (inside a patched libc function, or on the userfaultfd reader thread): an
//!   implementation must not allocate, must not block on a lock an allocating path may hold, and
//!   must not call into verbs. `Cache::invalidate` is one.
//! - [`RangeWatcher`]: cache -> monitor. "I pinned this range / I unpinned it." Called on normal
//!   API calls (never from a hook, never with readers excluded), so it may allocate and lock.

/// Receives "this range is (about to be) gone" events. See the module docs for the rules.
pub trait MemoryListener: Send + Sync {
    fn on_unmap(&self, addr: usize, len: usize);

    /// Called in a child process right after `fork`, inside the atfork child handler (one thread,
    /// other threads' locks possibly held forever): must not allocate, lock or call the backend.
    /// A cache quarantines itself here: what it holds belongs to the parent.
    fn forked(&self) {}
}

/// Told about every range the cache pins and, later, unpins, so a monitor can watch exactly the
/// memory that is pinned (e.g. userfaultfd registration) and stop watching it afterwards.
///
/// Every `watch(addr, len)` is matched by exactly one `unwatch(addr, len)` with the same values
/// (when the region is unpinned), so an implementation may count.
pub trait RangeWatcher: Send + Sync {
    fn watch(&self, addr: usize, len: usize);
    fn unwatch(&self, addr: usize, len: usize);
}
