//! Why a put, a get or an exposure failed. Plain and `Copy` (no allocation on the put path);
//! the reason behind it, where there is one, went to the log. The C API maps it to its status
//! codes in `ffi`.

use std::fmt;

use crate::cache::CacheError;
use crate::config::BadConfig;
use crate::net::NetError;

/// Why a put, a get or an exposure failed.
/// `repr(u8)`: a request's result is kept in one word of `done_board` (whose `ERRORS` lists the
/// variants in this order: a new one goes last, there too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RmaError {
    /// A required buffer pointer was NULL.
    Null,
    /// A length of zero.
    ZeroLength,
    /// `addr + len` overflows the address space.
    Overflow,
    /// Invalid rights, or a put whose length does not fit the algorithm's.
    BadAccess,
    /// Not a rank of this job.
    BadRank,
    /// An unknown request, or one already waited for; an exposure never made.
    UnknownHandle,
    /// Out of pinnable memory (here, or at the target).
    NoMemory,
    /// The local buffer could not be pinned, or the target refused the pin.
    PinFailed,
    /// Longer than a request can be.
    TooLarge,
    /// An invalid setting (reported on stderr), or settings the ranks do not agree on.
    BadConfig,
    /// No device (no local cache or no target pins where there are peers).
    NoDevice,
    /// A copy the kernel refused for another reason.
    Unsupported,
    /// The connection to the peer is gone.
    PeerLost,
    /// A wait outlasted `FH_AM_TIMEOUT_MS`.
    Timeout,
    /// The context was finalized.
    Finalized,
    /// A message longer than the transport carries.
    MsgTooLong,
    /// The target range is not (entirely) mapped at the target, or could not be pinned there.
    RemoteFault,
    /// The target does not expose this range for this access.
    RemoteDenied,
    /// No room to subscribe the remote invalidation to memory events.
    TooManyCaches,
    /// The bootstrap failed.
    Bootstrap,
    /// The local cache was busy (an unmap raced with the pin).
    Busy,
    /// The local cache was inherited across `fork`.
    Forked,
}

impl fmt::Display for RmaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RmaError::Null => "a required pointer argument was NULL",
            RmaError::ZeroLength => "length is zero",
            RmaError::Overflow => "addr + len overflows the address space",
            RmaError::BadAccess => "invalid rights or length",
            RmaError::BadRank => "rank out of range",
            RmaError::UnknownHandle => "unknown or already completed request",
            RmaError::NoMemory => "out of pinnable memory",
            RmaError::PinFailed => "the range could not be pinned",
            RmaError::TooLarge => "request too large",
            RmaError::BadConfig => "invalid configuration value",
            RmaError::NoDevice => "no usable RDMA device",
            RmaError::Unsupported => "operation not supported",
            RmaError::PeerLost => "the connection to the peer is gone",
            RmaError::Timeout => "timed out",
            RmaError::Finalized => "the context was finalized",
            RmaError::MsgTooLong => "message longer than the transport carries",
            RmaError::RemoteFault => "the target address is not mapped (or not pinnable)",
            RmaError::RemoteDenied => "the target does not expose this range for this access",
            RmaError::TooManyCaches => "no room to subscribe one more listener to memory events",
            RmaError::Bootstrap => "bootstrap failed",
            RmaError::Busy => "busy: an unmap raced with the pin",
            RmaError::Forked => "cache inherited across fork",
        })
    }
}

impl std::error::Error for RmaError {}

impl From<NetError> for RmaError {
    fn from(e: NetError) -> RmaError {
        match e {
            NetError::BadConfig => RmaError::BadConfig,
            NetError::NoDevice => RmaError::NoDevice,
            NetError::NoMemory => RmaError::NoMemory,
            NetError::Bootstrap => RmaError::Bootstrap,
            NetError::PeerLost => RmaError::PeerLost,
            NetError::BadRank => RmaError::BadRank,
            NetError::Timeout => RmaError::Timeout,
            NetError::Finalized => RmaError::Finalized,
            NetError::MsgTooLong => RmaError::MsgTooLong,
            NetError::UnknownHandle => RmaError::UnknownHandle,
            NetError::ZeroLength => RmaError::ZeroLength,
            NetError::Overflow => RmaError::Overflow,
        }
    }
}

impl From<CacheError> for RmaError {
    fn from(e: CacheError) -> RmaError {
        match e {
            CacheError::ZeroLength => RmaError::ZeroLength,
            CacheError::Overflow => RmaError::Overflow,
            CacheError::BadAccess => RmaError::BadAccess,
            CacheError::TooLarge => RmaError::TooLarge,
            CacheError::UnknownHandle => RmaError::UnknownHandle,
            CacheError::NoMemory => RmaError::NoMemory,
            CacheError::PinFailed => RmaError::PinFailed,
            CacheError::Busy => RmaError::Busy,
            CacheError::Forked => RmaError::Forked,
        }
    }
}

impl From<BadConfig> for RmaError {
    fn from(_: BadConfig) -> RmaError {
        RmaError::BadConfig
    }
}
