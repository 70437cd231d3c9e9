//! The initiator's bucket -> firehose map (one per peer), read by every hit.
//!
//! Open addressing with linear probing, key and value side by side in one 16-byte slot, so a
//! lookup that finds its key at the home slot reads one cache line. A `HashMap` (hashbrown)
//! reads a line of control bytes and then a line of slots: at a working set of 16384 buckets
//! that was one of the hit's three random lines. Hand-written for that line only; it has no
//! tombstones (a removal shifts the entries behind it back), stays at most half full (doubles
//! past it), and is checked against `HashMap` by a randomized test below.
//!
//! Keys are bucket numbers: an address shifted right by at least 9 bits (buckets are >= 512
//! bytes), so `u64::MAX` never is one and marks an empty slot. They come from the local caller
//! or from grants validated against the local request, never raw from a peer; the multiplicative
//! hash is not meant to resist chosen keys.

const EMPTY: u64 = u64::MAX;

#[derive(Debug, Clone, Copy)]
struct Slot {
    key: u64,
    val: u32,
}

const VACANT: Slot = Slot { key: EMPTY, val: 0 };

#[derive(Debug, Default)]
pub struct BucketMap {
    slots: Vec<Slot>,
    len: usize,
    /// 64 - log2(slots.len()): the hash's top bits pick the home slot.
    shift: u32,
}

impl BucketMap {
    #[inline]
    fn home(&self, key: u64) -> usize {
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// The slot holding `key`, if any.
    #[inline]
    fn find(&self, key: u64) -> Option<usize> {
        debug_assert_ne!(key, EMPTY);
        if self.len == 0 {
            return None;
        }
        let mut i = self.home(key);
        loop {
            let s = self.slots[i];
            if s.key == key {
                return Some(i);
            }
            if s.key == EMPTY {
                return None;
            }
            i = (i + 1) & self.mask();
        }
    }

    /// The home slot is read inline (every hit reads it, and finds its key there at most half
    /// full), the rest of the probe sequence in `find`.
    #[inline(always)]
    pub fn get(&self, key: u64) -> Option<u32> {
        if self.len != 0 {
            let s = self.slots[self.home(key)];
            if s.key == key {
                return Some(s.val);
            }
            if s.key == EMPTY {
                return None;
            }
        }
        self.find(key).map(|i| self.slots[i].val)
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sets `key` to `val`; the previous value if there was one.
    pub fn insert(&mut self, key: u64, val: u32) -> Option<u32> {
        assert_ne!(key, EMPTY, "u64::MAX is not a bucket number");
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let mut i = self.home(key);
        loop {
            let s = &mut self.slots[i];
            if s.key == key {
                return Some(std::mem::replace(&mut s.val, val));
            }
            if s.key == EMPTY {
                *s = Slot { key, val };
                self.len += 1;
                return None;
            }
            i = (i + 1) & self.mask();
        }
    }

    /// Removes `key`; its value if it was there. The entries after it in its probe run move
    /// back so every key stays reachable from its home slot without a gap.
    pub fn remove(&mut self, key: u64) -> Option<u32> {
        let mut hole = self.find(key)?;
        let val = self.slots[hole].val;
        let mask = self.mask();
        let mut i = hole;
        loop {
            i = (i + 1) & mask;
            let s = self.slots[i];
            if s.key == EMPTY {
                break;
            }
            // `s` may fill the hole if its home is not in (hole, i] (cyclically): then the
            // hole lies on its probe path.
            let home = self.home(s.key);
            let reachable = if hole <= i {
                hole < home && home <= i
            } else {
                hole < home || home <= i
            };
            if !reachable {
                self.slots[hole] = s;
                hole = i;
            }
        }
        self.slots[hole] = VACANT;
        self.len -= 1;
        Some(val)
    }

    /// Every (key, value), in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.slots
            .iter()
            .filter(|s| s.key != EMPTY)
            .map(|s| (s.key, s.val))
    }

    fn grow(&mut self) {
        let cap = (self.slots.len() * 2).max(16);
        let old = std::mem::replace(&mut self.slots, vec![VACANT; cap]);
        self.shift = 64 - cap.trailing_zeros();
        self.len = 0;
        for s in old.into_iter().filter(|s| s.key != EMPTY) {
            self.insert(s.key, s.val);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Random inserts, overwrites and removes over a small key space (long probe runs that
    /// wrap around the end of the table), checked against `HashMap` after every step.
    #[test]
    fn agrees_with_hashmap() {
        let mut rng = fastrand::Rng::with_seed(0x1234_5678);
        let mut next = || rng.u64(..);
        for space in [8u64, 64, 1000, 1 << 40] {
            let (mut m, mut h) = (BucketMap::default(), HashMap::new());
            for step in 0..20_000u32 {
                let k = next() % space;
                match next() % 3 {
                    0 | 1 => assert_eq!(m.insert(k, step), h.insert(k, step)),
                    _ => assert_eq!(m.remove(k), h.remove(&k)),
                }
                assert_eq!(m.len(), h.len());
                let probe = next() % space;
                assert_eq!(m.get(probe), h.get(&probe).copied(), "key {probe}");
                if step % 997 == 0 {
                    let mut all: Vec<_> = m.iter().collect();
                    all.sort_unstable();
                    let mut want: Vec<_> = h.iter().map(|(&k, &v)| (k, v)).collect();
                    want.sort_unstable();
                    assert_eq!(all, want);
                }
            }
            for k in 0..space.min(2000) {
                assert_eq!(m.get(k), h.get(&k).copied());
            }
        }
    }

    #[test]
    fn empty_and_top_keys() {
        let mut m = BucketMap::default();
        assert_eq!(m.get(5), None);
        assert_eq!(m.remove(5), None);
        assert!(m.is_empty());
        let top = (u64::MAX >> 9) - 1;
        assert_eq!(m.insert(top, 1), None);
        assert_eq!(m.insert(0, 2), None);
        assert_eq!(m.get(top), Some(1));
        assert_eq!(m.remove(top), Some(1));
        assert_eq!((m.get(top), m.get(0), m.len()), (None, Some(2), 1));
    }
}
