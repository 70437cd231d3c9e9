//! Whether pinning pays for a peer's small puts ("thrash" detection).
//!
//! A small put that misses rides in its move anyway (the target writes it); the pins it carries
//! along only pay if a later op hits them. Past M + MAXVICTIM with scattered puts they do not:
//! each move then releases a firehose nobody used and pins one nobody will, and the put waits
//! for an `ibv_dereg_mr` + `ibv_reg_mr` at the target for nothing (measured on rxe: a move with
//! a region pin costs more than a whole Rendezvous with-unpin put). So the initiator scores each
//! firehose it evicts: used by at least `USEFUL_USES` later ops (hits, or misses that found it
//! mapped) lowers the score by `USEFUL_WEIGHT`, less raises it by one. At `THRASH` or above,
//! small puts to that peer ride in their move *without* pins, except one in `SAMPLE_EVERY`,
//! whose firehose keeps measuring: if the workload turns local again, those get used and the
//! score falls back. Only small puts change: gets and larger puts must pin to move at all.
//!
//! Why not pinning loses no hits under uniformly scattered puts: the firehoses held stay at
//! the quota either way (only which ones changes, and more slowly), so the share of the
//! working set they cover, which is the hit rate, is the same. A firehose's lifetime is longer
//! when fewer pins evict it, hence a threshold of several uses rather than one: a scattered
//! workload scores "unused" whether or not it is pinning.

use super::Initiator;
use crate::Rank;

/// Score at which a peer's small puts stop pinning.
const THRASH: u8 = 8;
/// Highest score (how many unused evictions the memory spans).
const MAX_SCORE: u8 = 16;
/// A firehose used by this many ops after its pin paid for it (a pin costs a registration and
/// a deregistration at the target; a hit saves a message round trip).
const USEFUL_USES: u32 = 4;
/// A firehose that paid is evidence worth this many that did not.
const USEFUL_WEIGHT: u8 = 4;
/// While thrashing, one small-put miss in this many still pins (keeps the score measured).
const SAMPLE_EVERY: u8 = 8;

impl Initiator {
    /// A firehose of `peer` is evicted; `uses`: ops that used it after the one it was pinned for.
    pub(crate) fn note_evicted(&mut self, peer: Rank, uses: u32) {
        let p = &mut self.peers[peer as usize];
        p.waste = if uses < USEFUL_USES {
            (p.waste + 1).min(MAX_SCORE)
        } else {
            p.waste.saturating_sub(USEFUL_WEIGHT)
        };
    }

    /// Should this small-put miss to `peer` carry pins? Counts the samples taken while thrashing.
    pub(crate) fn small_put_pins(&mut self, peer: Rank) -> bool {
        let p = &mut self.peers[peer as usize];
        if !self.small_put_pins_auto || p.waste < THRASH {
            return true;
        }
        p.sample = (p.sample + 1) % SAMPLE_EVERY;
        p.sample == 0
    }
}

#[cfg(test)]
mod tests {
    use crate::FirehoseConfig;

    use super::super::Initiator;
    use super::*;

    fn init(auto: bool) -> Initiator {
        let mut c = FirehoseConfig::new(0, 2);
        c.small_put_pins_auto = auto;
        Initiator::new(&c)
    }

    #[test]
    fn unused_evictions_stop_pinning_and_used_ones_resume_it() {
        let mut i = init(true);
        for _ in 0..THRASH - 1 {
            i.note_evicted(1, USEFUL_USES - 1);
            assert!(i.small_put_pins(1), "below the threshold every miss pins");
        }
        i.note_evicted(1, 0);
        let pinned = (0..64).filter(|_| i.small_put_pins(1)).count();
        assert_eq!(
            pinned,
            64 / SAMPLE_EVERY as usize,
            "only samples pin while thrashing"
        );
        // Other peers are scored apart.
        assert!(i.small_put_pins(0));
        // Saturation: as many used evictions as the cap allows bring it back.
        for _ in 0..100 {
            i.note_evicted(1, 0);
        }
        for _ in 0..MAX_SCORE.div_ceil(USEFUL_WEIGHT) - (THRASH / USEFUL_WEIGHT) + 1 {
            i.note_evicted(1, USEFUL_USES);
        }
        assert!(
            (0..8).all(|_| i.small_put_pins(1)),
            "used firehoses resume pinning"
        );
    }

    #[test]
    fn always_pins_when_switched_off() {
        let mut i = init(false);
        for _ in 0..100 {
            i.note_evicted(1, 0);
        }
        assert!((0..64).all(|_| i.small_put_pins(1)));
    }
}
