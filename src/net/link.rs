//! The seam between the active-message layer and a wire: a `Link` moves whole messages between
//! ranks, reliably and in order per pair of ranks (as an RC queue pair does), into receive slots
//! the receiver posted in advance. It does no flow control: the layer above holds a credit for
//! every `send` (one credit = one receive slot at the peer), and a link may treat a message
//! arriving with no free slot as a protocol error.
//!
//! Implemented by `net::verbs` (one RC QP per peer, one CQ) and `net::sim` (deterministic, seeded).

use std::fmt;
use std::time::Duration;

/// A process's index in the job, `0..size`.
pub type Rank = u32;

/// Why a link operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkError {
    /// The connection to this peer is gone (exited, QP in error, dropped by the simulator).
    PeerLost(Rank),
    /// Not a rank of this job (or this rank itself, where a link does not loop back).
    BadRank(Rank),
    /// Longer than `Link::max_msg`.
    TooLong { len: usize, max: usize },
    /// The link was shut down.
    Closed,
    /// Anything else the device reported (verbs errno or completion status), as text.
    Device(String),
}

impl fmt::Display for LinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkError::PeerLost(r) => write!(f, "connection to rank {r} lost"),
            LinkError::BadRank(r) => write!(f, "no such peer rank {r}"),
            LinkError::TooLong { len, max } => write!(f, "message of {len} bytes > max {max}"),
            LinkError::Closed => write!(f, "link closed"),
            LinkError::Device(s) => write!(f, "device error: {s}"),
        }
    }
}

impl std::error::Error for LinkError {}

/// What `Link::poll` reports.
#[derive(Debug)]
pub enum LinkEvent<'a> {
    /// A message from `peer`. `data` is valid until the callback returns; then its slot is posted
    /// again, and the layer above owes `peer` one credit.
    Recv { peer: Rank, data: &'a [u8] },
    /// The connection to `peer` is gone: nothing more will arrive from it, and sends to it fail.
    /// Reported once per peer.
    PeerLost { peer: Rank, reason: LinkError },
}

/// A reliable, per-pair ordered message link between the ranks of a job. Thread-safe: `send`,
/// `poll` and `wait` may be called from several threads at once.
pub trait Link: Send + Sync {
    /// This process's rank.
    fn rank(&self) -> Rank;
    /// Number of ranks in the job.
    fn size(&self) -> u32;
    /// The longest message `send` accepts, in bytes.
    fn max_msg(&self) -> usize;
    /// Receive slots each rank keeps posted for each peer: the credits a sender starts with.
    fn recv_slots(&self) -> u32;
    /// Sends one message to `peer`. The caller holds a credit for it (a free slot at the peer);
    /// the link never queues for lack of one. Returns when `msg` may be reused.
    fn send(&self, peer: Rank, msg: &[u8]) -> Result<(), LinkError>;
    /// Delivers what has arrived, without blocking. Returns the number of events delivered.
    fn poll(&self, on_event: &mut dyn FnMut(LinkEvent<'_>)) -> Result<usize, LinkError>;
    /// Blocks until something may have arrived, or `timeout` passed (the progress thread sleeps
    /// here: verbs waits on the completion channel). Spurious wakeups are allowed.
    fn wait(&self, timeout: Duration) -> Result<(), LinkError>;
    /// Checks that `peer` is still there without using a credit (verbs: a one-sided write to a
    /// word the peer registered for it). A dead peer shows up as `PeerLost` from a later `poll`.
    fn probe(&self, peer: Rank) -> Result<(), LinkError>;
}
