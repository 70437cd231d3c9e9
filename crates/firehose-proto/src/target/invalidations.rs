//! The target's unfinished invalidations (a leaf of `target`: `revoke.rs` starts and ends them,
//! `mod.rs` keeps them).

use std::collections::HashMap;

/// Names one `invalidate` call; see `Firehose::invalidation_done`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InvalId(pub u64);

#[derive(Debug, Default)]
pub(crate) struct Invalidations {
    pub(super) next: u64,
    /// Regions each unfinished invalidation still waits for.
    pub(super) pending: HashMap<u64, u32>,
}

impl Invalidations {
    pub(super) fn start(&mut self) -> u64 {
        self.next += 1;
        self.next
    }
    pub fn region_done(&mut self, id: u64) {
        let n = self.pending.get_mut(&id).expect("pending invalidation");
        *n -= 1;
        if *n == 0 {
            self.pending.remove(&id);
        }
    }
    pub fn is_done(&self, id: InvalId) -> bool {
        id.0 >= 1 && id.0 <= self.next && !self.pending.contains_key(&id.0)
    }
    pub fn unfinished(&self) -> usize {
        self.pending.len()
    }
}
