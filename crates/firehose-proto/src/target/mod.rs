//! The target side: this rank's memory that peers pin through their firehoses.
//!
//! Owns the region table (every region pinned through `RegionPins`, its holders, its state),
//! the victim FIFO (`victims.rs`), the per-peer charges and quotas, and invalidations
//! (`invalidate.rs`). Regions are aligned runs of at most R buckets, never crossing an aligned
//! R-bucket chunk; two regions may overlap (a fallback pin of just the needed buckets inside a
//! chunk that another region partly covers): pinned bytes are counted per region, so the count
//! is an upper bound of what the kernel has locked.
//!
//! The bound: every region with a holder is charged in full to each holder; a move is rejected
//! unless the sender's charge stays within its quota, and quotas sum to at most M. So
//! referenced bytes <= M; unreferenced bytes (victims) are trimmed to MAXVICTIM; pinned bytes
//! <= M + MAXVICTIM at all times.

mod invalidations;
mod moves;
mod quota;
mod revoke;
mod victims;

use super::fifo::{Links, List};
use super::stats::FirehoseStats;
use super::Rights;
use crate::Rank;
use std::collections::{BTreeSet, HashMap};

pub use invalidations::InvalId;

#[derive(Debug)]
pub(crate) struct Region {
    pub handle: u64,
    pub start: u64,
    pub nb: u32,
    pub rkey: u32,
    /// What its key allows (it serves pins asking for these or fewer).
    pub rights: Rights,
    /// Peers holding a firehose on it (each at most once).
    pub holders: Vec<Rank>,
    /// The key each holder was granted (`RegionPins::key_for`), index for index with `holders`.
    pub keys: Vec<u32>,
    /// Invalidations waiting for this region (non-empty: revoking, never reused).
    pub revoking: Vec<u64>,
}

#[derive(Debug, Default, Clone)]
pub(crate) struct PeerT {
    /// Buckets of the regions this peer holds.
    pub charge: u64,
    /// Buckets this peer may hold (F, or what adaptive lending made of it).
    pub quota: u64,
    pub lost: bool,
    /// Adaptive: a cut to this quota was sent and not acked yet.
    pub cut_to: Option<u64>,
    /// Adaptive: buckets more this peer asked for and did not get yet.
    pub wants: u64,
    /// Request id of the last move with pins or a put from this peer: the next must be +1
    /// (skipping 0), so a replayed or forged move is refused.
    pub last_req: u32,
}

#[derive(Debug)]
pub(crate) struct Target {
    pub shift: u32,
    pub r: u32,
    pub m_buckets: u64,
    pub max_victim_buckets: u64,
    pub small_put_max: usize,
    pub max_msg: usize,
    pub adaptive: bool,
    pub me: Rank,
    /// Fixed share per peer (F).
    pub f: u64,
    pub peers: Vec<PeerT>,
    pub slots: Vec<Option<Region>>,
    free: Vec<u32>,
    /// Peer-chosen keys (handles in releases): SipHash, not the fast integer hasher.
    pub by_handle: HashMap<u64, u32>,
    /// (start bucket, slot) of every region, for range queries.
    pub by_start: BTreeSet<(u64, u32)>,
    pub links: Links,
    pub victims: List,
    pub victim_buckets: u64,
    pub pinned_buckets: u64,
    next_handle: u64,
    pub inval: invalidations::Invalidations,
}

impl Target {
    pub fn new(cfg: &super::FirehoseConfig) -> Self {
        let f = cfg.firehoses_per_peer();
        let peers = (0..cfg.size)
            .map(|p| PeerT {
                quota: if p == cfg.rank { 0 } else { f },
                ..PeerT::default()
            })
            .collect();
        Target {
            shift: cfg.bucket_size.trailing_zeros(),
            r: cfg.region_buckets(),
            m_buckets: (cfg.m_bytes / cfg.bucket_size) as u64,
            max_victim_buckets: (cfg.max_victim_bytes / cfg.bucket_size) as u64,
            small_put_max: cfg.small_put_max,
            max_msg: cfg.max_msg,
            adaptive: cfg.adaptive,
            me: cfg.rank,
            f,
            peers,
            slots: Vec::new(),
            free: Vec::new(),
            by_handle: HashMap::new(),
            by_start: BTreeSet::new(),
            links: Links::default(),
            victims: List::default(),
            victim_buckets: 0,
            pinned_buckets: 0,
            next_handle: 1,
            inval: invalidations::Invalidations::default(),
        }
    }

    pub fn region(&self, slot: u32) -> &Region {
        self.slots[slot as usize].as_ref().expect("live slot")
    }

    pub fn region_mut(&mut self, slot: u32) -> &mut Region {
        self.slots[slot as usize].as_mut().expect("live slot")
    }

    pub fn bytes(&self, buckets: u64) -> u64 {
        buckets << self.shift
    }

    /// Records a region just pinned; returns its slot.
    fn insert(
        &mut self,
        start: u64,
        nb: u32,
        rkey: u32,
        rights: Rights,
        st: &mut FirehoseStats,
    ) -> u32 {
        let handle = self.next_handle;
        self.next_handle += 1;
        let reg = Region {
            handle,
            start,
            nb,
            rkey,
            rights,
            holders: Vec::new(),
            keys: Vec::new(),
            revoking: Vec::new(),
        };
        let slot = match self.free.pop() {
            Some(s) => {
                self.slots[s as usize] = Some(reg);
                s
            }
            None => {
                self.slots.push(Some(reg));
                (self.slots.len() - 1) as u32
            }
        };
        self.by_handle.insert(handle, slot);
        self.by_start.insert((start, slot));
        self.pinned_buckets += nb as u64;
        st.pins += 1;
        st.pinned_bytes = self.bytes(self.pinned_buckets);
        st.pinned_peak = st.pinned_peak.max(st.pinned_bytes);
        slot
    }

    /// Unpins a region nobody holds (not in the victim FIFO) and forgets it.
    fn unpin(&mut self, slot: u32, pins: &mut dyn super::RegionPins, st: &mut FirehoseStats) {
        let reg = self.slots[slot as usize].take().expect("live slot");
        assert!(reg.holders.is_empty(), "unpin of a held region");
        debug_assert!(!self.links.is_linked(slot));
        self.by_handle.remove(&reg.handle);
        self.by_start.remove(&(reg.start, slot));
        self.free.push(slot);
        self.pinned_buckets -= reg.nb as u64;
        pins.unpin(
            reg.start << self.shift,
            (reg.nb as usize) << self.shift,
            reg.rkey,
        );
        st.unpins += 1;
        st.pinned_bytes = self.bytes(self.pinned_buckets);
        for id in reg.revoking {
            self.inval.region_done(id);
        }
    }

    /// Slots of the regions overlapping buckets `[lo, hi)`.
    fn overlapping(&self, lo: u64, hi: u64) -> Vec<u32> {
        let from = lo.saturating_sub(self.r as u64 - 1);
        self.by_start
            .range((from, 0)..(hi, 0))
            .filter(|&&(s, slot)| s + self.region(slot).nb as u64 > lo)
            .map(|&(_, slot)| slot)
            .collect()
    }

    /// `peer` stops holding `slot` (release, revoke ack, or peer lost).
    fn drop_holder(
        &mut self,
        slot: u32,
        peer: Rank,
        pins: &mut dyn super::RegionPins,
        st: &mut FirehoseStats,
    ) {
        let reg = self.region_mut(slot);
        let i = reg.holders.iter().position(|&h| h == peer).expect("holder");
        reg.holders.swap_remove(i);
        let key = reg.keys.swap_remove(i);
        // The holder's key dies before anything else can happen to the region.
        pins.drop_key(peer, reg.rkey, key);
        let reg = self.region(slot);
        let nb = reg.nb as u64;
        let idle = reg.holders.is_empty();
        let revoking = !reg.revoking.is_empty();
        self.peers[peer as usize].charge -= nb;
        if idle {
            if revoking {
                self.unpin(slot, pins, st);
            } else {
                self.push_victim(slot, pins, st);
            }
        }
    }

    /// The driver declared `peer` lost: it holds nothing any more (counts as every ack).
    pub fn peer_lost(
        &mut self,
        peer: Rank,
        pins: &mut dyn super::RegionPins,
        st: &mut FirehoseStats,
    ) {
        let held: Vec<u32> = (0..self.slots.len() as u32)
            .filter(|&s| {
                self.slots[s as usize]
                    .as_ref()
                    .is_some_and(|r| r.holders.contains(&peer))
            })
            .collect();
        for s in held {
            self.drop_holder(s, peer, pins, st);
        }
        let p = &mut self.peers[peer as usize];
        p.lost = true;
        p.wants = 0;
        p.cut_to = None;
        // Its share is free now; only lending can give it to others.
        if self.adaptive {
            p.quota = 0;
        }
    }

    /// Buckets held by at least one peer (the live part of the pinned set).
    pub fn live_buckets(&self) -> u64 {
        self.pinned_buckets - self.victim_buckets
    }
}

impl Target {
    pub fn check(&self) -> Result<(), String> {
        let mut charge = vec![0u64; self.peers.len()];
        let (mut pinned, mut victims) = (0u64, 0u64);
        for (slot, r) in self.slots.iter().enumerate() {
            let Some(r) = r else { continue };
            pinned += r.nb as u64;
            if r.keys.len() != r.holders.len() {
                return Err(format!(
                    "region {slot}: {} keys for {} holders",
                    r.keys.len(),
                    r.holders.len()
                ));
            }
            for &h in &r.holders {
                charge[h as usize] += r.nb as u64;
            }
            let linked = self.links.is_linked(slot as u32);
            if r.holders.is_empty() {
                if !linked || !r.revoking.is_empty() {
                    return Err(format!("unheld region {slot} not a victim"));
                }
                victims += r.nb as u64;
            } else if linked {
                return Err(format!("held region {slot} in the victim FIFO"));
            }
        }
        if pinned != self.pinned_buckets || victims != self.victim_buckets {
            return Err(format!(
                "pinned {pinned}/{} victims {victims}/{}",
                self.pinned_buckets, self.victim_buckets
            ));
        }
        if victims > self.max_victim_buckets {
            return Err(format!("victims {victims} buckets > MAXVICTIM"));
        }
        if pinned > self.m_buckets + self.max_victim_buckets {
            return Err(format!("pinned {pinned} buckets > M + MAXVICTIM"));
        }
        if self.live_buckets() > self.m_buckets {
            return Err(format!("referenced {} buckets > M", self.live_buckets()));
        }
        let quotas: u64 = self.peers.iter().map(|p| p.quota).sum();
        if quotas > self.m_buckets {
            return Err(format!("quotas {quotas} > M {}", self.m_buckets));
        }
        for (i, p) in self.peers.iter().enumerate() {
            if p.charge != charge[i] || p.charge > p.quota {
                return Err(format!(
                    "peer {i}: charge {} (regions {}) quota {}",
                    p.charge, charge[i], p.quota
                ));
            }
        }
        Ok(())
    }
}
