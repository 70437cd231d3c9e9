//! Why a peers or active-message operation failed. Plain and `Copy` (no allocation on the send
//! path); the reason behind it, where there is one, went to the log. The C API maps it to its
//! status codes in `ffi`.

use std::fmt;

use crate::config::BadConfig;

/// Why a peers or active-message operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NetError {
    /// An invalid setting (reported on stderr).
    BadConfig,
    /// No usable RDMA device (on this rank or another).
    NoDevice,
    /// A thread or buffer could not be had.
    NoMemory,
    /// The bootstrap failed or gave inconsistent answers.
    Bootstrap,
    /// The connection to the peer is gone.
    PeerLost,
    /// Not a rank of this job.
    BadRank,
    /// A wait outlasted its timeout (`FH_AM_TIMEOUT_MS`).
    Timeout,
    /// The endpoint was finalized.
    Finalized,
    /// Longer than the transport carries (`FH_AM_MAX_SIZE`).
    MsgTooLong,
    /// A spent or unknown ticket.
    UnknownHandle,
    /// An RDMA operation of zero bytes.
    ZeroLength,
    /// `addr + len` wraps around the address space.
    Overflow,
}

impl fmt::Display for NetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NetError::BadConfig => "invalid configuration value",
            NetError::NoDevice => "no usable RDMA device",
            NetError::NoMemory => "out of memory (or threads)",
            NetError::Bootstrap => "bootstrap (PMIx or the host's allgather) failed",
            NetError::PeerLost => "the connection to the peer is gone",
            NetError::BadRank => "rank out of range",
            NetError::Timeout => "timed out",
            NetError::Finalized => "the endpoint was finalized",
            NetError::MsgTooLong => "message longer than the transport carries",
            NetError::UnknownHandle => "unknown or spent ticket",
            NetError::ZeroLength => "length is zero",
            NetError::Overflow => "addr + len overflows the address space",
        })
    }
}

impl std::error::Error for NetError {}

impl From<BadConfig> for NetError {
    fn from(_: BadConfig) -> NetError {
        NetError::BadConfig
    }
}
