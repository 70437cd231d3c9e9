//! `Slab`: the operation tables' storage. A key names a slot and the generation it was filled
//! in, so a lookup is an index and a compare, not a hash probe (the tables are touched several
//! times per put on the hit path), and a spent or made-up key finds nothing: a key of a slot
//! refilled since carries an older generation. Keys are never 0 (0 is "no handle" in C);
//! generations wrap after 2^32 reuses of one slot.

/// A key: generation (high 32 bits, never 0) and slot index (low 32 bits).
pub(super) type Key = u64;

#[derive(Debug)]
struct Slot<T> {
    gen: u32,
    val: Option<T>,
}

#[derive(Debug)]
pub(super) struct Slab<T> {
    slots: Vec<Slot<T>>,
    /// Empty slots, reused last-freed first (warm in the cache).
    free: Vec<u32>,
    len: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            slots: Vec::new(),
            free: Vec::new(),
            len: 0,
        }
    }
}

fn split(key: Key) -> (u32, usize) {
    ((key >> 32) as u32, key as u32 as usize)
}

impl<T> Slab<T> {
    /// The key the next `insert` returns.
    #[cfg(test)]
    pub(super) fn next_key(&self) -> Key {
        let (gen, idx) = match self.free.last() {
            Some(&i) => (self.slots[i as usize].gen, i),
            None => (1, self.slots.len() as u32),
        };
        (u64::from(gen) << 32) | u64::from(idx)
    }

    /// Stores `val`; its key.
    #[inline]
    pub(super) fn insert(&mut self, val: T) -> Key {
        self.len += 1;
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                // Indices stay below bit 30 (`ops::OWN` and `ops::FAST` mark op ids and RDMA
                // tokens with bits 31 and 30).
                let i = u32::try_from(self.slots.len())
                    .ok()
                    .filter(|&i| i < 1 << 30)
                    .expect("2^30 live operations");
                self.slots.push(Slot { gen: 1, val: None });
                i
            }
        };
        let s = &mut self.slots[idx as usize];
        debug_assert!(s.val.is_none());
        s.val = Some(val);
        (u64::from(s.gen) << 32) | u64::from(idx)
    }

    #[inline]
    fn slot(&self, key: Key) -> Option<&Slot<T>> {
        let (gen, idx) = split(key);
        self.slots.get(idx).filter(|s| s.gen == gen)
    }

    #[inline]
    pub(super) fn get(&self, key: Key) -> Option<&T> {
        self.slot(key)?.val.as_ref()
    }

    #[inline]
    pub(super) fn get_mut(&mut self, key: Key) -> Option<&mut T> {
        let (gen, idx) = split(key);
        self.slots
            .get_mut(idx)
            .filter(|s| s.gen == gen)?
            .val
            .as_mut()
    }

    /// Gives the value of `key`, if `keep` accepts it, a new key of the same slot (`key` and every
    /// earlier key of the slot are spent), as a `remove` and an `insert` would, without the free
    /// list; else `insert(new())`. The key, the value, and whether it was inserted. One lookup.
    #[inline(always)]
    pub(super) fn renew_or_insert(
        &mut self,
        key: Key,
        keep: impl FnOnce(&T) -> bool,
        new: impl FnOnce() -> T,
    ) -> (Key, &mut T, bool) {
        let (gen, idx) = split(key);
        let renew = matches!(self.slots.get(idx), Some(s) if s.gen == gen && s.val.as_ref().is_some_and(keep));
        if !renew {
            return self.insert_new(new());
        }
        // The slot checked above, its value kept.
        let s = &mut self.slots[idx];
        s.gen = s.gen.wrapping_add(1).max(1);
        let key = (u64::from(s.gen) << 32) | idx as u64;
        match &mut s.val {
            Some(v) => (key, v, false),
            None => unreachable!("checked above"),
        }
    }

    /// `renew_or_insert`'s insert (out of line: a blocking op renews).
    #[inline(never)]
    fn insert_new(&mut self, val: T) -> (Key, &mut T, bool) {
        let key = self.insert(val);
        let v = self.slots[key as u32 as usize]
            .val
            .as_mut()
            .expect("filled");
        (key, v, true)
    }

    /// Takes the value out; the key (and every earlier key of the slot) is spent.
    #[inline]
    pub(super) fn remove(&mut self, key: Key) -> Option<T> {
        let (gen, idx) = split(key);
        let s = self.slots.get_mut(idx).filter(|s| s.gen == gen)?;
        let v = s.val.take()?;
        s.gen = s.gen.wrapping_add(1).max(1);
        self.free.push(idx as u32);
        self.len -= 1;
        Some(v)
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().filter_map(|s| s.val.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_never_zero_and_spent_keys_find_nothing() {
        let mut s = Slab::default();
        let a = s.insert("a");
        let b = s.insert("b");
        assert!(a != 0 && b != 0 && a != b);
        assert_eq!((s.get(a), s.get(b), s.len()), (Some(&"a"), Some(&"b"), 2));
        assert_eq!(s.remove(a), Some("a"));
        assert_eq!(s.get(a), None);
        assert_eq!((s.remove(a), s.len()), (None, 1));
        // The slot is reused under a new generation: the old key still finds nothing.
        let c = s.insert("c");
        assert_eq!(c as u32, a as u32, "slot reused");
        assert_ne!(c, a);
        assert_eq!((s.get(a), s.get(c)), (None, Some(&"c")));
        *s.get_mut(c).unwrap() = "d";
        let next = s.next_key();
        assert_eq!(s.insert("e"), next);
        let (renewed, v, fresh) = s.renew_or_insert(next, |_| true, || "x");
        assert_eq!((*v, fresh), ("e", false));
        assert_ne!(renewed, next);
        assert_eq!((s.get(next), s.get(renewed)), (None, Some(&"e")));
        let (k, v, fresh) = s.renew_or_insert(renewed, |v| *v == "x", || "f");
        assert_eq!((*v, fresh), ("f", true), "refused: inserted");
        assert_eq!(s.get(renewed), Some(&"e"), "the refused one is left alone");
        assert_eq!(s.remove(k), Some("f"));
        let (k, v, fresh) = s.renew_or_insert(next, |_| true, || "g");
        assert_eq!((*v, fresh), ("g", true), "spent: inserted");
        assert_eq!(s.remove(k), Some("g"));
        assert_eq!(s.remove(renewed), Some("e"));
        let (k, _, fresh) = s.renew_or_insert(renewed, |_| true, || "h");
        assert!(fresh, "empty: inserted");
        assert_eq!(s.remove(k), Some("h"));
        let next = s.next_key();
        assert_eq!(s.insert("e"), next, "a reused slot");
        assert_eq!(s.remove(next), Some("e"));
        assert_eq!(s.values().copied().collect::<Vec<_>>(), vec!["d", "b"]);
        // Made-up keys: 0, out of range, wrong generation.
        for k in [0, u64::MAX, 7 << 32, (99 << 32) | 1] {
            assert_eq!(s.get(k), None, "{k:#x}");
            assert_eq!(s.get_mut(k), None);
            assert_eq!(s.remove(k), None);
        }
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn generations_skip_zero_when_they_wrap() {
        let mut s = Slab::default();
        let k = s.insert(1);
        s.slots[0].gen = u32::MAX;
        let k2 = (u64::from(u32::MAX) << 32) | (k & 0xffff_ffff);
        assert_eq!(s.remove(k2), Some(1));
        let k3 = s.insert(2);
        assert_eq!(k3 >> 32, 1, "generation 0 is skipped");
    }
}
