//! Errors of the Firehose core: what a caller did wrong (`FhError`, returned at once, nothing
//! changed), what happened to an op later (`FhError` inside `Event::Failed`), what a peer sent
//! that does not parse or does not fit the protocol (`WireError`, nothing changed), and why the
//! driver's pinning backend refused a range (`PinFailure`).

use super::wire::RemoteError;
use crate::net::Rank;
use crate::rt::status::fh_status;

/// An op refused by `acquire`/`release`, or failed later (`Event::Failed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FhError {
    /// `len` is zero.
    ZeroLength,
    /// `raddr + len` overflows u64.
    Overflow,
    /// Not a rank of the job.
    BadRank(Rank),
    /// The own rank: the driver copies locally, Firehose has nothing to pin.
    SelfRank,
    /// Longer than `FirehoseConfig::max_op_len` (the driver splits it).
    TooLong {
        max: usize,
    },
    /// A small put whose payload length differs from `len`.
    PutLength,
    /// Rights that are none, unknown, or without `WRITE` for a small put.
    BadRights,
    /// The op id is already in use (acquire) or unknown / not holding refs (release).
    DuplicateOp,
    UnknownOp,
    /// The peer was declared lost (`peer_lost`): its ops failed, new ones are refused.
    PeerLost(Rank),
    /// The target could not pin or write part of the range (see `RemoteError`).
    Remote(RemoteError),
}

impl FhError {
    /// The C status the driver reports for this error.
    pub fn status(self) -> fh_status {
        use fh_status::*;
        match self {
            FhError::ZeroLength => FH_ERR_ZERO_LENGTH,
            FhError::Overflow => FH_ERR_OVERFLOW,
            FhError::BadRank(_) | FhError::SelfRank => FH_ERR_BAD_RANK,
            FhError::TooLong { .. } => FH_ERR_TOO_LARGE,
            FhError::PutLength | FhError::BadRights => FH_ERR_BAD_ACCESS,
            FhError::DuplicateOp | FhError::UnknownOp => FH_ERR_UNKNOWN_HANDLE,
            FhError::PeerLost(_) => FH_ERR_PEER_LOST,
            FhError::Remote(RemoteError::NoMemory) => FH_ERR_NO_MEMORY,
            FhError::Remote(RemoteError::Unmapped) => FH_ERR_REMOTE_FAULT,
            FhError::Remote(RemoteError::Denied) => FH_ERR_REMOTE_DENIED,
            // `PinFailed`, and `Refused` (the target's settings do not take the move).
            FhError::Remote(_) => FH_ERR_PIN_FAILED,
        }
    }
}

/// A message from a peer that was dropped; the state machine did not change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireError {
    Truncated,
    BadVersion,
    UnknownKind,
    TrailingBytes,
    /// A field holds a value the format does not allow.
    Malformed,
    /// Not a rank of the job, or this rank itself.
    BadSender(Rank),
    /// The sender was declared lost.
    PeerLost(Rank),
    /// More pins than fit a reply, a pin outside its aligned range, or larger than a region.
    BadPin,
    /// A small put longer than `small_put_max`, or overflowing the address space.
    BadPut,
    /// The move would leave the sender holding more than its quota here.
    OverQuota,
    /// A release or revoke-ack names a region the sender does not hold (or twice).
    NotHeld,
    /// A reply to no outstanding move of ours, or not matching it.
    UnknownRequest,
    /// A grant outside the pin's range, not covering what was needed, or already known.
    BadGrant,
    /// A quota message out of protocol (adaptive off, or no cut outstanding, or too large).
    BadQuota,
}

/// Why `RegionPins::pin` (or `write`) failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinFailure {
    /// Part of the range is not mapped (EFAULT).
    Unmapped,
    /// Out of pinnable memory or keys (ENOMEM, RLIMIT_MEMLOCK).
    NoMemory,
    /// The range may not be reached by peers with the rights asked for (the driver's exposure
    /// policy, checked before anything is pinned or written).
    Denied,
    /// Anything else.
    Other,
}

impl From<PinFailure> for RemoteError {
    fn from(p: PinFailure) -> Self {
        match p {
            PinFailure::Unmapped => RemoteError::Unmapped,
            PinFailure::NoMemory => RemoteError::NoMemory,
            PinFailure::Denied => RemoteError::Denied,
            PinFailure::Other => RemoteError::PinFailed,
        }
    }
}
