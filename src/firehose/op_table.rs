//! `OpTable`: the initiator's unfinished ops by id, touched several times per op on the hit path
//! (`acquire` checks the id is new and inserts, `release` finds and removes).
//!
//! Op ids are the driver's, any `u64` unique among its unfinished ops. The driver of `crate::rma`
//! uses slab keys (a small slot index in the low 32 bits, a generation above), so an id whose low
//! 32 bits are below `DIRECT_MAX` sits in a vector at that index: a lookup is an index and a
//! compare of the whole id, no hash. Any other id (a larger index, or a second live id with the
//! same low bits) goes to a hash map, looked into only when it is not empty. Same contract as a
//! map: an id is in at most one of the two places, `insert` replaces.

use super::small::IntMap;
use super::OpId;

/// Ids with low 32 bits below this are stored by index (the vector grows to the highest such
/// index used, so it stays small for a driver that reuses low slots, as a slab does).
const DIRECT_MAX: usize = 4096;

#[derive(Debug)]
pub(crate) struct OpTable<V> {
    direct: Vec<Option<(OpId, V)>>,
    other: IntMap<OpId, V>,
    len: usize,
}

impl<V> Default for OpTable<V> {
    fn default() -> Self {
        OpTable {
            direct: Vec::new(),
            other: IntMap::default(),
            len: 0,
        }
    }
}

/// The vector index of `id`, if ids like it are stored by index.
#[inline]
fn index(id: OpId) -> Option<usize> {
    let i = id as u32 as usize;
    (i < DIRECT_MAX).then_some(i)
}

impl<V> OpTable<V> {
    #[inline]
    pub fn get(&self, id: &OpId) -> Option<&V> {
        if let Some(Some((k, v))) = index(*id).and_then(|i| self.direct.get(i)) {
            if k == id {
                return Some(v);
            }
        }
        if self.other.is_empty() {
            return None;
        }
        self.other.get(id)
    }

    #[inline]
    pub fn get_mut(&mut self, id: &OpId) -> Option<&mut V> {
        if let Some(Some((k, v))) = index(*id).and_then(|i| self.direct.get_mut(i)) {
            if k == id {
                return Some(v);
            }
        }
        if self.other.is_empty() {
            return None;
        }
        self.other.get_mut(id)
    }

    #[inline]
    pub fn contains_key(&self, id: &OpId) -> bool {
        self.get(id).is_some()
    }

    /// Stores `v` under `id` (replacing what was there).
    #[inline]
    pub fn insert(&mut self, id: OpId, v: V) {
        // The usual case: a free slot, and no id in the map that could be this one.
        if let Some(slot) = index(id).and_then(|i| self.direct.get_mut(i)) {
            if slot.is_none() && self.other.is_empty() {
                *slot = Some((id, v));
                self.len += 1;
                return;
            }
        }
        self.insert_slow(id, v);
    }

    /// `insert` when the slot is taken or the map holds ids (out of line: rare).
    #[cold]
    #[inline(never)]
    fn insert_slow(&mut self, id: OpId, v: V) {
        if let Some(old) = self.get_mut(&id) {
            *old = v;
            return;
        }
        self.len += 1;
        if let Some(i) = index(id) {
            if i >= self.direct.len() {
                self.direct.resize_with(i + 1, || None);
            }
            let slot = &mut self.direct[i];
            if slot.is_none() {
                *slot = Some((id, v));
                return;
            }
        }
        self.other.insert(id, v);
    }

    #[inline]
    pub fn remove(&mut self, id: &OpId) -> Option<V> {
        if let Some(slot) = index(*id).and_then(|i| self.direct.get_mut(i)) {
            if slot.as_ref().is_some_and(|(k, _)| k == id) {
                self.len -= 1;
                return slot.take().map(|(_, v)| v);
            }
        }
        if self.other.is_empty() {
            return None;
        }
        let v = self.other.remove(id)?;
        self.len -= 1;
        Some(v)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Every op, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&OpId, &V)> {
        self.direct
            .iter()
            .filter_map(|s| s.as_ref().map(|(k, v)| (k, v)))
            .chain(self.other.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Same answers as a `HashMap` under a mix of slab-like keys, colliding low bits, large
    /// indices and made-up ids.
    #[test]
    fn behaves_as_a_map() {
        let mut t = OpTable::default();
        let mut m = HashMap::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for step in 0..20_000u64 {
            let r = next();
            let id = match r % 4 {
                // Slab-like: a few low slots, a few generations (so low bits collide).
                0 | 1 => (((r >> 8) % 4) << 32) | ((r >> 16) % 8),
                2 => (((r >> 8) % 3) << 32) | (DIRECT_MAX as u64 - 1 + (r >> 16) % 3),
                _ => r >> 2,
            };
            match next() % 3 {
                0 => {
                    t.insert(id, step);
                    m.insert(id, step);
                }
                1 => assert_eq!(t.remove(&id), m.remove(&id), "remove {id:#x}"),
                _ => {
                    assert_eq!(t.get(&id), m.get(&id), "get {id:#x}");
                    if let (Some(a), Some(b)) = (t.get_mut(&id), m.get_mut(&id)) {
                        *a += 1;
                        *b += 1;
                    }
                }
            }
            assert_eq!(t.len(), m.len());
            assert_eq!(t.contains_key(&id), m.contains_key(&id));
        }
        let mut a: Vec<_> = t.iter().map(|(k, v)| (*k, *v)).collect();
        let mut b: Vec<_> = m.iter().map(|(k, v)| (*k, *v)).collect();
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b);
        assert!(t.direct.len() <= DIRECT_MAX);
    }

    #[test]
    fn a_second_id_with_the_same_low_bits_goes_to_the_map() {
        let mut t = OpTable::default();
        t.insert(1 << 32 | 5, "a");
        t.insert(2 << 32 | 5, "b");
        assert_eq!(
            (t.get(&(1 << 32 | 5)), t.get(&(2 << 32 | 5))),
            (Some(&"a"), Some(&"b"))
        );
        assert_eq!(t.other.len(), 1);
        assert_eq!(t.remove(&(1 << 32 | 5)), Some("a"));
        // The slot is free again; the other id still lives in the map and is found there.
        assert_eq!(t.get(&(2 << 32 | 5)), Some(&"b"));
        t.insert(2 << 32 | 5, "c");
        assert_eq!((t.get(&(2 << 32 | 5)), t.len()), (Some(&"c"), 1));
        assert_eq!(t.remove(&(2 << 32 | 5)), Some("c"));
        assert_eq!((t.len(), t.get(&5)), (0, None));
        assert_eq!(t.remove(&5), None);
    }
}
