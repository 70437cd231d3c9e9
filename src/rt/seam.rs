//! The one place where the cache and the monitor meet. Neither layer implements the other's
//! traits: both implement or call these two, and only `ffi` and the shim wire them together.
//!
//! - [`MemoryListener`]: monitor -> cache (and -> the remote-pinning driver, `rma::revoke`).
//!   "This range is (about to be) gone." Called from hook context (inside a patched libc
//!   function, or on the userfaultfd reader thread): an implementation must not allocate, must
//!   not block on a lock an allocating path may hold, and must not call into verbs. It may unmap
//!   memory, though not on every call it gets: what it unmaps is reported to every listener,
//!   itself included, once it returns, round after round until a round unmaps nothing
//!   (`monitor/guard.rs`).
//!   `Cache::invalidate` is one. [`UnmapEvent`] says when the call comes relative to the unmap.
//! - [`RangeWatcher`]: cache -> monitor. "I pinned this range / I unpinned it." Called on normal
//!   API calls (never from a hook, never with readers excluded), so it may allocate and lock.

/// When a listener hears of an unmap, relative to the system call that does it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnmapEvent {
    /// A patched libc function, before its system call: the pages are still mapped. If the call
    /// succeeds, [`UnmapEvent::Done`] follows on the same thread (for listeners that want it).
    Before,
    /// The same patched call after its system call succeeded, before it returns to its caller:
    /// the old pages are gone from the range. A listener may wait here (bounded), since the
    /// caller has not seen the call return yet, but never when the thread is inside the library
    /// (`crate::rt::inside`) or holds a lock the listener's helpers need.
    Done,
    /// As [`UnmapEvent::Done`], for libc trimming a malloc heap (from `free` or `malloc_trim`):
    /// its own `madvise(MADV_DONTNEED)` or `mmap(MAP_FIXED)`, or its `munmap` of a whole
    /// secondary-arena heap (the patched function's return address lies in libc's code). glibc
    /// holds that arena's mutex across these calls, so a listener that waits here for another
    /// thread must give up once that thread stops making progress: its next `malloc` may be
    /// blocked on that very mutex. (libc's other unmaps, such as `free` of an mmapped chunk, hold
    /// no lock and come as `Done`.)
    DoneInLibcTrim,
    /// userfaultfd, on the `fh-uffd` reader thread: after the unmap, and the unmapping thread has
    /// already been let go (the kernel releases it once the event is read). Must not wait.
    Late,
    /// `fh_notify_unmapped` / `monitor::notify_unmapped`: whenever the caller says (documented
    /// as safe inside a memory hook: must not wait).
    Told,
    /// A patched `mmap` or `mremap` just returned this range as new memory, before its caller
    /// sees it. Whatever was registered there before is of pages that went earlier by a path no
    /// hook saw: a raw `munmap` system call on another thread whose userfaultfd event is still
    /// unread (the kernel frees the addresses before it queues the event). Without this, that
    /// thread's stale registration could be found by whoever maps the hole next. Must not wait.
    Fresh,
}

impl UnmapEvent {
    /// [`UnmapEvent::Done`] or [`UnmapEvent::DoneInLibcTrim`]: the second round of a patched call.
    pub fn is_done(self) -> bool {
        matches!(self, UnmapEvent::Done | UnmapEvent::DoneInLibcTrim)
    }
}

/// Receives "this range is (about to be) gone" events. See the module docs for the rules.
pub trait MemoryListener: Send + Sync {
    fn on_unmap(&self, addr: usize, len: usize);

    /// Every event with its kind. The default hands all but the `Done` kinds to
    /// [`MemoryListener::on_unmap`]: a cache drops its entries before the pages go, and has
    /// nothing left to do after.
    fn on_event(&self, addr: usize, len: usize, ev: UnmapEvent) {
        if !ev.is_done() {
            self.on_unmap(addr, len);
        }
    }

    /// Whether this listener wants the `Done` events ([`UnmapEvent::is_done`]) (read once, at subscribe): the
    /// hooks skip that second round while no subscribed listener does.
    fn wants_done(&self) -> bool {
        false
    }

    /// Called in a child process right after `fork`, inside the atfork child handler (one thread,
    /// other threads' locks possibly held forever): must not allocate, lock or call the backend.
    /// A cache quarantines itself here: what it holds belongs to the parent.
    fn forked(&self) {}

    /// Called in the parent before `fork`, from the atfork prepare handler, before the library
    /// takes its fork locks: may lock and call the backend (other threads still run). A cache
    /// releases what its `ForkMode` says must not cross the fork (`pin/fork_mode.rs`).
    fn before_fork(&self) {}

    /// Called in the parent after `fork`, from the atfork parent handler: hook rules (no
    /// allocation, no lock).
    fn after_fork_in_parent(&self) {}
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
