//! Exact-start hash in front of the ordered index: the common "same buffer again" request finds its
//! region in one probe instead of a sorted-index descent.
//!
//! Open addressing, linear probing, backward-shift deletion (no tombstones, so probe chains stay
//! short forever). A slot is 4 bytes: `tag << 22 | (id + 1)` (0 = empty), where the 10-bit tag
//! comes from the key's hash, so a probe past a foreign entry rarely dereferences its region; the
//! key itself (the region start) is read from the region record. At most 7/8 load, so 4.6-9 bytes
//! per region. Mutated only by the writer while readers are excluded; read concurrently by readers
//! through `&self`.
//!
//! The table is allocated in 64-byte aligned lines: the smallest table (16 slots) is one cache line
//! rather than two halves of neighbouring ones, and a probe sequence crosses a line boundary only
//! where the table does.

const ID_BITS: u32 = 22;
const ID_MASK: u32 = (1 << ID_BITS) - 1;

/// Sixteen slots, one cache line.
#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
struct Line([u32; LINE]);

const LINE: usize = 16;
const _: () = assert!(std::mem::size_of::<Line>() == LINE * 4);

pub(super) struct HashFront {
    /// `mask + 1` slots, read and written through `slot` / `slot_mut`.
    lines: Box<[Line]>,
    mask: usize,
    len: usize,
}

#[inline]
fn hash(key: usize) -> u64 {
    // Fibonacci hashing of the page number: spreads consecutive pages over the table.
    ((key >> 12) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

#[inline]
fn home(h: u64, mask: usize) -> usize {
    (h >> 20) as usize & mask
}

#[inline]
fn tag(h: u64) -> u32 {
    (h >> 54) as u32 // top 10 bits (independent of the home bits for tables < 2^34 slots)
}

impl HashFront {
    pub(super) fn new() -> Self {
        Self::with_capacity(16)
    }

    fn with_capacity(cap: usize) -> Self {
        let cap = cap.next_power_of_two().max(LINE);
        HashFront {
            lines: vec![Line::default(); cap / LINE].into_boxed_slice(),
            mask: cap - 1,
            len: 0,
        }
    }

    /// Slot `i & mask`.
    #[inline(always)]
    fn slot(&self, i: usize) -> u32 {
        // SAFETY: `lines` holds `mask + 1` u32s back to back (a `Line` is 16 u32s without padding,
        // and a slice of lines has no gaps), and `i & mask` is below that; the pointer comes from
        // the slice itself, so it may read all of them.
        unsafe { *(self.lines.as_ptr() as *const u32).add(i & self.mask) }
    }

    #[inline]
    fn slot_mut(&mut self, i: usize) -> &mut u32 {
        // SAFETY: as in `slot`, through the slice's mutable pointer (`&mut self`: no other reference).
        unsafe { &mut *(self.lines.as_mut_ptr() as *mut u32).add(i & self.mask) }
    }

    fn capacity(&self) -> usize {
        self.mask + 1
    }

    /// The entry whose key is `key`: `probe(id)` resolves a candidate id to its value if that
    /// value's key is `key` (so the hit path reads each candidate's record once).
    #[inline]
    pub(super) fn get<T>(&self, key: usize, probe: impl Fn(u32) -> Option<T>) -> Option<T> {
        let h = hash(key);
        let t = tag(h);
        let mut i = home(h, self.mask);
        loop {
            let s = self.slot(i);
            if s == 0 {
                return None;
            }
            if s >> ID_BITS == t {
                if let Some(v) = probe((s & ID_MASK) - 1) {
                    return Some(v);
                }
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Insert `id` under `key` (keys are unique: the index is non-overlapping). `id < 2^22 - 1`.
    pub(super) fn insert(&mut self, key: usize, id: u32, key_of: impl Fn(u32) -> usize) {
        debug_assert!(id < ID_MASK);
        if (self.len + 1) * 8 > self.capacity() * 7 {
            self.grow(&key_of);
        }
        self.place(key, id);
        self.len += 1;
    }

    fn place(&mut self, key: usize, id: u32) {
        let h = hash(key);
        let mut i = home(h, self.mask);
        while self.slot(i) != 0 {
            i = (i + 1) & self.mask;
        }
        *self.slot_mut(i) = tag(h) << ID_BITS | (id + 1);
    }

    pub(super) fn remove(&mut self, key: usize, key_of: impl Fn(u32) -> usize) {
        let Some(mut hole) = self.find_slot(key, &key_of) else {
            return;
        };
        // Backward shift: pull later members of the probe chain into the hole.
        let mut j = (hole + 1) & self.mask;
        loop {
            let s = self.slot(j);
            if s == 0 {
                break;
            }
            let h = home(hash(key_of((s & ID_MASK) - 1)), self.mask);
            // Move `s` into the hole if its home is not cyclically in (hole, j].
            let dist_home = j.wrapping_sub(h) & self.mask;
            let dist_hole = j.wrapping_sub(hole) & self.mask;
            if dist_home >= dist_hole {
                *self.slot_mut(hole) = s;
                hole = j;
            }
            j = (j + 1) & self.mask;
        }
        *self.slot_mut(hole) = 0;
        self.len -= 1;
    }

    fn find_slot(&self, key: usize, key_of: &impl Fn(u32) -> usize) -> Option<usize> {
        let h = hash(key);
        let t = tag(h);
        let mut i = home(h, self.mask);
        loop {
            let s = self.slot(i);
            if s == 0 {
                return None;
            }
            if s >> ID_BITS == t && key_of((s & ID_MASK) - 1) == key {
                return Some(i);
            }
            i = (i + 1) & self.mask;
        }
    }

    fn grow(&mut self, key_of: &impl Fn(u32) -> usize) {
        let old = std::mem::replace(self, Self::with_capacity(self.capacity() * 2));
        self.len = old.len;
        for s in old.lines.iter().flat_map(|l| l.0).filter(|&s| s != 0) {
            let id = (s & ID_MASK) - 1;
            self.place(key_of(id), id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn matches_a_hashmap_under_churn() {
        let mut h = HashFront::new();
        let mut m: HashMap<usize, u32> = HashMap::new();
        // id k always has key k << 12 (the table reads keys back through `key_of`).
        let key_of = |id: u32| (id as usize) << 12;
        let mut rng = fastrand::Rng::with_seed(12345);
        for _ in 0..20_000 {
            let x = rng.u64(..);
            let id = (x % 512) as u32;
            let key = key_of(id);
            if x & 1 == 0 {
                if let std::collections::hash_map::Entry::Vacant(e) = m.entry(key) {
                    h.insert(key, id, key_of);
                    e.insert(id);
                }
            } else {
                h.remove(key, key_of);
                m.remove(&key);
            }
            assert_eq!(h.len, m.len());
        }
        for id in 0..600u32 {
            let key = key_of(id);
            let found = h.get(key, |c| (key_of(c) == key).then_some(c));
            assert_eq!(found, m.get(&key).copied());
        }
    }

    /// The table starts as one aligned line and stays aligned, and every slot of it is usable
    /// (growth keeps every entry, probes wrap around the end of the last line).
    #[test]
    fn lines_are_aligned_and_fully_used() {
        let key_of = |id: u32| (id as usize) << 12;
        let mut h = HashFront::new();
        assert_eq!(h.capacity(), LINE);
        assert_eq!(h.lines.as_ptr() as usize % 64, 0);
        for id in 0..14u32 {
            h.insert(key_of(id), id, key_of);
        }
        assert_eq!(h.capacity(), LINE, "7/8 of one line before growing");
        for id in 14..3000u32 {
            h.insert(key_of(id), id, key_of);
            assert_eq!(h.lines.as_ptr() as usize % 64, 0);
        }
        assert_eq!(h.lines.len() * LINE, h.capacity());
        let used = h.lines.iter().flat_map(|l| l.0).filter(|&s| s != 0).count();
        assert_eq!(used, 3000);
        for id in (0..3000u32).step_by(2) {
            h.remove(key_of(id), key_of);
        }
        for id in 0..3000u32 {
            let key = key_of(id);
            let want = (id % 2 == 1).then_some(id);
            assert_eq!(h.get(key, |c| (key_of(c) == key).then_some(c)), want);
        }
    }
}
