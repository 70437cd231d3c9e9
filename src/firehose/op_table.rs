//! `OpTable`: the initiator's unfinished ops by id, touched several times per op on the hit path
//! (`acquire` checks the id is new and inserts, `release` finds and removes).
//!
//! Op ids are the driver's, any `u64` unique among its unfinished ops. An id sits in a small
//! vector at its low bits (`id % SLOTS`): a lookup is an index and a compare of the whole id, no
//! hash. That suits both kinds of driver: `crate::rma` uses slab keys (a small slot index in the
//! low bits, a generation above), a simple driver counts ids up (consecutive ids take
//! consecutive slots, reused every `SLOTS` ids, so the vector stays small and warm). An id whose
//! slot holds another live id goes to a hash map, looked into only when it is not empty. Same
//! contract as a map: an id is in at most one of the two places, `insert` replaces.

use super::small::IntMap;
use super::OpId;

/// Slots of the vector (a power of two). It grows to the highest slot used: a few for a slab
/// driver with a few ops in flight, all of them (about 24 KiB with the initiator's ops) for one
/// that counts ids up. A driver with more than this many ops in flight still works: the ids
/// whose slot is taken go to the map.
const SLOTS: usize = 256;

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

/// The vector slot of `id`.
#[inline]
fn index(id: OpId) -> usize {
    id as usize & (SLOTS - 1)
}

impl<V> OpTable<V> {
    #[inline]
    pub fn get(&self, id: &OpId) -> Option<&V> {
        if let Some(Some((k, v))) = self.direct.get(index(*id)) {
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
        if let Some(Some((k, v))) = self.direct.get_mut(index(*id)) {
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
        if let Some(slot) = self.direct.get_mut(index(id)) {
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
        let i = index(id);
        if i >= self.direct.len() {
            self.direct.resize_with(i + 1, || None);
        }
        let slot = &mut self.direct[i];
        if slot.is_none() {
            *slot = Some((id, v));
            return;
        }
        self.other.insert(id, v);
    }

    #[inline]
    pub fn remove(&mut self, id: &OpId) -> Option<V> {
        if let Some(slot) = self.direct.get_mut(index(*id)) {
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
                // Counted up: consecutive ids around a wrap of the slots.
                2 => SLOTS as u64 * ((r >> 8) % 3) + (r >> 16) % 5,
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
        assert!(t.direct.len() <= SLOTS);
    }

    /// A driver that counts ids up with a few ops in flight never needs the map, and the
    /// vector stays at `SLOTS` (the hit path's case of fh_core, for one).
    #[test]
    fn counted_up_ids_stay_in_the_vector() {
        let mut t = OpTable::default();
        for id in 1..20_000u64 {
            t.insert(id, id);
            if id > 3 {
                assert_eq!(t.remove(&(id - 3)), Some(id - 3));
            }
            assert!(t.other.is_empty(), "id {id} went to the map");
        }
        assert_eq!((t.len(), t.direct.len()), (3, SLOTS));
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
