//! The one place where the layers' errors become the C API's status codes. Each layer returns
//! its own plain error enum; every C export maps it here (`?` or `.into()`), so the numbers a C
//! caller sees are decided in one file.

use crate::assembly::AssembleError;
use crate::cache::CacheError;
use crate::config::BadConfig;
use crate::ffi::status::fh_status::{self, *};
use crate::net::bootstrap::BadOps;
use crate::net::NetError;
use crate::rma::RmaError;

impl From<CacheError> for fh_status {
    fn from(e: CacheError) -> fh_status {
        match e {
            CacheError::ZeroLength => FH_ERR_ZERO_LENGTH,
            CacheError::Overflow => FH_ERR_OVERFLOW,
            CacheError::BadAccess => FH_ERR_BAD_ACCESS,
            CacheError::TooLarge => FH_ERR_TOO_LARGE,
            CacheError::UnknownHandle => FH_ERR_UNKNOWN_HANDLE,
            CacheError::NoMemory => FH_ERR_NO_MEMORY,
            CacheError::PinFailed => FH_ERR_PIN_FAILED,
            CacheError::Busy => FH_ERR_BUSY,
            CacheError::Forked => FH_ERR_FORKED,
        }
    }
}

impl From<AssembleError> for fh_status {
    fn from(e: AssembleError) -> fh_status {
        match e {
            AssembleError::TooManyCaches => FH_ERR_TOO_MANY_CACHES,
        }
    }
}

impl From<BadConfig> for fh_status {
    fn from(_: BadConfig) -> fh_status {
        FH_ERR_BAD_CONFIG
    }
}

/// `HostOps` that cannot describe a job: the struct is configuration, so a NULL `allgather` in
/// it is a bad setting, not a NULL argument.
impl From<BadOps> for fh_status {
    fn from(_: BadOps) -> fh_status {
        FH_ERR_BAD_CONFIG
    }
}

impl From<NetError> for fh_status {
    fn from(e: NetError) -> fh_status {
        match e {
            NetError::BadConfig => FH_ERR_BAD_CONFIG,
            NetError::NoDevice => FH_ERR_NO_DEVICE,
            NetError::NoMemory => FH_ERR_NO_MEMORY,
            NetError::Bootstrap => FH_ERR_BOOTSTRAP,
            NetError::PeerLost => FH_ERR_PEER_LOST,
            NetError::BadRank => FH_ERR_BAD_RANK,
            NetError::Timeout => FH_ERR_TIMEOUT,
            NetError::Finalized => FH_ERR_FINALIZED,
            NetError::MsgTooLong => FH_ERR_MSG_TOO_LONG,
            NetError::UnknownHandle => FH_ERR_UNKNOWN_HANDLE,
            NetError::ZeroLength => FH_ERR_ZERO_LENGTH,
            NetError::Overflow => FH_ERR_OVERFLOW,
        }
    }
}

impl From<RmaError> for fh_status {
    fn from(e: RmaError) -> fh_status {
        match e {
            RmaError::Null => FH_ERR_NULL,
            RmaError::ZeroLength => FH_ERR_ZERO_LENGTH,
            RmaError::Overflow => FH_ERR_OVERFLOW,
            RmaError::BadAccess => FH_ERR_BAD_ACCESS,
            RmaError::BadRank => FH_ERR_BAD_RANK,
            RmaError::UnknownHandle => FH_ERR_UNKNOWN_HANDLE,
            RmaError::NoMemory => FH_ERR_NO_MEMORY,
            RmaError::PinFailed => FH_ERR_PIN_FAILED,
            RmaError::TooLarge => FH_ERR_TOO_LARGE,
            RmaError::BadConfig => FH_ERR_BAD_CONFIG,
            RmaError::NoDevice => FH_ERR_NO_DEVICE,
            RmaError::Unsupported => FH_ERR_UNSUPPORTED,
            RmaError::PeerLost => FH_ERR_PEER_LOST,
            RmaError::Timeout => FH_ERR_TIMEOUT,
            RmaError::Finalized => FH_ERR_FINALIZED,
            RmaError::MsgTooLong => FH_ERR_MSG_TOO_LONG,
            RmaError::RemoteFault => FH_ERR_REMOTE_FAULT,
            RmaError::RemoteDenied => FH_ERR_REMOTE_DENIED,
            RmaError::TooManyCaches => FH_ERR_TOO_MANY_CACHES,
            RmaError::Bootstrap => FH_ERR_BOOTSTRAP,
            RmaError::Busy => FH_ERR_BUSY,
            RmaError::Forked => FH_ERR_FORKED,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `HostOps` that cannot describe a job is `FH_ERR_BAD_CONFIG` at the C API.
    #[test]
    fn bad_ops_are_bad_config() {
        for e in [
            BadOps::ZeroSize,
            BadOps::RankOutOfRange { rank: 2, size: 2 },
            BadOps::NoAllgather,
        ] {
            assert_eq!(fh_status::from(e), FH_ERR_BAD_CONFIG);
        }
    }

    /// An error passed up from a lower layer keeps its status: the cache's and the network's
    /// through `RmaError` are what they are directly.
    #[test]
    fn nested_errors_keep_their_status() {
        use CacheError as C;
        for c in [
            C::ZeroLength,
            C::Overflow,
            C::BadAccess,
            C::TooLarge,
            C::UnknownHandle,
            C::NoMemory,
            C::PinFailed,
            C::Busy,
            C::Forked,
        ] {
            assert_eq!(fh_status::from(RmaError::from(c)), fh_status::from(c));
        }
        use NetError as N;
        for n in [
            N::BadConfig,
            N::NoDevice,
            N::NoMemory,
            N::Bootstrap,
            N::PeerLost,
            N::BadRank,
            N::Timeout,
            N::Finalized,
            N::MsgTooLong,
            N::UnknownHandle,
            N::ZeroLength,
            N::Overflow,
        ] {
            assert_eq!(fh_status::from(RmaError::from(n)), fh_status::from(n));
        }
    }
}
