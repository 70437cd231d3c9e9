//! One peer of a `VerbsLink`: its RC QP, where its probe word is, the send-queue accounting, and
//! whether the connection is still there.
//!
//! Send-queue accounting: every send-queue work request (message or probe) gets the next sequence
//! number. Most are unsignaled; a signaled one completing means every earlier one on this QP has
//! completed too (RC completes in order), so `completed` jumps to its sequence number + 1. A new
//! work request may be posted while `posted - completed < sq_depth`, which also says a send-ring
//! slot (`seq % sq_depth`) is free again.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

use super::qp::Qp;
use crate::net::LinkError;

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
    pub posted: Mutex<u64>,
    /// Every sequence number below this has completed (written only under the send-CQ lock).
    pub completed: AtomicU64,
    state: AtomicU8,
    /// Why the peer was lost (written once, by the thread that moved ALIVE -> LOST).
    reason: Mutex<Option<LinkError>>,
}

impl Peer {
    pub fn new(qp: Qp, probe_addr: u64, probe_rkey: u32) -> Self {
        Peer {
            qp,
            probe_addr,
            probe_rkey,
            posted: Mutex::new(0),
            completed: AtomicU64::new(0),
            state: AtomicU8::new(ALIVE),
            reason: Mutex::new(None),
        }
    }

    #[inline]
    pub fn is_alive(&self) -> bool {
        self.state.load(Ordering::Acquire) == ALIVE
    }

    /// Reported lost by `poll`: receives still in the CQ from it are dropped, not delivered.
    #[inline]
    pub fn is_reported(&self) -> bool {
        self.state.load(Ordering::Acquire) == REPORTED
    }

    /// Mark the peer lost. True only for the call that changed the state (the caller then counts
    /// one unreported loss).
    pub fn mark_lost(&self, reason: LinkError) -> bool {
        let mut r = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        if self
            .state
            .compare_exchange(ALIVE, LOST, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            *r = Some(reason);
            true
        } else {
            false
        }
    }

    /// Claim the report of a loss: `Some(reason)` exactly once per lost peer.
    pub fn take_report(&self) -> Option<LinkError> {
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

    /// A signaled work request `seq` completed: so did everything before it.
    #[inline]
    pub fn complete_through(&self, seq: u64) {
        self.completed.fetch_max(seq + 1, Ordering::AcqRel);
    }
}
