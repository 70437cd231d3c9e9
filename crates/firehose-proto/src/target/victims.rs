//! The victim FIFO: pinned regions no peer holds, kept pinned for reuse (a later pin of the
//! same buckets costs no `ibv_reg_mr`), oldest unpinned first when over MAXVICTIM or when room
//! is needed for a new pin.

use super::Target;
use crate::stats::FirehoseStats;
use crate::RegionPins;

impl Target {
    /// `slot` lost its last holder: keep it as a victim, then trim the FIFO to its bound.
    pub(super) fn push_victim(
        &mut self,
        slot: u32,
        pins: &mut dyn RegionPins,
        st: &mut FirehoseStats,
    ) {
        let nb = self.region(slot).nb as u64;
        self.links.push_back(&mut self.victims, slot);
        self.victim_buckets += nb;
        self.trim_victims(0, pins, st);
    }

    /// A victim gets a holder again.
    pub(super) fn take_victim(&mut self, slot: u32) {
        if self.links.remove(&mut self.victims, slot) {
            self.victim_buckets -= self.region(slot).nb as u64;
        }
    }

    /// Unpins the oldest victims until they fit MAXVICTIM and `extra` more buckets fit under
    /// M + MAXVICTIM. False if `extra` still does not fit (only possible out of protocol).
    pub(super) fn trim_victims(
        &mut self,
        extra: u64,
        pins: &mut dyn RegionPins,
        st: &mut FirehoseStats,
    ) -> bool {
        let limit = self.m_buckets + self.max_victim_buckets;
        while self.victim_buckets > self.max_victim_buckets || self.pinned_buckets + extra > limit {
            let Some(slot) = self.links.pop_front(&mut self.victims) else {
                break;
            };
            self.victim_buckets -= self.region(slot).nb as u64;
            self.unpin(slot, pins, st);
        }
        self.pinned_buckets + extra <= limit
    }
}
