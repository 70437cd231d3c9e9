//! Generation-checked handles: `handle = generation << 32 | (record index + 1)`.
//!
//! A record holds the acquired region and a generation that is odd while the handle is live.
//! Release CASes the generation from the handle's value to the next one, so a double release (even
//! two racing ones) and a made-up handle are both detected (`None`). Records live in fixed chunks
//! that never move (a lock-free reader may be looking at one while another chunk is added), and
//! free record indices sit in per-thread-slot free lists, so the hit path touches no shared
//! allocator line. The free lists are intrusive (a free record holds the index of the next free
//! one), so taking and returning a record touches only the record and the list head. Generations are 32 bits: a handle kept across 2^31 reuses of its record could be
//! mistaken for a live one (documented limit).

use crossbeam_utils::CachePadded;
use std::cell::UnsafeCell;
use std::ptr::{null_mut, NonNull};
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};
use std::sync::Mutex;

use super::readers::SLOTS;
use super::region::Region;

const CHUNK_BITS: u32 = 12;
const CHUNK: usize = 1 << CHUNK_BITS;
const MAX_CHUNKS: usize = 1024; // 4 Mi live handles
const BATCH: u32 = 64; // records taken from the global pool at a time

/// End of a free list.
const NIL: u32 = u32::MAX;

struct Record {
    gen: AtomicU32,
    /// While free (even generation): the next record of the free list it is on. Written and read
    /// only by the owner of that list.
    next: AtomicU32,
    region: AtomicPtr<Region>,
}

impl Default for Record {
    fn default() -> Self {
        Record {
            gen: AtomicU32::new(0),
            next: AtomicU32::new(NIL),
            region: AtomicPtr::new(null_mut()),
        }
    }
}

/// Head of one slot's free list, padded against false sharing with its neighbours.
type FreeList = CachePadded<UnsafeCell<u32>>;

pub(super) struct Handles {
    chunks: Box<[AtomicPtr<Record>; MAX_CHUNKS]>,
    next: AtomicU32,
    grow: Mutex<()>,
    /// Per exclusive slot; index 0 (shared slot) is unused, `shared` below is used instead.
    local: Box<[FreeList; SLOTS]>,
    shared: Mutex<u32>,
}

// SAFETY: `local[i]` is only touched by the thread that currently owns slot id `i` (ids are handed
// out exclusively by `readers`, with a mutex between owners); everything else is atomic or locked.
unsafe impl Sync for Handles {}

impl Handles {
    pub(super) fn new() -> Self {
        Handles {
            chunks: Box::new([const { AtomicPtr::new(null_mut()) }; MAX_CHUNKS]),
            next: AtomicU32::new(0),
            grow: Mutex::new(()),
            local: Box::new(std::array::from_fn(|_| {
                CachePadded::new(UnsafeCell::new(NIL))
            })),
            shared: Mutex::new(NIL),
        }
    }

    #[inline]
    fn record(&self, idx: u32) -> Option<&Record> {
        let c = self.chunks.get((idx >> CHUNK_BITS) as usize)?;
        let base = c.load(Ordering::Acquire);
        if base.is_null() {
            return None;
        }
        // SAFETY: a non-null chunk pointer points at CHUNK records that live until `self` drops.
        Some(unsafe { &*base.add(idx as usize & (CHUNK - 1)) })
    }

    /// The record of an index this table handed out (its chunk exists).
    #[inline(always)]
    fn own_record(&self, idx: u32) -> &Record {
        let base =
            self.chunks[(idx >> CHUNK_BITS) as usize & (MAX_CHUNKS - 1)].load(Ordering::Acquire);
        debug_assert!(!base.is_null());
        // SAFETY: indices on free lists come from `refill`, which allocated their chunk first;
        // chunks live until `self` drops.
        unsafe { &*base.add(idx as usize & (CHUNK - 1)) }
    }

    // Inlined into the hit path (a call here cost ~25 instructions per op); the shared slot's
    // locked list stays out of line.
    #[inline(always)]
    fn with_free<R>(&self, slot: usize, f: impl FnOnce(&mut u32) -> R) -> R {
        if slot == 0 {
            self.with_shared(f)
        } else {
            // SAFETY: only the owner thread of slot `slot` gets here with this index, and it does
            // not re-enter (nothing inside `f` calls back into the handle table).
            f(unsafe { &mut *self.local[slot & (SLOTS - 1)].get() })
        }
    }

    #[cold]
    #[inline(never)]
    fn with_shared<R>(&self, f: impl FnOnce(&mut u32) -> R) -> R {
        f(&mut self.shared.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Issue a handle for `region`. `None` when 4 Mi handles are live at once.
    #[inline]
    pub(super) fn acquire(&self, slot: usize, region: NonNull<Region>) -> Option<u64> {
        let popped = self.with_free(slot, |head| {
            let idx = *head;
            if idx == NIL {
                return None;
            }
            let rec = self.own_record(idx);
            *head = rec.next.load(Ordering::Relaxed);
            Some((idx, rec))
        });
        let (idx, rec) = match popped {
            Some(p) => p,
            None => self.refill(slot)?,
        };
        let gen = rec.gen.load(Ordering::Relaxed).wrapping_add(1); // even -> odd: live
        rec.region.store(region.as_ptr(), Ordering::Relaxed);
        rec.gen.store(gen, Ordering::Release);
        Some(((gen as u64) << 32) | (idx as u64 + 1))
    }

    /// Take BATCH fresh records: return the first, put the rest on `slot`'s (empty) list.
    #[cold]
    fn refill(&self, slot: usize) -> Option<(u32, &Record)> {
        let base = self.next.fetch_add(BATCH, Ordering::Relaxed);
        if base as usize + BATCH as usize > CHUNK * MAX_CHUNKS {
            self.next.fetch_sub(BATCH, Ordering::Relaxed);
            return None;
        }
        let c = &self.chunks[(base >> CHUNK_BITS) as usize];
        if c.load(Ordering::Acquire).is_null() {
            let _g = self.grow.lock().unwrap_or_else(|e| e.into_inner());
            if c.load(Ordering::Acquire).is_null() {
                let chunk: Box<[Record]> = (0..CHUNK).map(|_| Record::default()).collect();
                c.store(Box::into_raw(chunk) as *mut Record, Ordering::Release);
            }
        }
        for i in base + 1..base + BATCH - 1 {
            self.own_record(i).next.store(i + 1, Ordering::Relaxed);
        }
        self.with_free(slot, |head| {
            // Another thread may have used the shared list meanwhile: chain its rest behind ours.
            self.own_record(base + BATCH - 1)
                .next
                .store(*head, Ordering::Relaxed);
            *head = base + 1;
        });
        Some((base, self.own_record(base)))
    }

    /// A handle's record index and generation, if it has the shape of a live one (odd
    /// generation, index + 1 in the low half).
    #[inline]
    fn decode(handle: u64) -> Option<(u32, u32)> {
        let low = handle as u32;
        let gen = (handle >> 32) as u32;
        if low == 0 || gen & 1 == 0 {
            return None;
        }
        Some((low - 1, gen))
    }

    /// Retire `handle`; returns its region, or `None` if the handle is not live.
    #[inline]
    pub(super) fn release(&self, slot: usize, handle: u64) -> Option<NonNull<Region>> {
        let (idx, gen) = Self::decode(handle)?;
        let rec = self.record(idx)?;
        rec.gen
            .compare_exchange(
                gen,
                gen.wrapping_add(1),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .ok()?;
        // The record cannot be reissued before we put it back on a free list below.
        let region = NonNull::new(rec.region.load(Ordering::Relaxed));
        self.with_free(slot, |head| {
            rec.next.store(*head, Ordering::Relaxed);
            *head = idx;
        });
        region
    }

    /// Whether `handle` was issued and not yet released. Any value is fine (made up: false).
    pub(super) fn is_live(&self, handle: u64) -> bool {
        Self::decode(handle).is_some_and(|(idx, gen)| {
            self.record(idx)
                .is_some_and(|r| r.gen.load(Ordering::Acquire) == gen)
        })
    }

    /// Regions of every live handle (used by the cache's Drop; exclusive access).
    pub(super) fn live_regions(&mut self) -> Vec<NonNull<Region>> {
        let n = self.next.load(Ordering::Relaxed);
        (0..n)
            .filter_map(|i| self.record(i))
            .filter(|r| r.gen.load(Ordering::Relaxed) & 1 == 1)
            .filter_map(|r| NonNull::new(r.region.load(Ordering::Relaxed)))
            .collect()
    }
}

impl Drop for Handles {
    fn drop(&mut self) {
        for c in self.chunks.iter() {
            let p = c.load(Ordering::Acquire);
            if !p.is_null() {
                // SAFETY: allocated in `refill` as a boxed slice of CHUNK records.
                drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, CHUNK)) });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(n: usize) -> NonNull<Region> {
        NonNull::new((n * 64) as *mut Region).unwrap()
    }

    #[test]
    fn double_and_bogus_release_are_detected() {
        let h = Handles::new();
        let a = h.acquire(1, fake(1)).unwrap();
        let b = h.acquire(1, fake(2)).unwrap();
        assert_ne!(a, b);
        assert_eq!(h.release(1, a), Some(fake(1)));
        assert_eq!(h.release(1, a), None, "double release");
        assert_eq!(h.release(1, 0), None);
        assert_eq!(h.release(1, u64::MAX), None);
        assert_eq!(h.release(1, b ^ (1 << 33)), None, "wrong generation");
        // Record reuse gets a new generation: the stale handle stays dead.
        let c = h.acquire(1, fake(3)).unwrap();
        assert_ne!(c, a);
        assert_eq!(h.release(1, a), None);
        assert_eq!(h.release(2, c), Some(fake(3)), "release from another slot");
        assert_eq!(h.release(1, b), Some(fake(2)));
    }

    #[test]
    fn is_live_until_released_and_never_for_made_up_or_reused_handles() {
        let h = Handles::new();
        let a = h.acquire(1, fake(1)).unwrap();
        assert!(h.is_live(a));
        for bogus in [
            0,
            u64::MAX,
            a ^ (1 << 32),
            a ^ (1 << 33),
            a + 5000,
            (a as u32) as u64,
        ] {
            assert!(!h.is_live(bogus), "{bogus:#x}");
        }
        assert!(h.release(1, a).is_some());
        assert!(!h.is_live(a), "released");
        let b = h.acquire(1, fake(2)).unwrap();
        assert_eq!(b as u32, a as u32, "the record is reused");
        assert!(
            h.is_live(b) && !h.is_live(a),
            "a new generation: the old handle stays dead"
        );
    }

    #[test]
    fn free_lists_hand_out_each_record_once() {
        let h = Handles::new();
        let live_idx = |hs: &[u64]| {
            let mut v: Vec<u32> = hs.iter().map(|&x| x as u32).collect();
            v.sort_unstable();
            v.dedup();
            v.len()
        };
        // Several refills on slot 1, released through slot 2 and the shared slot, then taken
        // again from all three lists at once: every live handle must own a distinct record.
        let first: Vec<u64> = (0..1000)
            .map(|i| h.acquire(1, fake(i + 1)).unwrap())
            .collect();
        assert_eq!(live_idx(&first), 1000);
        for (i, &x) in first.iter().enumerate() {
            assert!(h.release(if i % 3 == 0 { 0 } else { 2 }, x).is_some());
        }
        let again: Vec<u64> = (0..3000)
            .map(|i| h.acquire(i % 3, fake(i + 1)).unwrap())
            .collect();
        assert_eq!(live_idx(&again), 3000, "a record was handed out twice");
        for (i, &x) in again.iter().enumerate() {
            assert_eq!(h.release(2, x), Some(fake(i + 1)));
        }
    }

    #[test]
    fn racing_double_release_succeeds_once() {
        let h = std::sync::Arc::new(Handles::new());
        for round in 0..200 {
            let x = h.acquire(0, fake(round + 1)).unwrap();
            let wins: usize = (0..2)
                .map(|t| {
                    let h = h.clone();
                    std::thread::spawn(move || h.release(t * 3, x).is_some() as usize)
                })
                .map(|j| j.join().unwrap())
                .sum();
            assert_eq!(wins, 1);
        }
    }
}
