//! What `install` is asked to turn on, and what it reports as active (a leaf: the event sources
//! fill the status in, `mod.rs` hands it out).

/// Which event sources to turn on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MonitorOptions {
    /// Patch the entry of libc's unmap-family functions (x86_64 only).
    pub patch_libc: bool,
    /// Open a userfaultfd; `UffdWatcher` then registers pinned ranges with it while pinned.
    pub userfaultfd: bool,
}

/// What is actually active (process-wide).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MonitorStatus {
    /// Bitmask of [`Hooked`](super::Hooked) functions whose libc entry is patched.
    pub patched: u32,
    /// Bitmask of [`Hooked`](super::Hooked) functions we tried to patch and could not (symbol missing, mprotect...).
    pub patch_failed: u32,
    /// Patching was requested but this architecture is not supported.
    pub patch_unsupported: bool,
    /// A userfaultfd is open and its events are dispatched.
    pub uffd: bool,
    /// `UFFD_FEATURE_*` bits enabled on the fd.
    pub uffd_features: u64,
    /// errno of the failed userfaultfd setup step, or of the reader's failure (0 = none).
    pub uffd_errno: i32,
    /// Ranges registered with userfaultfd so far (one per watch, more if it spanned mappings the
    /// kernel only took one by one).
    pub uffd_registered: u64,
    /// Mappings that userfaultfd refused when watched (file-backed, other uffd owner...): hooks
    /// only there.
    pub uffd_unsupported: u64,
    /// Events read from the userfaultfd so far.
    pub uffd_events: u64,
}
