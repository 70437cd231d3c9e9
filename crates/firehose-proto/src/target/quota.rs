//! Adaptive lending (the paper's future work, off by default): a peer that runs out of
//! firehoses here asks for more (QUOTA_WANT); the target grants from the unassigned pool, and
//! fills the pool by cutting the quota of idle peers (using at most half of theirs) or, when a
//! peer below its fair share F is starved, of the peers that borrowed above F.
//!
//! A cut is a QUOTA_SET with `cut`; the holder evicts unused firehoses, waits for its in-flight
//! ops, and acks with exactly the cut value once its charge fits. Until the ack the target keeps
//! the old quota for that peer (in its checks and in the sum), so the quotas always sum to at
//! most M and referenced pinned bytes stay <= M: lending never moves the bound.

use super::Target;
use crate::error::WireError;
use crate::stats::FirehoseStats;
use crate::wire::{self, Msg};
use crate::Outbox;
use crate::Rank;

impl Target {
    fn pool(&self) -> u64 {
        let assigned: u64 = self.peers.iter().map(|p| p.quota).sum();
        self.m_buckets.saturating_sub(assigned)
    }

    fn floor(&self) -> u64 {
        (2 * self.r as u64).min(self.f)
    }

    pub fn handle_quota_want(
        &mut self,
        from: Rank,
        want: u64,
        out: &mut Outbox,
        st: &mut FirehoseStats,
    ) -> Result<(), WireError> {
        if !self.adaptive || want == 0 || want > self.m_buckets {
            return Err(WireError::BadQuota);
        }
        self.peers[from as usize].wants = want;
        self.rebalance(out, st);
        Ok(())
    }

    pub fn handle_quota_ack(
        &mut self,
        from: Rank,
        quota: u64,
        out: &mut Outbox,
        st: &mut FirehoseStats,
    ) -> Result<(), WireError> {
        let p = &self.peers[from as usize];
        if !self.adaptive || p.cut_to != Some(quota) || p.charge > quota {
            return Err(WireError::BadQuota);
        }
        let p = &mut self.peers[from as usize];
        p.quota = quota;
        p.cut_to = None;
        self.rebalance(out, st);
        Ok(())
    }

    /// Grants what the pool allows to peers that want more, then starts cuts for the rest.
    pub(super) fn rebalance(&mut self, out: &mut Outbox, st: &mut FirehoseStats) {
        if self.peers.iter().all(|p| p.wants == 0) {
            return;
        }
        let step = 4 * self.r as u64;
        for s in 0..self.peers.len() {
            let p = &self.peers[s];
            if p.wants == 0 || p.lost || p.cut_to.is_some() {
                continue;
            }
            let g = self.pool().min(p.wants.max(step));
            if g == 0 {
                continue;
            }
            let p = &mut self.peers[s];
            p.quota += g;
            p.wants = p.wants.saturating_sub(g);
            let m = Msg::QuotaSet {
                quota: p.quota,
                cut: false,
            };
            st.quota_grants += 1;
            out.push_back((s as Rank, wire::encode(&m)));
        }
        let starving: Vec<usize> = (0..self.peers.len())
            .filter(|&s| self.peers[s].wants > 0 && !self.peers[s].lost)
            .collect();
        if starving.is_empty() {
            return;
        }
        let below_fair = starving.iter().any(|&s| self.peers[s].quota < self.f);
        let floor = self.floor();
        for d in 0..self.peers.len() {
            let p = &self.peers[d];
            if d as Rank == self.me || p.lost || p.cut_to.is_some() {
                continue;
            }
            let to = if below_fair && p.quota > self.f {
                self.f
            } else if p.wants == 0 && p.charge * 2 <= p.quota && p.quota > floor {
                floor.max(p.quota / 2)
            } else {
                continue;
            };
            self.peers[d].cut_to = Some(to);
            let m = Msg::QuotaSet {
                quota: to,
                cut: true,
            };
            st.quota_cuts += 1;
            out.push_back((d as Rank, wire::encode(&m)));
        }
    }
}
