//! Ordered map start -> id for containment and overlap queries, as a two-level sorted array:
//! blocks of at most `BLOCK` (start, id) entries plus one array of (each block's first start,
//! block). 12 bytes per entry in blocks that stay >= half full (appends at the end fill blocks
//! completely), against ~40 bytes per entry for a `BTreeMap<usize, ptr>` with its node overhead.
//! Mutated only by the writer with readers excluded; `&self` queries run concurrently.
//!
//! Cache lines, for the miss path (which runs cold, between system calls): an entry's start and
//! id sit side by side (packed, 12 bytes), a block is one 64-byte aligned allocation with its
//! length in front of its entries, and a block's first start sits next to its pointer. Looking
//! up, inserting or removing in a small index then touches two lines (the top array and the
//! block's first line), where separate arrays of starts, ids, firsts and `Vec` headers took five.

const BLOCK: usize = 256;

/// One (start, id) pair: 12 bytes, aligned to 4, so the start and the id share a line.
#[derive(Clone, Copy, Default)]
#[repr(C, packed(4))]
struct Entry {
    key: usize,
    id: u32,
}

/// Up to `BLOCK` entries in key order; `len` sits in the first line, with the first entries.
#[repr(C, align(64))]
struct Block {
    len: u32,
    entries: [Entry; BLOCK],
}

impl Block {
    fn new() -> Box<Block> {
        Box::new(Block {
            len: 0,
            entries: [Entry::default(); BLOCK],
        })
    }

    #[inline]
    fn entries(&self) -> &[Entry] {
        &self.entries[..self.len as usize]
    }

    /// Position of the first entry with key > `key`.
    #[inline]
    fn upper(&self, key: usize) -> usize {
        self.entries().partition_point(|e| { e.key } <= key)
    }

    #[inline]
    fn key(&self, i: usize) -> usize {
        self.entries[i].key
    }

    fn insert_at(&mut self, i: usize, key: usize, id: u32) {
        let n = self.len as usize;
        debug_assert!(n < BLOCK && i <= n);
        if i < n {
            // (Not for appends: a copy of nothing is still a call to memmove.)
            self.entries.copy_within(i..n, i + 1);
        }
        self.entries[i] = Entry { key, id };
        self.len += 1;
    }

    fn remove_at(&mut self, i: usize) {
        let n = self.len as usize;
        debug_assert!(i < n);
        if i + 1 < n {
            self.entries.copy_within(i + 1..n, i);
        }
        self.len -= 1;
    }
}

pub(super) struct Sorted {
    /// (first key, block) per block, in key order; no block is empty.
    blocks: Vec<(usize, Box<Block>)>,
    /// The last block that emptied, kept for the next new block: a cache that goes empty <->
    /// one region on every miss (tight bounds) then pays no malloc/free pair per insert/remove.
    spare: Option<Box<Block>>,
}

impl Sorted {
    pub(super) fn new() -> Self {
        Sorted {
            blocks: Vec::new(),
            spare: None,
        }
    }

    /// Block of the last entry with key <= `key` (`None`: every key is greater).
    #[inline]
    fn pred_block(&self, key: usize) -> Option<usize> {
        self.blocks
            .partition_point(|&(f, _)| f <= key)
            .checked_sub(1)
    }

    /// (block, position) of the last entry with key <= `key`.
    #[inline]
    fn pred_pos(&self, key: usize) -> Option<(usize, usize)> {
        let b = self.pred_block(key)?;
        // The block's first key is <= `key`, so `upper` is at least 1.
        let i = self.blocks[b].1.upper(key) - 1;
        Some((b, i))
    }

    /// The entry with the greatest key <= `key`.
    #[inline]
    pub(super) fn pred(&self, key: usize) -> Option<(usize, u32)> {
        let (b, i) = self.pred_pos(key)?;
        let e = self.blocks[b].1.entries[i];
        Some((e.key, e.id))
    }

    /// Visit entries in key order, starting at the last one with key <= `key` (or at the first
    /// entry if there is none), until `f` returns false.
    pub(super) fn scan_from_pred(&self, key: usize, f: impl FnMut(usize, u32) -> bool) {
        let (b, i) = self.pred_pos(key).unwrap_or((0, 0));
        self.scan_at(b, i, f);
    }

    fn scan_at(&self, mut b: usize, mut i: usize, mut f: impl FnMut(usize, u32) -> bool) {
        while b < self.blocks.len() {
            for e in &self.blocks[b].1.entries()[i..] {
                if !f(e.key, e.id) {
                    return;
                }
            }
            b += 1;
            i = 0;
        }
    }

    /// Visit entries with key >= `from` in key order until `f` returns false.
    pub(super) fn scan_from(&self, from: usize, f: impl FnMut(usize, u32) -> bool) {
        let (b, i) = match self.pred_pos(from) {
            Some((b, i)) if self.blocks[b].1.key(i) == from => (b, i),
            Some((b, i)) => (b, i + 1),
            None => (0, 0),
        };
        self.scan_at(b, i, f);
    }

    pub(super) fn insert(&mut self, key: usize, id: u32) {
        let b = match self.pred_block(key) {
            Some(b) => b,
            None if self.blocks.is_empty() => {
                self.push_block(key, id);
                return;
            }
            None => 0, // new smallest key: goes to the front of block 0
        };
        let last = b + 1 == self.blocks.len();
        let (first, blk) = &mut self.blocks[b];
        let i = blk.entries().partition_point(|e| { e.key } < key);
        debug_assert!(i == blk.len as usize || blk.key(i) != key, "duplicate key");
        if (blk.len as usize) < BLOCK {
            blk.insert_at(i, key, id);
            *first = blk.key(0);
            return;
        }
        if i == BLOCK && last {
            // Append past the last full block (ascending fills): open a new block, keep this full.
            self.push_block(key, id);
            return;
        }
        // Split in half, then insert into the proper half.
        let mut upper = self.spare.take().unwrap_or_else(Block::new);
        upper.entries[..BLOCK - BLOCK / 2].copy_from_slice(&blk.entries[BLOCK / 2..]);
        upper.len = (BLOCK - BLOCK / 2) as u32;
        blk.len = (BLOCK / 2) as u32;
        self.blocks.insert(b + 1, (upper.key(0), upper));
        self.insert(key, id);
    }

    /// A new last block holding just (key, id); reuses the spare block if there is one.
    fn push_block(&mut self, key: usize, id: u32) {
        let mut blk = self.spare.take().unwrap_or_else(Block::new);
        debug_assert!(blk.len == 0);
        blk.insert_at(0, key, id);
        self.blocks.push((key, blk));
    }

    pub(super) fn remove(&mut self, key: usize) -> Option<u32> {
        let (b, i) = self.pred_pos(key)?;
        let nblocks = self.blocks.len();
        let next_len = self
            .blocks
            .get(b + 1)
            .map_or(usize::MAX, |n| n.1.len as usize);
        let (first, blk) = &mut self.blocks[b];
        let e = blk.entries[i];
        if { e.key } != key {
            return None;
        }
        if blk.len == 1 {
            // The block empties: keep it as the spare (no element moves; the last block, the
            // usual case, is popped rather than shifted out).
            blk.len = 0;
            let empty = if b + 1 == nblocks {
                self.blocks.pop()
            } else {
                Some(self.blocks.remove(b))
            };
            self.spare = empty.map(|(_, blk)| blk);
            return Some(e.id);
        }
        blk.remove_at(i);
        *first = blk.key(0);
        // Merge with the next block when both fit in one (keeps blocks dense under churn).
        if b + 1 < nblocks && (blk.len as usize).saturating_add(next_len) <= BLOCK / 2 {
            let (_, next) = self.blocks.remove(b + 1);
            let blk = &mut self.blocks[b].1;
            let (n, m) = (blk.len as usize, next.len as usize);
            blk.entries[n..n + m].copy_from_slice(next.entries());
            blk.len += m as u32;
            let mut next = next;
            next.len = 0;
            self.spare = Some(next);
        }
        Some(e.id)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.blocks.iter().map(|b| b.1.len as usize).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn matches_a_btreemap_under_churn() {
        let mut s = Sorted::new();
        let mut m: BTreeMap<usize, u32> = BTreeMap::new();
        let mut rng = fastrand::Rng::with_seed(99);
        for step in 0..60_000u32 {
            let x = rng.u64(..);
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

    /// Layout the miss path counts on: a start and its id in one line, a block's length and its
    /// first entries in the block's first line.
    #[test]
    fn entries_share_lines() {
        assert_eq!(std::mem::size_of::<Entry>(), 12);
        assert_eq!(std::mem::align_of::<Block>(), 64);
        assert_eq!(std::mem::offset_of!(Block, entries), 4);
        let b = Block::new();
        assert_eq!(&*b as *const Block as usize % 64, 0);
    }

    /// Descending inserts (every insert goes to the front of block 0: splits of a full first
    /// block), then blocks emptied one at a time from the middle and from the end (the spare is
    /// reused), then refilled: the map matches a `BTreeMap` after every step.
    #[test]
    fn front_inserts_and_emptied_blocks() {
        let mut s = Sorted::new();
        let mut m: BTreeMap<usize, u32> = BTreeMap::new();
        let check = |s: &Sorted, m: &BTreeMap<usize, u32>| {
            let mut got = Vec::new();
            s.scan_from(0, |k, v| {
                got.push((k, v));
                true
            });
            let want: Vec<_> = m.iter().map(|(&k, &v)| (k, v)).collect();
            assert_eq!(got, want);
            assert_eq!(s.is_empty(), m.is_empty());
            for (b, (first, blk)) in s.blocks.iter().enumerate() {
                assert!(blk.len > 0, "block {b} is empty");
                assert_eq!(*first, blk.key(0), "first key of block {b}");
            }
        };
        let n = 5 * BLOCK as u32;
        for k in (0..n).rev() {
            s.insert(k as usize * 16, k);
            m.insert(k as usize * 16, k);
        }
        check(&s, &m);
        assert!(s.blocks.len() >= 5);
        // Empty a middle block entry by entry, then the last one.
        for which in [s.blocks.len() / 2, s.blocks.len() - 2] {
            let keys: Vec<usize> = s.blocks[which].1.entries().iter().map(|e| e.key).collect();
            for k in keys {
                assert_eq!(s.remove(k), m.remove(&k));
                assert_eq!(s.remove(k), None, "removed twice");
            }
            check(&s, &m);
        }
        for k in (0..n).filter(|k| k % 3 == 0) {
            assert_eq!(s.remove(k as usize * 16), m.remove(&(k as usize * 16)));
        }
        check(&s, &m);
        for k in 0..n {
            let key = k as usize * 16 + 8;
            s.insert(key, k + n);
            m.insert(key, k + n);
        }
        check(&s, &m);
        for k in 0..2 * n {
            let key = k as usize * 8;
            assert_eq!(s.remove(key), m.remove(&key));
        }
        check(&s, &m);
        assert!(s.is_empty());
        s.insert(77, 1);
        assert_eq!(s.pred(100), Some((77, 1)));
        assert_eq!(s.pred(76), None);
    }
}
