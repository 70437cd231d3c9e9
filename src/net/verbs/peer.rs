//! One peer of a `VerbsLink`: its RC QP, where its probe word is, the send-queue accounting, and
//! whether the connection is still there.
//!
//! Send-queue accounting: every send-queue work request (message or probe) gets the next sequence
//! number. Most are unsignaled; a signaled one completing means every earlier one on this QP has
//! completed too (RC completes in order), so `completed` jumps to its sequence number + 1. A new
//! work request may be posted while `posted - completed < sq_depth`, which also says a send-ring
//! slot (`seq % sq_depth`) is free again, and so is the RDMA token slot of `seq` (below).
//!
//! RDMA ops: the caller's 64-bit token is kept in `tokens[seq & mask]` (the table's length is
//! `sq_depth` rounded up to a power of two, so at most `sq_depth` live ops never share a slot,
//! and the index is a mask, not a division, on every post and completion; written under the
//! post lock before the work request is posted, read by the reaper at its completion, before
//! `completed` moves past it). `rdma_outstanding` counts ops posted and not yet reported, so a
//! lost peer's `PeerLost` can wait until its flushed ops have all been reported.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use super::qp::Qp;
use crate::net::LinkError;
use crate::rt::lock::Lock;

const ALIVE: u8 = 0;
/// Lost, and not yet reported by `poll`.
const LOST: u8 = 1;
/// Lost and reported: nothing more is delivered from this peer.
const REPORTED: u8 = 2;

pub(super) struct Peer {
    pub qp: Qp,
    /// Where our probe lands at the peer: its probe array + 8 * our rank, and the rkey.
    pub probe_addr: u64,
    pub probe_rkey: u32,
    /// Next sequence number to post. The lock also serialises posting on this QP, so sequence
    /// numbers reach the send queue in order.
    /// (`rt::lock::Lock`: taken on every post, and without `Mutex`'s poison bookkeeping.)
    pub posted: Lock<u64>,
    /// Every sequence number below this has completed (written only under the send-CQ lock).
    pub completed: AtomicU64,
    /// RDMA tokens by `seq & token_mask`.
    tokens: Box<[AtomicU64]>,
    token_mask: u64,
    /// RDMA ops posted whose `RdmaDone` has not been delivered yet.
    pub rdma_outstanding: AtomicU32,
    /// A thread is inside the provider's post of an RDMA op to this peer (written under
    /// `posted`: plain stores on a line the poster holds anyway; `Link::posting` reads them).
    pub in_rdma_post: AtomicBool,
    /// When the peer was marked lost (bounds how long its report waits for flushes).
    lost_at: OnceLock<Instant>,
    state: AtomicU8,
    /// Why the peer was lost (written once, by the thread that moved ALIVE -> LOST).
    reason: Mutex<Option<LinkError>>,
}

impl Peer {
    pub(super) fn new(qp: Qp, probe_addr: u64, probe_rkey: u32, sq_depth: u32) -> Self {
        let slots = sq_depth.max(1).next_power_of_two();
        Peer {
            qp,
            probe_addr,
            probe_rkey,
            posted: Lock::new(0),
            completed: AtomicU64::new(0),
            tokens: (0..slots).map(|_| AtomicU64::new(0)).collect(),
            token_mask: u64::from(slots) - 1,
            rdma_outstanding: AtomicU32::new(0),
            in_rdma_post: AtomicBool::new(false),
            lost_at: OnceLock::new(),
            state: AtomicU8::new(ALIVE),
            reason: Mutex::new(None),
        }
    }

    #[inline]
    pub(super) fn is_alive(&self) -> bool {
        self.state.load(Ordering::Acquire) == ALIVE
    }

    /// Reported lost by `poll`: receives still in the CQ from it are dropped, not delivered.
    #[inline]
    pub(super) fn is_reported(&self) -> bool {
        self.state.load(Ordering::Acquire) == REPORTED
    }

    /// Mark the peer lost. True only for the call that changed the state (the caller then counts
    /// one unreported loss).
    pub(super) fn mark_lost(&self, reason: LinkError) -> bool {
        let mut r = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        if self
            .state
            .compare_exchange(ALIVE, LOST, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            *r = Some(reason);
            let _ = self.lost_at.set(Instant::now());
            true
        } else {
            false
        }
    }

    /// Claim the report of a loss: `Some(reason)` exactly once per lost peer.
    pub(super) fn take_report(&self) -> Option<LinkError> {
        if self
            .state
            .compare_exchange(LOST, REPORTED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            let r = self.reason.lock().unwrap_or_else(|p| p.into_inner());
            Some(r.clone().unwrap_or(LinkError::Device("peer lost".into())))
        } else {
            None
        }
    }

    /// When the peer was marked lost (`None` while alive).
    pub(super) fn lost_at(&self) -> Option<Instant> {
        self.lost_at.get().copied()
    }

    /// Remember the token of the RDMA op about to be posted as `seq` (caller holds `posted`).
    #[inline]
    pub(super) fn set_token(&self, seq: u64, token: u64) {
        self.tokens[(seq & self.token_mask) as usize].store(token, Ordering::Release);
    }

    /// The token of RDMA op `seq` (valid until `completed` passes `seq`).
    #[inline]
    pub(super) fn token(&self, seq: u64) -> u64 {
        self.tokens[(seq & self.token_mask) as usize].load(Ordering::Acquire)
    }

    /// A signaled work request `seq` completed: so did everything before it.
    #[inline]
    pub(super) fn complete_through(&self, seq: u64) {
        // The one writer holds the send-CQ lock (`completed`'s doc): a load and a store, not
        // a compare-and-swap loop.
        if seq + 1 > self.completed.load(Ordering::Relaxed) {
            self.completed.store(seq + 1, Ordering::Release);
        }
    }
}
