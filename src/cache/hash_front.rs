//! Exact-start hash in front of the ordered index: the common "same buffer again" request finds its
//! region in one probe instead of a B-tree descent (which costs several cache misses at 10^5
//! regions).
//!
//! Open addressing, linear probing, backward-shift deletion (no tombstones, so probe chains stay
//! short forever). Mutated only by the writer while readers are excluded; read concurrently by
//! readers through `&self`.
//!
//! Memory: 16 bytes per slot, at most 50 % load, so 32-64 bytes per region.

use std::ptr::NonNull;

use super::region::Region;

const EMPTY: usize = usize::MAX; // never a page-aligned region start

#[derive(Clone, Copy)]
struct Slot {
    key: usize,
    val: *const Region,
}

pub struct HashFront {
    slots: Box<[Slot]>,
    mask: usize,
    len: usize,
}

#[inline]
fn hash(key: usize) -> usize {
    // Fibonacci hashing of the page number: spreads consecutive pages over the table.
    ((key >> 12) as u64)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .rotate_left(32) as usize
}

impl HashFront {
    pub fn new() -> Self {
        Self::with_capacity(16)
    }

    fn with_capacity(cap: usize) -> Self {
        let cap = cap.next_power_of_two();
        HashFront {
            slots: vec![
                Slot {
                    key: EMPTY,
                    val: std::ptr::null()
                };
                cap
            ]
            .into_boxed_slice(),
            mask: cap - 1,
            len: 0,
        }
    }

    #[inline]
    pub fn get(&self, key: usize) -> Option<NonNull<Region>> {
        let mut i = hash(key) & self.mask;
        loop {
            let s = self.slots[i];
            if s.key == key {
                return NonNull::new(s.val as *mut Region);
            }
            if s.key == EMPTY {
                return None;
            }
            i = (i + 1) & self.mask;
        }
    }

    pub fn insert(&mut self, key: usize, val: NonNull<Region>) {
        debug_assert!(key != EMPTY);
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let mut i = hash(key) & self.mask;
        loop {
            let s = &mut self.slots[i];
            if s.key == EMPTY || s.key == key {
                if s.key == EMPTY {
                    self.len += 1;
                }
                *s = Slot {
                    key,
                    val: val.as_ptr(),
                };
                return;
            }
            i = (i + 1) & self.mask;
        }
    }

    pub fn remove(&mut self, key: usize) {
        let mut i = hash(key) & self.mask;
        loop {
            if self.slots[i].key == EMPTY {
                return;
            }
            if self.slots[i].key == key {
                break;
            }
            i = (i + 1) & self.mask;
        }
        // Backward shift: pull later members of the probe chain into the hole.
        let mut hole = i;
        let mut j = (i + 1) & self.mask;
        loop {
            let s = self.slots[j];
            if s.key == EMPTY {
                break;
            }
            let home = hash(s.key) & self.mask;
            // Move `s` into the hole if its home is not cyclically in (hole, j].
            let dist_home = j.wrapping_sub(home) & self.mask;
            let dist_hole = j.wrapping_sub(hole) & self.mask;
            if dist_home >= dist_hole {
                self.slots[hole] = s;
                hole = j;
            }
            j = (j + 1) & self.mask;
        }
        self.slots[hole] = Slot {
            key: EMPTY,
            val: std::ptr::null(),
        };
        self.len -= 1;
    }

    fn grow(&mut self) {
        let old = std::mem::replace(self, Self::with_capacity(self.slots.len() * 2));
        for s in old.slots.iter().filter(|s| s.key != EMPTY) {
            self.insert(s.key, NonNull::new(s.val as *mut Region).expect("non-null"));
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
        let mut m: HashMap<usize, usize> = HashMap::new();
        let mut x: u64 = 12345;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = ((x % 512) as usize) << 12;
            let fake = NonNull::new((key + 64) as *mut Region).unwrap();
            if x & 1 == 0 {
                h.insert(key, fake);
                m.insert(key, key + 64);
            } else {
                h.remove(key);
                m.remove(&key);
            }
            assert_eq!(h.len, m.len());
        }
        for k in 0..512usize {
            let key = k << 12;
            assert_eq!(
                h.get(key).map(|p| p.as_ptr() as usize),
                m.get(&key).copied()
            );
        }
    }
}
