//! The initiator side: this rank's firehoses on its peers' memory and the ops that use them.
//!
//! Owns the firehose slab (one entry per region a target granted us), per peer the bucket map
//! (bucket -> firehose covering it), the FIFO of unused firehoses (refcount 0, lazily), the charge
//! (buckets of firehoses not yet released + reservations of pins in flight) against the quota
//! F, the pins in flight ("hit pending" joins them) and the ops blocked for want of quota;
//! the op table; the event queue.
//!
//! Op life: `acquire` -> hit (Active, refs held) | Waiting (pins in flight, holds refs on what
//! is covered so it cannot be evicted) | Blocked (its new pins do not fit the quota yet; holds
//! nothing, so blocked ops never deadlock each other) | PutInMove (rides in a move, no refs).
//! Waiting -> all its pins answered -> covered: Ready event, Active | else advance again.
//! Active -> `release`. A hit on one or two firehoses waits for its release in the op
//! table's front slot when that is free (`Front`), everything else in the table.
//!
//! The unused FIFO is lazy: a hit leaves its firehose queued; the eviction scan skips the
//! ones in use and gives the ones released since they were queued a second chance
//! (`pop_unused`), so a hit touches neither the table nor the FIFO's links.

mod acquire;
mod advance;
mod messages;
mod thrash;

use super::bucket_map::BucketMap;
use super::fifo::{Links, List};
use super::small::Inline2;
use super::{Event, FirehoseConfig, OpId, Rights};
use crate::Rank;
use rustc_hash::FxHashMap;
use std::collections::{HashMap, VecDeque};

/// One firehose: what a hit reads and writes, in 32 bytes aligned to 32, so a hit touches one
/// line of the slab (the target's handle, needed only to release or revoke, is in
/// `Initiator::handles`).
#[derive(Debug, Clone, Copy, Default)]
#[repr(C, align(32))]
pub(crate) struct Fh {
    pub start: u64,
    pub peer: Rank,
    pub nb: u32,
    pub rkey: u32,
    pub refs: u32,
    /// Ops that used it after the one it was pinned for, saturating (`thrash`: did pinning
    /// pay? it only asks whether there were a few).
    pub uses: u8,
    /// The target revoked it: out of the bucket map; ack once refs reach 0.
    pub revoked: bool,
    /// Released since it was queued in the unused FIFO (second chance, `pop_unused`).
    pub recent: bool,
    /// What its key allows (a hit needs the op's rights in it).
    pub rights: Rights,
}

// A hit's one line: a field added to `Fh` must go to a side array (as `handles`) or make room.
const _: () = assert!(std::mem::size_of::<Fh>() == 32 && std::mem::align_of::<Fh>() == 32);

#[derive(Debug)]
pub(crate) struct Pin {
    pub chunk: u64,
    pub need_lo: u64,
    pub need_hi: u64,
    /// The rights asked for (an op needing others does not join it).
    pub rights: Rights,
    pub waiters: Vec<(OpId, u32)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpState {
    Active,
    Waiting { outstanding: u32 },
    Blocked,
    PutInMove,
}

#[derive(Debug)]
pub(crate) struct Op {
    pub peer: Rank,
    pub raddr: u64,
    pub len: usize,
    /// What it does at the target: `READ` (a get) or `WRITE` (a put).
    pub rights: Rights,
    /// Firehoses this op holds a ref on (Active or Waiting).
    pub fhs: Inline2<u32>,
    pub state: OpState,
    /// Bumped when the op leaves Waiting, so stale waiter entries of pins are skipped.
    pub epoch: u32,
}

/// One Active hit op kept out of the op table: a driver that waits for each op before the
/// next (blocking puts) has one at a time, and then a hit's acquire and release never touch
/// the table (a hash insert and remove were a third of a hit's instructions). Only hits on
/// one or two firehoses go here, and only when it is free; everything else is in `ops`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Front {
    pub op: Option<OpId>,
    pub peer: Rank,
    pub n: u32,
    pub ids: [u32; 2],
}

impl Front {
    pub fn new(op: OpId, peer: Rank, ids: [u32; 2], n: u32) -> Front {
        Front {
            op: Some(op),
            peer,
            n,
            ids,
        }
    }
}

impl Op {
    pub fn new(
        peer: Rank,
        raddr: u64,
        len: usize,
        rights: Rights,
        fhs: Inline2<u32>,
        state: OpState,
    ) -> Op {
        Op {
            peer,
            raddr,
            len,
            rights,
            fhs,
            state,
            epoch: 0,
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct PeerI {
    pub map: BucketMap,
    /// Target-chosen handles: SipHash (peer-controlled keys).
    pub by_handle: HashMap<u64, u32>,
    pub fifo: List,
    pub fifo_buckets: u64,
    pub charged: u64,
    pub quota: u64,
    /// Pins in flight by chunk (several may share a chunk with different needed runs).
    pub pending: FxHashMap<u64, Inline2<u32>>,
    pub blocked: VecDeque<OpId>,
    pub lost: bool,
    /// REVOKE_ACKs to send before anything else goes to this peer.
    pub acks: Vec<u64>,
    /// Adaptive: a QUOTA_WANT is outstanding.
    pub want_sent: bool,
    /// Adaptive: the most the target may still grant us, from the QUOTA_WANTs we sent. A
    /// target grants a want in one or more QUOTA_SETs, the last of which may exceed what is
    /// left of it by up to its step of 4 regions; a newer want replaces what is left of an
    /// older one. So each want adds its buckets plus 4 regions, each grant takes its own off:
    /// an upper bound that needs no sequence numbers (grants and wants may cross).
    pub grantable: u64,
    /// Request id of the last move with pins or a put sent to this peer (ids go up by one).
    pub last_req: u32,
    /// Adaptive: the target cut our quota to this; ack once `charged` fits.
    pub cut: Option<u64>,
    /// `thrash`: score of evicted firehoses (unused ones raise it), and the sample counter.
    pub waste: u8,
    pub sample: u8,
}

#[derive(Debug)]
pub(crate) struct MoveRec {
    pub pins: Vec<u32>,
    pub put_op: Option<OpId>,
}

#[derive(Debug)]
pub(crate) struct Initiator {
    pub me: Rank,
    pub shift: u32,
    pub r: u32,
    pub max_op_len: usize,
    pub small_put_max: usize,
    /// `FirehoseConfig::small_put_pins_auto`.
    pub small_put_pins_auto: bool,
    pub max_msg: usize,
    pub adaptive: bool,
    /// F, each peer's fixed share (what a target's quota cuts are measured against).
    pub f: u64,
    pub peers: Vec<PeerI>,
    pub fhs: Vec<Fh>,
    /// The target-chosen handle of each slot of `fhs`.
    pub handles: Vec<u64>,
    pub fh_free: Vec<u32>,
    pub links: Links,
    pub pins: Vec<Option<Pin>>,
    pub pin_free: Vec<u32>,
    /// (peer, request id) -> what the move asked. Peer-chosen keys in replies: SipHash.
    pub moves: HashMap<(Rank, u32), MoveRec>,
    pub ops: FxHashMap<OpId, Op>,
    /// The op table's front slot (`Front`): an id is there or in `ops`, never both.
    pub front: Front,
    pub events: VecDeque<Event>,
    /// Ops failed since the stats were last updated (`take_failures`).
    pub failed: u64,
}

impl Initiator {
    pub fn new(cfg: &FirehoseConfig) -> Self {
        let f = cfg.firehoses_per_peer();
        Initiator {
            me: cfg.rank,
            shift: cfg.bucket_size.trailing_zeros(),
            r: cfg.region_buckets(),
            max_op_len: cfg.max_op_len(),
            small_put_max: cfg.small_put_max,
            small_put_pins_auto: cfg.small_put_pins_auto,
            max_msg: cfg.max_msg,
            adaptive: cfg.adaptive,
            f,
            peers: (0..cfg.size)
                .map(|_| PeerI {
                    quota: f,
                    ..PeerI::default()
                })
                .collect(),
            fhs: Vec::new(),
            handles: Vec::new(),
            fh_free: Vec::new(),
            links: Links::default(),
            pins: Vec::new(),
            pin_free: Vec::new(),
            moves: HashMap::new(),
            ops: FxHashMap::default(),
            front: Front::default(),
            events: VecDeque::new(),
            failed: 0,
        }
    }

    /// Buckets of `[raddr, raddr + len)`: first and last (inclusive).
    pub fn bucket_span(&self, raddr: u64, len: usize) -> (u64, u64) {
        (
            raddr >> self.shift,
            (raddr + (len as u64 - 1)) >> self.shift,
        )
    }
}

impl Initiator {
    pub fn check(&self) -> Result<(), String> {
        if let Some(op) = self.front.op {
            if self.ops.contains_key(&op) {
                return Err(format!("front slot {:?} also in the op table", self.front));
            }
            if !(1..=2).contains(&self.front.n) {
                return Err(format!("front slot {:?} holds no firehose", self.front));
            }
        }
        let free: std::collections::HashSet<u32> = self.fh_free.iter().copied().collect();
        for (op, o) in self.ops.iter() {
            if !o.rights.is_valid() {
                return Err(format!("op {op}: no rights"));
            }
            for &h in o.fhs.iter() {
                if !self.fhs[h as usize].rights.covers(o.rights) {
                    return Err(format!("op {op} holds firehose {h} without its rights"));
                }
            }
        }
        for (i, p) in self.peers.iter().enumerate() {
            let mut held = 0u64;
            let mut fifo = 0u64;
            for &id in p.by_handle.values() {
                if free.contains(&id) {
                    return Err(format!("peer {i}: freed firehose {id} still by handle"));
                }
                let fh = &self.fhs[id as usize];
                held += fh.nb as u64;
                // Unused = no refs, not revoked; the FIFO holds every unused firehose and,
                // lazily, some in use (never a revoked one).
                if fh.refs == 0 && !fh.revoked {
                    fifo += fh.nb as u64;
                }
                if self.links.is_linked(id) {
                    if fh.revoked {
                        return Err(format!("revoked firehose {id} in the FIFO"));
                    }
                } else if fh.refs == 0 && !p.lost {
                    return Err(format!("firehose {id} unused but not in the FIFO"));
                }
            }
            let reserved: u64 = self
                .moves
                .iter()
                .filter(|(k, _)| k.0 == i as Rank)
                .map(|(_, m)| m.pins.len() as u64 * self.r as u64)
                .sum();
            if held + reserved != p.charged || fifo != p.fifo_buckets {
                return Err(format!(
                    "peer {i}: charged {} != held {held} + reserved {reserved}; fifo {fifo}/{}",
                    p.charged, p.fifo_buckets
                ));
            }
            if p.charged > p.quota && p.cut.is_none() {
                return Err(format!(
                    "peer {i}: charged {} > quota {}",
                    p.charged, p.quota
                ));
            }
            for (b, id) in p.map.iter() {
                let fh = &self.fhs[id as usize];
                if fh.revoked
                    || b < fh.start
                    || b >= fh.start + fh.nb as u64
                    || !fh.rights.is_valid()
                {
                    return Err(format!("peer {i}: bucket {b} maps to a wrong firehose"));
                }
            }
        }
        Ok(())
    }
}
