//! Errors of the Firehose core: what a caller did wrong (`FhError`, returned at once, nothing
//! changed), what happened to an op later (`FhError` inside `Event::Failed`), what a peer sent
//! that does not parse or does not fit the protocol (`WireError`, nothing changed), and why the
//! driver's pinning backend refused a range (`PinFailure`).

use std::fmt;

use crate::Rank;

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

/// Why a target could not pin (or write a put): the reply's code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteError {
    /// Part of the range is not mapped in the target (EFAULT).
    Unmapped = 1,
    /// The target is out of pinnable memory or keys.
    NoMemory = 2,
    /// Any other failure of the target's pinning backend.
    PinFailed = 3,
    /// The target refused the move: it does not fit the target's settings (bucket or region
    /// size, quota) or asks for what the sender does not hold. Answered, so nothing waits.
    Refused = 4,
    /// The target does not let peers reach this range with these rights: not exposed
    /// (`FH_EXPOSE=declared`), exposed without them, or the library's own memory.
    Denied = 5,
}

impl RemoteError {
    pub(crate) fn from_u8(c: u8) -> Option<Self> {
        match c {
            1 => Some(RemoteError::Unmapped),
            2 => Some(RemoteError::NoMemory),
            3 => Some(RemoteError::PinFailed),
            4 => Some(RemoteError::Refused),
            5 => Some(RemoteError::Denied),
            _ => None,
        }
    }
}

impl fmt::Display for FhError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FhError::ZeroLength => f.write_str("length is zero"),
            FhError::Overflow => f.write_str("raddr + len overflows"),
            FhError::BadRank(r) => write!(f, "no such rank {r}"),
            FhError::SelfRank => f.write_str("the own rank"),
            FhError::TooLong { max } => write!(f, "longer than {max} bytes"),
            FhError::PutLength => f.write_str("small put payload length differs from len"),
            FhError::BadRights => f.write_str("invalid rights"),
            FhError::DuplicateOp => f.write_str("op id already in use"),
            FhError::UnknownOp => f.write_str("unknown op id"),
            FhError::PeerLost(r) => write!(f, "rank {r} was lost"),
            FhError::Remote(e) => write!(f, "at the target: {e}"),
        }
    }
}

impl std::error::Error for FhError {}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Truncated => f.write_str("truncated message"),
            WireError::BadVersion => f.write_str("unknown protocol version"),
            WireError::UnknownKind => f.write_str("unknown message kind"),
            WireError::TrailingBytes => f.write_str("trailing bytes"),
            WireError::Malformed => f.write_str("malformed field"),
            WireError::BadSender(r) => write!(f, "bad sender rank {r}"),
            WireError::PeerLost(r) => write!(f, "sender rank {r} was lost"),
            WireError::BadPin => f.write_str("bad pin"),
            WireError::BadPut => f.write_str("bad small put"),
            WireError::OverQuota => f.write_str("over quota"),
            WireError::NotHeld => f.write_str("region not held"),
            WireError::UnknownRequest => f.write_str("reply to no outstanding request"),
            WireError::BadGrant => f.write_str("bad grant"),
            WireError::BadQuota => f.write_str("quota message out of protocol"),
        }
    }
}

impl std::error::Error for WireError {}

impl fmt::Display for RemoteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RemoteError::Unmapped => "range not mapped",
            RemoteError::NoMemory => "out of pinnable memory",
            RemoteError::PinFailed => "pin failed",
            RemoteError::Refused => "move refused",
            RemoteError::Denied => "range not exposed for this access",
        })
    }
}

impl std::error::Error for RemoteError {}
