//! Status codes returned by every fallible operation, in their own number range (0 = success,
//! 7000.. = errors) so they never collide with errno values a caller might also be handling.

/// Result of a firehose call. `FH_OK` is 0; every error is in the 7000 range.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum fh_status {
    /// Success.
    FH_OK = 0,
    /// A required pointer argument was NULL.
    FH_ERR_NULL = 7001,
    /// A length of zero was passed where a range is required.
    FH_ERR_ZERO_LENGTH = 7002,
    /// `addr + len` overflows the address space.
    FH_ERR_OVERFLOW = 7003,
    /// Unknown access flag bits were passed.
    FH_ERR_BAD_ACCESS = 7004,
    /// The handle was never issued by this cache, or was already released.
    FH_ERR_UNKNOWN_HANDLE = 7005,
    /// Pinning failed for lack of pinnable memory (RLIMIT_MEMLOCK, device keys) even after evicting
    /// every idle registration.
    FH_ERR_NO_MEMORY = 7006,
    /// The pinning backend rejected the range (unmapped memory, EFAULT, EINVAL...).
    FH_ERR_PIN_FAILED = 7007,
    /// The request is larger than the configured `FH_MAX_PINNED` limit and can never be cached.
    FH_ERR_TOO_LARGE = 7008,
    /// An invalid configuration value (config struct or `FH_*` environment variable).
    FH_ERR_BAD_CONFIG = 7009,
    /// No RDMA device is usable by the requested backend.
    FH_ERR_NO_DEVICE = 7010,
    /// The cache still holds in-use registrations (finalize refused).
    FH_ERR_BUSY = 7011,
    /// A Rust panic was caught at the C boundary; the call had no effect that can be relied on.
    FH_ERR_PANIC = 7012,
    /// The operation is not supported by this backend or build.
    FH_ERR_UNSUPPORTED = 7013,
    /// The cache was created before `fork` in the parent: in the child it is quarantined (its
    /// registrations belong to the parent's address space and verbs objects, its helper thread
    /// stayed in the parent): `fh_register`, `fh_deregister` and `fh_get_helper_stats` return
    /// this. Create a new cache in the child; `fh_cache_free` of the inherited one is fine (it
    /// releases nothing of the parent's). The same for a peers context from `fh_init`: every
    /// call on it in the child returns this (its connections and threads are the parent's), and
    /// `fh_finalize` of it there touches nothing and returns `FH_OK`.
    FH_ERR_FORKED = 7014,
    /// `fh_cache_new`: no more caches can be subscribed to memory events in this process
    /// (`MAX_LISTENERS`, 65536, at once; or no memory for the registry). A cache nobody
    /// invalidates would hand out stale registrations, so none is made.
    FH_ERR_TOO_MANY_CACHES = 7015,
    /// The connection to the peer is gone (it exited, or its queue pair went to the error state,
    /// or it finalized): operations that needed it fail, other peers keep working.
    FH_ERR_PEER_LOST = 7016,
    /// The bootstrap (PMIx, the host's allgather callback) failed or gave inconsistent answers.
    FH_ERR_BOOTSTRAP = 7017,
    /// A rank outside `0..fh_size()`.
    FH_ERR_BAD_RANK = 7018,
    /// A blocking call waited longer than its timeout (`FH_AM_TIMEOUT_MS`).
    FH_ERR_TIMEOUT = 7019,
    /// The context was finalized: no more communication through it.
    FH_ERR_FINALIZED = 7020,
    /// A message is longer than the largest one the transport carries (`FH_AM_MAX_SIZE`).
    FH_ERR_MSG_TOO_LONG = 7021,
    /// The target address range is not (entirely) mapped in the target process, or the target
    /// could not pin it: nothing was written there (a put) or read (a get).
    FH_ERR_REMOTE_FAULT = 7022,
    /// The target does not let peers reach this range with this access: with
    /// `FH_EXPOSE=declared` it was not exposed (`fh_expose`) with it; in any mode it is the
    /// library's own memory. Nothing was written there (a put) or read (a get).
    FH_ERR_REMOTE_DENIED = 7023,
}

impl fh_status {
    /// Static, NUL-terminated description of a status.
    pub(crate) fn as_cstr(self) -> &'static std::ffi::CStr {
        use fh_status::*;
        match self {
            FH_OK => c"success",
            FH_ERR_NULL => c"a required pointer argument was NULL",
            FH_ERR_ZERO_LENGTH => c"length is zero",
            FH_ERR_OVERFLOW => c"addr + len overflows the address space",
            FH_ERR_BAD_ACCESS => c"unknown access flag bits",
            FH_ERR_UNKNOWN_HANDLE => c"unknown or already released handle",
            FH_ERR_NO_MEMORY => c"out of pinnable memory even after evicting idle registrations",
            FH_ERR_PIN_FAILED => c"the pinning backend rejected the range",
            FH_ERR_TOO_LARGE => c"request exceeds FH_MAX_PINNED",
            FH_ERR_BAD_CONFIG => c"invalid configuration value",
            FH_ERR_NO_DEVICE => c"no usable RDMA device",
            FH_ERR_BUSY => c"registrations are still in use",
            FH_ERR_PANIC => c"internal panic caught at the C boundary",
            FH_ERR_UNSUPPORTED => c"operation not supported by this backend",
            FH_ERR_FORKED => c"cache inherited across fork: create a new one in the child",
            FH_ERR_TOO_MANY_CACHES => {
                c"too many caches: no room to subscribe one more to memory events"
            }
            FH_ERR_PEER_LOST => c"the connection to the peer is gone",
            FH_ERR_BOOTSTRAP => c"bootstrap (PMIx or the host's allgather) failed",
            FH_ERR_BAD_RANK => c"rank out of range",
            FH_ERR_TIMEOUT => c"timed out",
            FH_ERR_FINALIZED => c"the context was finalized",
            FH_ERR_MSG_TOO_LONG => c"message longer than the transport carries",
            FH_ERR_REMOTE_FAULT => {
                c"the target address is not mapped (or not pinnable) at the target"
            }
            FH_ERR_REMOTE_DENIED => {
                c"the target does not expose this range for this access (FH_EXPOSE, fh_expose)"
            }
        }
    }
}

/// Rust-side result alias used inside the crate.
pub type FhResult<T> = Result<T, fh_status>;
