//! The seam between the active-message layer and a wire: a `Link` moves whole messages between
//! ranks, reliably and in order per pair of ranks (as an RC queue pair does), into receive slots
//! the receiver posted in advance. It does no flow control: the layer above holds a credit for
//! every `send` (one credit = one receive slot at the peer), and a link may treat a message
//! arriving with no free slot as a protocol error.
//!
//! The same link also carries one-sided RDMA (`Link::rdma`: WRITE from / READ into a registered
//! local buffer, at a remote range the target registered), with one `LinkEvent::RdmaDone` per
//! accepted operation. It is part of `Link` rather than a sibling trait because its completions
//! come out of the same `poll` the AM layer's progress already drives, and because the layers
//! above hold an `Arc<dyn Link>`: a second trait would need a second handle to the same object
//! (or trait upcasting) for no gain; a link that cannot do RDMA says so with an error.
//!
//! Implemented by `net::verbs` (one RC QP per peer, one CQ), `net::sim` (deterministic, seeded)
//! and `net::solo` (a job of one: no peers).
//!
//! # Ordering of one-sided operations (the guarantees callers may rely on)
//! Per pair of ranks, sends and RDMA operations are executed in the order they were posted (RC:
//! one queue pair per pair, processed in order; the simulator keeps the same per-pair FIFO):
//! - RDMA WRITEs to a peer are placed, and complete, in posting order.
//! - A SEND posted after a WRITE on the same pair is delivered to the peer only after the
//!   write's data is placed in its memory: "put, then notify" needs no wait for the write's
//!   completion. (Not so across pairs, nor for a WRITE posted after the SEND.)
//! - A READ's data is valid in the local buffer only once its `RdmaDone` has been reported; a
//!   READ does not order with later WRITEs to the same remote bytes except through completions.
//! - `RdmaDone` events of one peer are reported in posting order by each `poll` call; two polls
//!   at once (two threads, or a poll nested in a callback) may interleave what each took (each
//!   op's report stands alone).
//! - Every operation `rdma` accepted (`Ok`) is reported exactly once, success or error; one it
//!   refused (`Err`) is never reported. Operations still outstanding when the peer is lost are
//!   reported failed, before that peer's `PeerLost` (verbs: unless the device never flushes
//!   them within `RDMA_FLUSH_GRACE`, see net/verbs/link.rs).
//! - A remote access error (bad rkey, range outside the region, missing rights) fails the op
//!   with `RemoteAccess` and, as on RC, breaks the connection: the peer is then lost.

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
    /// An RDMA operation of zero bytes (refused: rxe mishandles zero-length RDMA READ, and it
    /// would move nothing anyway).
    ZeroLength,
    /// `addr + len` of an RDMA operation wraps around the address space.
    Overflow,
    /// The target refused an RDMA operation: the rkey is unknown, its region does not cover the
    /// range, or does not allow the access. The connection to `peer` is lost with it (RC).
    RemoteAccess(Rank),
}

impl fmt::Display for LinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkError::PeerLost(r) => write!(f, "connection to rank {r} lost"),
            LinkError::BadRank(r) => write!(f, "no such peer rank {r}"),
            LinkError::TooLong { len, max } => write!(f, "message of {len} bytes > max {max}"),
            LinkError::Closed => write!(f, "link closed"),
            LinkError::Device(s) => write!(f, "device error: {s}"),
            LinkError::ZeroLength => write!(f, "zero-length RDMA operation"),
            LinkError::Overflow => write!(f, "RDMA range wraps around the address space"),
            LinkError::RemoteAccess(r) => write!(f, "rank {r} refused the RDMA access"),
        }
    }
}

impl std::error::Error for LinkError {}

/// What `Link::poll` reports. An explicit tag (`repr(u8)`): the endpoint tells the variants
/// apart with one compare per event, not by decoding the niche of `RdmaDone`'s result.
#[derive(Debug)]
#[repr(u8)]
pub enum LinkEvent<'a> {
    /// A message from `peer`. `data` is valid until the callback returns; then its slot is posted
    /// again, and the layer above owes `peer` one credit.
    Recv { peer: Rank, data: &'a [u8] },
    /// The connection to `peer` is gone: nothing more will arrive from it, and sends to it fail.
    /// Reported once per peer.
    PeerLost { peer: Rank, reason: LinkError },
    /// The RDMA operation posted to `peer` with `token` finished: `Ok` once a WRITE's data is
    /// placed at the target (and acknowledged) or a READ's data is in the local buffer. Errors:
    /// `RemoteAccess`, `PeerLost` (flushed: the connection broke before it ran), `Device`.
    RdmaDone {
        peer: Rank,
        token: u64,
        result: Result<(), LinkError>,
    },
}

/// Direction of a one-sided operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RdmaKind {
    /// Local buffer -> remote memory (put).
    Write,
    /// Remote memory -> local buffer (get).
    Read,
}

/// One RDMA operation. The local range must be registered (its `lkey`, e.g. from the pin-down
/// cache) with local write access for a READ; the remote range must lie inside a region the
/// target registered with remote write (WRITE) or remote read (READ) access, named by `rkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdmaOp {
    pub kind: RdmaKind,
    pub local_addr: u64,
    pub lkey: u32,
    pub len: usize,
    pub remote_addr: u64,
    pub rkey: u32,
    /// Returned unchanged in the op's `RdmaDone`; the link never interprets it.
    pub token: u64,
}

impl RdmaOp {
    /// The checks every link makes before posting: length in `1..=max`, neither range wraps.
    pub(crate) fn validate(&self, max: usize) -> Result<(), LinkError> {
        if self.len == 0 {
            return Err(LinkError::ZeroLength);
        }
        if self.len > max {
            return Err(LinkError::TooLong { len: self.len, max });
        }
        let len = self.len as u64;
        if self.local_addr.checked_add(len).is_none() || self.remote_addr.checked_add(len).is_none()
        {
            return Err(LinkError::Overflow);
        }
        Ok(())
    }
}

/// A reliable, per-pair ordered message link between the ranks of a job, with one-sided RDMA.
/// Thread-safe: `send`, `rdma`, `poll` and `wait` may be called from several threads at once
/// (an event goes to whichever thread's `poll` takes it).
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
    /// Sends `msgs` to `peer` in order, as `send` each would, but as one batch where the link
    /// can (verbs: one chain of work requests, one doorbell). On error the messages before the
    /// failing one were sent, and the error says nothing about which: the callers treat any
    /// error as the peer's (or the job's) end. A message too long fails the batch before any
    /// is sent.
    fn send_batch(&self, peer: Rank, msgs: &[&[u8]]) -> Result<(), LinkError> {
        let max = self.max_msg();
        if let Some(m) = msgs.iter().find(|m| m.len() > max) {
            return Err(LinkError::TooLong { len: m.len(), max });
        }
        msgs.iter().try_for_each(|m| self.send(peer, m))
    }
    /// Delivers what has arrived, without blocking. Returns the number of events delivered.
    /// Received messages are handed to `on_event` by one poller at a time (a concurrent or
    /// nested `poll` skips them), so each pair's messages reach the callback in order.
    fn poll(&self, on_event: &mut dyn FnMut(LinkEvent<'_>)) -> Result<usize, LinkError>;
    /// Blocks until something may have arrived, or `timeout` passed (the progress thread sleeps
    /// here: verbs waits on the completion channel). Spurious wakeups are allowed.
    fn wait(&self, timeout: Duration) -> Result<(), LinkError>;
    /// `wait` for a sleeper that needs to be woken by messages only: the completions of this
    /// rank's own sends and RDMA ops need not wake it (another thread is polling for them). On
    /// verbs this arms the receive CQ alone, so an application thread waiting on its own puts
    /// does not wake the progress thread for every completion. Losing a peer still wakes it (a
    /// broken connection flushes the receive queue). `Ok(false)`: the whole timeout passed and
    /// no message (nor loss) can have come; `Ok(true)`: something may have. Default: `wait`,
    /// then `true`.
    fn wait_messages(&self, timeout: Duration) -> Result<bool, LinkError> {
        self.wait(timeout).map(|()| true)
    }
    /// Send-queue work requests this rank has posted that report a completion (every RDMA op,
    /// the signaled sends), as a count that only grows (0: the link does not count them). The
    /// progress thread reads it before it sleeps: posts since its last sleep mean a thread is
    /// issuing operations and will reap their completions in its next wait, so their
    /// completions need not wake the progress thread (`wait_messages`). Verbs: the count the
    /// send CQ's reaper keeps anyway, read with no cost to the post.
    fn signaled_posts(&self) -> u64 {
        0
    }
    /// Whether a thread is inside `rdma` now. On Soft-RoCE a WRITE's whole transfer runs inside
    /// the post's system call, so a thread streaming large WRITEs is in there most of the time
    /// (one post can outlast a progress thread's sleep): the progress thread leaves the
    /// completions to it, as to a thread in a wait. Default: false (a post returns at once).
    fn posting(&self) -> bool {
        false
    }
    /// Ends a current (or the next) `wait` at once, from any thread: the progress thread's stop.
    /// Links that can (`wakes`) let an idle progress thread sleep long; the default cannot, and
    /// `wait` then ends at its timeout.
    fn wake(&self) {}
    /// Whether `wake` ends a `wait` (see there).
    fn wakes(&self) -> bool {
        false
    }
    /// Checks that `peer` is still there without using a credit (verbs: a one-sided write to a
    /// word the peer registered for it). A dead peer shows up as `PeerLost` from a later `poll`.
    fn probe(&self, peer: Rank) -> Result<(), LinkError>;
    /// The longest RDMA operation `rdma` accepts (verbs: the port's maximum message size, at
    /// most 2 GiB). Longer transfers are the caller's to split: one op, one completion. 0 when
    /// the link has no peers to reach.
    fn max_rdma(&self) -> usize;
    /// WRITEs of at most this many bytes are inline: the link copies the payload when it posts
    /// (verbs `IBV_SEND_INLINE`), so their local range need not be registered (`lkey` is
    /// ignored) and is free again once `rdma` returns. 0 (the default): none are.
    fn max_inline_write(&self) -> usize {
        0
    }
    /// Memory the link registered for itself (verbs: its receive and send rings, its probe
    /// words), as (address, length): the library's own, never a target of a peer's put or get
    /// (`rma::expose`). Default: none.
    fn own_buffers(&self) -> Vec<(u64, usize)> {
        Vec::new()
    }
    /// Posts one RDMA WRITE or READ to `peer`; its `RdmaDone` comes from a later `poll`. Never
    /// blocks for long: when the send queue to `peer` is full it reaps completions until there
    /// is room, as `send` does. Refused, with nothing posted and no event to come: `BadRank`
    /// (also this rank itself), `ZeroLength`, `TooLong` (> `max_rdma`), `Overflow`, `PeerLost`.
    ///
    /// # Safety
    /// The link hands both ranges to the device (or, in the simulator, copies through raw
    /// pointers). Until the op's `RdmaDone`: the local range must stay valid and registered
    /// under `lkey`, must not be written (WRITE) or accessed at all (READ) by anyone else;
    /// an inline WRITE (`len <= max_inline_write()`) only needs it readable during the call.
    /// The remote range is the target's to keep valid (its rkey says it allowed this).
    unsafe fn rdma(&self, peer: Rank, op: RdmaOp) -> Result<(), LinkError>;
    /// Posts `ops` to `peer` in order, as `rdma` each would, but as one batch where the link can
    /// (verbs: one chain of work requests, so one doorbell; on Soft-RoCE one system call). Each
    /// posted op has its own `RdmaDone` to come. `Err((n, e))`: the first `n` ops were posted,
    /// the rest were not (no event comes for them), `e` says why. Verbs checks every op
    /// (`BadRank`, `ZeroLength`, `TooLong`, `Overflow`) before it posts any, so such an error
    /// comes with `n == 0`; the default (one `rdma` per op) stops at the first op refused.
    ///
    /// # Safety
    /// Each op as `rdma`.
    unsafe fn rdma_batch(&self, peer: Rank, ops: &[RdmaOp]) -> Result<(), (usize, LinkError)> {
        for (i, op) in ops.iter().enumerate() {
            // SAFETY: forwarded contract, op by op.
            unsafe { self.rdma(peer, *op) }.map_err(|e| (i, e))?;
        }
        Ok(())
    }
}
