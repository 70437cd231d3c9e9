//! Ordered map start -> id for containment and overlap queries, as a two-level sorted array:
//! blocks of at most `BLOCK` (start, id) pairs plus one array of each block's first start.
//! 12 bytes per entry in blocks that stay >= half full (appends at the end fill blocks
//! completely), against ~40 bytes per entry for a `BTreeMap<usize, ptr>` with its node overhead.
//! Mutated only by the writer with readers excluded; `&self` queries run concurrently.

const BLOCK: usize = 256;

struct Block {
    keys: Vec<usize>,
    ids: Vec<u32>,
}

impl Block {
    fn with(keys: Vec<usize>, ids: Vec<u32>) -> Block {
        Block { keys, ids }
    }
}

pub struct Sorted {
    firsts: Vec<usize>,
    blocks: Vec<Block>,
    /// The last block that emptied, kept for the next new block: a cache that goes empty <->
    /// one region on every miss (tight bounds) then pays no malloc/free pair per insert/remove.
    spare: Option<Block>,
}

impl Sorted {
    pub fn new() -> Self {
        Sorted {
            firsts: Vec::new(),
            blocks: Vec::new(),
            spare: None,
        }
    }

    /// (block, position) of the last entry with key <= `key`.
    #[inline]
    fn pred_pos(&self, key: usize) -> Option<(usize, usize)> {
        let b = self.firsts.partition_point(|&f| f <= key).checked_sub(1)?;
        let i = self.blocks[b].keys.partition_point(|&k| k <= key) - 1;
        Some((b, i))
    }

    /// The entry with the greatest key <= `key`.
    #[inline]
    pub fn pred(&self, key: usize) -> Option<(usize, u32)> {
        let (b, i) = self.pred_pos(key)?;
        let blk = &self.blocks[b];
        Some((blk.keys[i], blk.ids[i]))
    }

    /// Visit entries in key order, starting at the last one with key <= `key` (or at the first
    /// entry if there is none), until `f` returns false.
    pub fn scan_from_pred(&self, key: usize, f: impl FnMut(usize, u32) -> bool) {
        let (b, i) = self.pred_pos(key).unwrap_or((0, 0));
        self.scan_at(b, i, f);
    }

    fn scan_at(&self, mut b: usize, mut i: usize, mut f: impl FnMut(usize, u32) -> bool) {
        while b < self.blocks.len() {
            let blk = &self.blocks[b];
            while i < blk.keys.len() {
                if !f(blk.keys[i], blk.ids[i]) {
                    return;
                }
                i += 1;
            }
            b += 1;
            i = 0;
        }
    }

    /// Visit entries with key >= `from` in key order until `f` returns false.
    pub fn scan_from(&self, from: usize, f: impl FnMut(usize, u32) -> bool) {
        let (b, i) = match self.pred_pos(from) {
            Some((b, i)) if self.blocks[b].keys[i] == from => (b, i),
            Some((b, i)) => (b, i + 1),
            None => (0, 0),
        };
        self.scan_at(b, i, f);
    }

    pub fn insert(&mut self, key: usize, id: u32) {
        let b = match self.firsts.partition_point(|&f| f <= key).checked_sub(1) {
            Some(b) => b,
            None if self.blocks.is_empty() => {
                self.push_block(key, id);
                return;
            }
            None => 0, // new smallest key: goes to the front of block 0
        };
        let last = b + 1 == self.blocks.len();
        let blk = &mut self.blocks[b];
        let i = blk.keys.partition_point(|&k| k < key);
        debug_assert!(blk.keys.get(i) != Some(&key), "duplicate key");
        if blk.keys.len() < BLOCK {
            blk.keys.insert(i, key);
            blk.ids.insert(i, id);
            self.firsts[b] = blk.keys[0];
            return;
        }
        if i == BLOCK && last {
            // Append past the last full block (ascending fills): open a new block, keep this full.
            self.push_block(key, id);
            return;
        }
        // Split in half, then insert into the proper half.
        let mut keys = Vec::with_capacity(BLOCK);
        let mut ids = Vec::with_capacity(BLOCK);
        keys.extend(blk.keys.drain(BLOCK / 2..));
        ids.extend(blk.ids.drain(BLOCK / 2..));
        self.firsts.insert(b + 1, keys[0]);
        self.blocks.insert(b + 1, Block::with(keys, ids));
        self.insert(key, id);
    }

    /// A new last block holding just (key, id); reuses the spare block if there is one.
    fn push_block(&mut self, key: usize, id: u32) {
        let blk = match self.spare.take() {
            Some(mut blk) => {
                debug_assert!(blk.keys.is_empty() && blk.ids.is_empty());
                blk.keys.push(key);
                blk.ids.push(id);
                blk
            }
            None => Block::with(alloc_keys(key), alloc_ids(id)),
        };
        self.firsts.push(key);
        self.blocks.push(blk);
    }

    pub fn remove(&mut self, key: usize) -> Option<u32> {
        let (b, i) = self.pred_pos(key)?;
        let nblocks = self.blocks.len();
        let next_len = self.blocks.get(b + 1).map_or(usize::MAX, |n| n.keys.len());
        let blk = &mut self.blocks[b];
        if blk.keys[i] != key {
            return None;
        }
        let id = blk.ids[i];
        if blk.keys.len() == 1 {
            // The block empties: keep it as the spare (no element moves; the last block, the
            // usual case, is popped rather than shifted out).
            blk.keys.clear();
            blk.ids.clear();
            let empty = if b + 1 == nblocks {
                self.firsts.pop();
                self.blocks.pop()
            } else {
                self.firsts.remove(b);
                Some(self.blocks.remove(b))
            };
            self.spare = empty;
            return Some(id);
        }
        blk.keys.remove(i);
        blk.ids.remove(i);
        {
            self.firsts[b] = blk.keys[0];
            // Merge with the next block when both fit in one (keeps blocks dense under churn).
            if b + 1 < nblocks && blk.keys.len().saturating_add(next_len) <= BLOCK / 2 {
                let next = self.blocks.remove(b + 1);
                self.firsts.remove(b + 1);
                let blk = &mut self.blocks[b];
                blk.keys.extend(next.keys);
                blk.ids.extend(next.ids);
            }
        }
        Some(id)
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.blocks.iter().map(|b| b.keys.len()).sum()
    }
}

fn alloc_keys(k: usize) -> Vec<usize> {
    let mut v = Vec::with_capacity(BLOCK);
    v.push(k);
    v
}

fn alloc_ids(id: u32) -> Vec<u32> {
    let mut v = Vec::with_capacity(BLOCK);
    v.push(id);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn matches_a_btreemap_under_churn() {
        let mut s = Sorted::new();
        let mut m: BTreeMap<usize, u32> = BTreeMap::new();
        let mut x: u64 = 99;
        for step in 0..60_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Phases: ascending appends, then random churn.
            let key = if step < 3000 {
                step as usize * 8
            } else {
                (x % 4000) as usize * 8
            };
            if step < 3000 || x & 3 != 0 {
                if let std::collections::btree_map::Entry::Vacant(e) = m.entry(key) {
                    e.insert(step);
                    s.insert(key, step);
                }
            } else {
                assert_eq!(s.remove(key), m.remove(&key));
            }
            if step % 997 == 0 {
                assert_eq!(s.len(), m.len());
                for q in [0usize, 1, key, key + 3, 40_000] {
                    let want = m.range(..=q).next_back().map(|(&k, &v)| (k, v));
                    assert_eq!(s.pred(q), want, "pred({q})");
                    let mut got = Vec::new();
                    s.scan_from(q, |k, v| {
                        got.push((k, v));
                        got.len() < 5
                    });
                    let want: Vec<_> = m.range(q..).take(5).map(|(&k, &v)| (k, v)).collect();
                    assert_eq!(got, want, "scan_from({q})");
                }
            }
        }
        let dense = s.len() as f64 / (s.blocks.len() * BLOCK) as f64;
        assert!(dense > 0.3, "blocks stay reasonably full: {dense}");
    }
}
