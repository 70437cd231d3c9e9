//! Why a cache operation failed. Plain and `Copy`: the hit path returns it without allocating.
//! The C API maps it to its status codes in `ffi`.

use std::fmt;

/// Why a cache operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CacheError {
    /// A length of zero.
    ZeroLength,
    /// `addr + len` (or its page-rounded end) overflows the address space.
    Overflow,
    /// Unknown access flag bits.
    BadAccess,
    /// The request alone is larger than the cache's `max_pinned`: it can never be cached.
    TooLarge,
    /// A handle this cache never issued, or one already released.
    UnknownHandle,
    /// Out of pinnable memory even after evicting every idle registration.
    NoMemory,
    /// The backend rejected the range (unmapped memory, EFAULT, EINVAL...).
    PinFailed,
    /// An unmap raced with a pin ahead of time (nothing stays pinned), or an unmap of the range
    /// is in progress.
    Busy,
    /// The cache was inherited across `fork`: quarantined in the child.
    Forked,
}

impl fmt::Display for CacheError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CacheError::ZeroLength => "length is zero",
            CacheError::Overflow => "addr + len overflows the address space",
            CacheError::BadAccess => "unknown access flag bits",
            CacheError::TooLarge => "request exceeds the cache's max_pinned",
            CacheError::UnknownHandle => "unknown or already released handle",
            CacheError::NoMemory => "out of pinnable memory even after evicting idle registrations",
            CacheError::PinFailed => "the pinning backend rejected the range",
            CacheError::Busy => "busy: a fork or an unmap raced with a pin ahead of time",
            CacheError::Forked => "cache inherited across fork: create a new one in the child",
        })
    }
}

impl std::error::Error for CacheError {}
