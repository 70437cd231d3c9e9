//! Firehose (Bell & Bonachea, "A New DMA Registration Strategy for Pinning-Based High
//! Performance Networks", IPDPS 2003) as a sans-IO state machine: remote pinning managed by the
//! initiator, bounded per peer, negotiated by a message only on a miss.
//!
//! Owns: this rank's firehoses on its peers (initiator side, `initiator/`), the regions peers
//! pinned here (target side, `target/`: region table, victim FIFO, revocations, adaptive
//! quotas), the message format (`wire.rs`), the settings (`config.rs`).
//! May call: `std` and `libc` (the page size) only: no network, verbs, cache, clocks or threads,
//! and nothing of the `firehose` crate that drives it (as quinn-proto is to quinn). A driver
//! (`firehose::rma`) feeds events in and carries messages and RDMA out; it wraps a `Firehose` in
//! a Mutex (`Firehose: Send`).
//!
//! # API (one `Firehose` per rank, every call `&mut self`, none blocks)
//!
//! Initiator:
//! - `acquire_for(op, peer, raddr, len, rights, small_put)`: `rights` is what the op does at
//!   the target (`Rights::READ` for a get, `WRITE` for a put); only a firehose with them is a
//!   hit, and a new pin asks for them plus those of the chunk's firehoses (a chunk read, then
//!   written, is upgraded to a region with both; nothing is ever pinned with fewer rights than
//!   the firehose it replaces in the bucket map). `acquire` is `acquire_for` with both.
//!   `Hit(segs)`: post one RDMA per segment
//!   (`raddr, len, rkey`; adjacent buckets of one region merged), then `release(op)`.
//!   `Pending`: a move was queued (or joined: "hit pending"); an `Event::Ready { op, segs }` or
//!   `Event::Failed` follows. `DoneInMove`: the put rides in the move; `Event::PutDone` (or
//!   `Failed`) follows, no `release`. `small_put` (the payload, `len` bytes) only matters on
//!   a miss and when `len <= small_put_max`; otherwise it is ignored (Hit/Pending: the driver
//!   writes by RDMA). A put in a move still carries pins for its chunks when the quota allows,
//!   so the next op there hits, unless this peer's evicted firehoses go unused (then pinning
//!   does not pay and most such moves carry none: `initiator/thrash.rs`, `FH_SMALL_PUT_PINS`).
//!   Errors change nothing: zero length, overflow, bad rank, own rank (the driver copies
//!   locally), longer than `max_op_len` (the driver splits), duplicate op id, lost peer.
//! - `release(op)` after the RDMA of a `Hit`/`Ready` completed; unknown or repeated: error.
//! - `poll_event()`: `Ready`, `Failed { error }` (`FhError::Remote(Unmapped)` when the target
//!   could not pin: the driver reports `FH_ERR_REMOTE_FAULT`; `PeerLost`), `PutDone`.
//!
//! Target and both:
//! - `handle_message(from, bytes, pins)`: every Firehose message. A malformed or
//!   out-of-protocol message is a `WireError` and changes nothing (validated before applied);
//!   a move in sequence that this target cannot honour (its pins do not fit its settings or
//!   quota) is answered with `RemoteError::Refused` instead (its ops fail, later moves go on).
//! - `poll_transmit()`: `(rank, bytes)` to send, in order. **Delivery must be FIFO per pair
//!   of ranks** (one RC QP, all Firehose messages through it): the race reasoning relies on it.
//! - `invalidate(addr, len, pins)` when this rank's memory is unmapped; `invalidation_done`.
//! - `peer_lost(rank, pins)`: the driver lost a peer.
//!
//! # The bound
//! Each peer may hold at most its quota F = M / (bucket × (size − 1)) buckets here (regions
//! counted in full, checked at the target for every move), quotas sum to <= M, victims are
//! trimmed to MAXVICTIM: pinned bytes <= M + MAXVICTIM at all times.
//!
//! # Invalidation guarantee
//! Once `invalidation_done(id)` is true, no peer holds a firehose on a region that overlapped
//! the range when `invalidate` was called, and those regions are unpinned: an op acquired
//! afterwards by any peer misses there, and its move pins whatever is mapped then (the new
//! pages) or fails with `Remote(Unmapped)`. Ops acquired before that may still write the old
//! pages; so the driver must not let the unmap complete (or the address be reused) until
//! `invalidation_done`, if puts issued after the unmap returned must never land in old pages.
//! Races: a move in flight toward us when we invalidate is served after the invalidate and
//! never gets a revoking region (fresh pin or error); a grant we sent before the invalidate
//! reaches the holder before our REVOKE (FIFO), so the holder revokes what it just installed;
//! a holder's release crossing our REVOKE counts as its ack, and the holder ignores a REVOKE
//! for a handle it no longer has. Handles are never reused, so no message can be confused
//! with a later region at the same address (they act as the generation numbers).
//!
//! Not modelled here: local-side pinning (the pin-down cache does that).

mod bucket_map;
pub mod config;
pub mod error;
mod fifo;
mod ids;
mod initiator;
mod small;
pub mod stats;
mod target;
mod types;
pub mod wire;

pub use config::{FhConfigError, FirehoseConfig};
pub use error::{FhError, PinFailure, WireError};
pub use ids::{OpId, Rank};
pub use small::Inline2;
pub use stats::FirehoseStats;
pub use target::InvalId;
pub(crate) use types::Outbox;
pub use types::{Acquire, Event, RegionPins, Seg, Segs};
pub use wire::{RemoteError, Rights};

use std::collections::VecDeque;

/// One rank's Firehose state machine.
#[derive(Debug)]
pub struct Firehose {
    cfg: FirehoseConfig,
    init: initiator::Initiator,
    target: target::Target,
    out: Outbox,
    stats: FirehoseStats,
}

impl Firehose {
    pub fn new(cfg: FirehoseConfig) -> Result<Self, FhConfigError> {
        cfg.validate()?;
        Ok(Firehose {
            init: initiator::Initiator::new(&cfg),
            target: target::Target::new(&cfg),
            cfg,
            out: VecDeque::new(),
            stats: FirehoseStats::default(),
        })
    }

    pub fn config(&self) -> &FirehoseConfig {
        &self.cfg
    }

    /// `acquire_for` with read and write rights.
    pub fn acquire(
        &mut self,
        op: OpId,
        peer: Rank,
        raddr: u64,
        len: usize,
        small_put: Option<&[u8]>,
    ) -> Result<Acquire, FhError> {
        self.acquire_for(op, peer, raddr, len, Rights::BOTH, small_put)
    }

    /// See the module docs (API).
    #[inline]
    pub fn acquire_for(
        &mut self,
        op: OpId,
        peer: Rank,
        raddr: u64,
        len: usize,
        rights: Rights,
        small_put: Option<&[u8]>,
    ) -> Result<Acquire, FhError> {
        let r = self.init.acquire(
            op,
            peer,
            raddr,
            len,
            rights,
            small_put,
            &mut self.out,
            &mut self.stats,
        );
        self.stats.failures += self.init.take_failures();
        r
    }

    /// `acquire_for`'s common hit alone, for a driver's fast path: when one firehose covers
    /// the whole op with `rights` (and the op table's front slot is free), takes the op's
    /// reference as `acquire_for` would (counted as a hit; `release` the op as any other) and
    /// returns its one segment. `None` changes nothing: call `acquire_for`, which handles or
    /// refuses everything else (a miss, a hit over several regions, a bad argument, a lost
    /// peer, a duplicate op id). No small put: a put that would ride in a move on a miss passes
    /// its data to `acquire_for` then.
    #[inline]
    pub fn acquire_hit(
        &mut self,
        op: OpId,
        peer: Rank,
        raddr: u64,
        len: usize,
        rights: Rights,
    ) -> Option<Seg> {
        let seg = self.init.acquire_hit(op, peer, raddr, len, rights)?;
        self.stats.hits += 1;
        Some(seg)
    }

    /// `release(old)` then `acquire_hit(op, ...)`, for a driver that ends the op in the front
    /// slot just before it starts the next: when `op` hits the firehose `old` held, alone, with
    /// nothing waiting for `old`'s release, its reference passes to `op` (the same state as
    /// the two calls, in fewer steps) and `op`'s one segment is returned. `None` changes
    /// nothing: make the two calls.
    #[inline]
    pub fn pass_front(
        &mut self,
        old: OpId,
        op: OpId,
        peer: Rank,
        raddr: u64,
        len: usize,
        rights: Rights,
    ) -> Option<Seg> {
        let seg = self.init.pass_front(old, op, peer, raddr, len, rights)?;
        self.stats.hits += 1;
        Some(seg)
    }

    #[inline(always)]
    pub fn release(&mut self, op: OpId) -> Result<(), FhError> {
        let r = self.init.release(op, &mut self.out, &mut self.stats);
        // A release fails ops only when it unblocked some (rare): a test, not a take.
        if self.init.failed != 0 {
            self.stats.failures += self.init.take_failures();
        }
        r
    }

    /// Whether something waits for the release of the op in the front slot (the one-region
    /// hit `acquire_hit` took): its peer has blocked ops, an unsettled quota cut or acks to
    /// send, or one of its firehoses was revoked (the target waits for the ack that the last
    /// release sends). A driver that delays the release of a finished hit (until it next calls
    /// in here anyway) must not delay it while this says so: the waiting would then last until
    /// that next call. No front op: `false`.
    #[inline(always)]
    pub fn front_awaited(&self) -> bool {
        self.init.front_awaited()
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.init.events.pop_front()
    }

    pub fn poll_transmit(&mut self) -> Option<(Rank, Vec<u8>)> {
        self.out.pop_front()
    }

    /// Whether `poll_transmit` or `poll_event` has something (a driver that finds nothing can
    /// skip draining them: the common case after a hit or a release).
    #[inline]
    pub fn has_output(&self) -> bool {
        !self.out.is_empty() || !self.init.events.is_empty()
    }

    pub fn handle_message(
        &mut self,
        from: Rank,
        bytes: &[u8],
        pins: &mut dyn RegionPins,
    ) -> Result<(), WireError> {
        if from >= self.cfg.size || from == self.cfg.rank {
            return Err(WireError::BadSender(from));
        }
        if self.target.peers[from as usize].lost || self.init.peers[from as usize].lost {
            return Err(WireError::PeerLost(from));
        }
        let (st, out) = (&mut self.stats, &mut self.out);
        match wire::decode(bytes)? {
            wire::Msg::Move {
                req,
                releases,
                pins: p,
                put,
            } => self
                .target
                .handle_move(from, req, &releases, &p, put, pins, out, st),
            wire::Msg::Reply { req, grants, put } => {
                self.init.handle_reply(from, req, &grants, put, out, st)
            }
            wire::Msg::Revoke(hs) => {
                self.init.handle_revoke(from, &hs, out, st);
                self.stats.failures += self.init.take_failures();
                Ok(())
            }
            wire::Msg::RevokeAck(hs) => self.target.handle_revoke_ack(from, &hs, pins, out, st),
            wire::Msg::QuotaWant(w) => self.target.handle_quota_want(from, w, out, st),
            wire::Msg::QuotaSet { quota, cut } => {
                self.init.handle_quota_set(from, quota, cut, out, st)
            }
            wire::Msg::QuotaAck(q) => self.target.handle_quota_ack(from, q, out, st),
        }
    }

    /// This rank's `[addr, addr + len)` is being unmapped: see the module docs.
    pub fn invalidate(&mut self, addr: u64, len: usize, pins: &mut dyn RegionPins) -> InvalId {
        self.target
            .invalidate(addr, len, pins, &mut self.out, &mut self.stats)
    }

    pub fn invalidation_done(&self, id: InvalId) -> bool {
        self.target.inval.is_done(id)
    }

    /// The firehoses this rank holds on `peer` now, not revoked: (start address, length, key,
    /// rights), in address order. For diagnostics and tests (a key seen from outside).
    pub fn firehoses_on(&self, peer: Rank) -> Vec<(u64, u64, u32, Rights)> {
        let Some(p) = self.init.peers.get(peer as usize) else {
            return Vec::new();
        };
        let shift = self.init.shift;
        let mut v: Vec<_> = p
            .by_handle
            .values()
            .map(|&slot| &self.init.fhs[slot as usize])
            .filter(|f| !f.revoked)
            .map(|f| (f.start << shift, u64::from(f.nb) << shift, f.rkey, f.rights))
            .collect();
        v.sort_unstable_by_key(|f| f.0);
        v
    }

    /// The peers invalidation `id` still waits for (to give up on one that stays silent: see
    /// `peer_lost`).
    pub fn invalidation_holders(&self, id: InvalId) -> Vec<Rank> {
        self.target.unacked_holders(id)
    }

    /// Invalidations still waiting for acks.
    pub fn invalidations_pending(&self) -> usize {
        self.target.inval.unfinished()
    }

    /// The driver lost `peer`: it counts as having acked every revoke; our ops to it fail
    /// with `FhError::PeerLost` (Active ones stay until released); its messages are refused.
    pub fn peer_lost(&mut self, peer: Rank, pins: &mut dyn RegionPins) {
        if peer >= self.cfg.size || peer == self.cfg.rank {
            return;
        }
        self.init.peer_lost(peer, &mut self.stats);
        self.target.peer_lost(peer, pins, &mut self.stats);
    }

    pub fn stats(&self) -> FirehoseStats {
        self.stats
    }

    /// Bytes pinned here now (equals `stats().pinned_bytes`).
    pub fn pinned_bytes(&self) -> u64 {
        self.target.bytes(self.target.pinned_buckets)
    }

    /// Ops not finished (for drivers and tests: zero once everything drained and released).
    pub fn ops_in_flight(&self) -> usize {
        self.init.ops.len() + usize::from(self.init.front.op.is_some())
    }

    /// References held on this rank's firehoses, all peers together (for drivers and tests:
    /// zero once every op is released; each Active or Waiting op holds one per firehose it uses).
    #[doc(hidden)]
    pub fn refs_held(&self) -> u64 {
        let p = &self.init.peers;
        p.iter()
            .flat_map(|p| p.by_handle.values())
            .map(|&id| u64::from(self.init.fhs[id as usize].refs))
            .sum()
    }
}

impl Firehose {
    /// Consistency of the bookkeeping (tests and the simulation call it after every step):
    /// the bound, charges equal the regions held, victims equal the unheld regions, the
    /// initiator's charge covers its firehoses and reservations and stays within its quota
    /// (except while a quota cut is being settled).
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        self.target.check()?;
        self.init.check()
    }
}

impl Firehose {
    /// The state of op `op` and its peer's queues, for test failure messages.
    #[doc(hidden)]
    pub fn debug_op(&self, op: OpId) -> String {
        if self.init.front.op == Some(op) {
            return format!("{:?} (hit, front slot)", self.init.front);
        }
        match self.init.ops.get(&op) {
            None => "gone".into(),
            Some(o) => {
                let p = &self.init.peers[o.peer as usize];
                format!(
                    "{o:?} peer: charged {} quota {} fifo {} blocked {:?} pending {:?} cut {:?} want {}",
                    p.charged, p.quota, p.fifo_buckets, p.blocked, p.pending, p.cut, p.want_sent
                )
            }
        }
    }
}

impl Firehose {
    #[doc(hidden)]
    pub fn debug_peer(&self, peer: Rank) -> String {
        let p = &self.init.peers[peer as usize];
        format!(
            "charged {} quota {} fifo {} cut {:?} want {}",
            p.charged, p.quota, p.fifo_buckets, p.cut, p.want_sent
        )
    }
    #[doc(hidden)]
    pub fn debug_target(&self) -> String {
        format!("{:?}", self.target.peers)
    }
}
