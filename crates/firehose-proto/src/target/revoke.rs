//! Remote invalidation at the target (beyond the paper; GASNet never unmaps instead).
//!
//! `invalidate(range)`: victims in the range are unpinned at once; regions that peers hold are
//! marked revoking (never handed out again) and every holder gets a REVOKE. A holder answers
//! with REVOKE_ACK once its in-flight ops on them are released (or releases them in a move,
//! which counts the same); a lost peer counts as acked. The last holder gone, the region is
//! unpinned and the invalidation's count drops; at zero `is_done` turns true.

use super::invalidations::InvalId;
use super::Target;
use crate::error::WireError;
use crate::stats::FirehoseStats;
use crate::wire::{self, Msg};
use crate::Rank;
use crate::{Outbox, RegionPins};
use std::collections::BTreeMap;

impl Target {
    pub fn invalidate(
        &mut self,
        addr: u64,
        len: usize,
        rp: &mut dyn RegionPins,
        out: &mut Outbox,
        st: &mut FirehoseStats,
    ) -> InvalId {
        let id = self.inval.start();
        if len == 0 {
            return InvalId(id);
        }
        let lo = addr >> self.shift;
        let end = (addr as u128 + len as u128).min(1 << 64);
        let hi = ((end + (1u128 << self.shift) - 1) >> self.shift).min(u64::MAX as u128) as u64;
        // BTreeMap: revokes go out in rank order (deterministic simulation).
        let mut revokes: BTreeMap<Rank, Vec<u64>> = BTreeMap::new();
        for slot in self.overlapping(lo, hi) {
            let reg = self.region_mut(slot);
            if reg.holders.is_empty() {
                self.take_victim(slot);
                self.unpin(slot, rp, st);
                continue;
            }
            if reg.revoking.is_empty() {
                for &h in &reg.holders {
                    revokes.entry(h).or_default().push(reg.handle);
                }
            }
            reg.revoking.push(id);
            *self.inval.pending.entry(id).or_insert(0) += 1;
        }
        let per = wire::handles_per_msg(self.max_msg);
        for (peer, hs) in revokes {
            for chunk in hs.chunks(per) {
                out.push_back((peer, wire::encode(&Msg::Revoke(chunk.to_vec()))));
                st.revokes += 1;
            }
        }
        InvalId(id)
    }

    /// The holders that have not acked invalidation `id` yet (in rank order, once each).
    pub fn unacked_holders(&self, id: InvalId) -> Vec<Rank> {
        let mut v: Vec<Rank> = (self.slots.iter().flatten())
            .filter(|r| r.revoking.contains(&id.0))
            .flat_map(|r| r.holders.iter().copied())
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    pub fn handle_revoke_ack(
        &mut self,
        from: Rank,
        handles: &[u64],
        rp: &mut dyn RegionPins,
        out: &mut Outbox,
        st: &mut FirehoseStats,
    ) -> Result<(), WireError> {
        let mut slots = Vec::with_capacity(handles.len());
        for (i, h) in handles.iter().enumerate() {
            let slot = *self.by_handle.get(h).ok_or(WireError::NotHeld)?;
            let reg = self.region(slot);
            if reg.revoking.is_empty() || !reg.holders.contains(&from) || handles[..i].contains(h) {
                return Err(WireError::NotHeld);
            }
            slots.push(slot);
        }
        for slot in slots {
            self.drop_holder(slot, from, rp, st);
        }
        if self.adaptive {
            self.rebalance(out, st);
        }
        Ok(())
    }
}
