//! Per-thread reader indicators (a "big reader" scheme) plus per-thread hit counters.
//!
//! Each thread gets a small id from a global pool (1..SLOTS, returned at thread exit). Id 0 is the
//! shared slot: used by threads beyond the pool, during thread teardown, and by memory hooks
//! (which may run on a thread that is inside the cache, and must not allocate). Every cache has one
//! cache-line-padded slot per id, so a reader only writes its own line. Reader counts are always
//! atomic read-modify-writes (the shared slot really is shared); the statistics counters of an
//! exclusively owned slot are updated with a plain load + store (no lock prefix), because only the
//! owning thread writes them.

use std::cell::Cell;
use std::sync::atomic::{compiler_fence, AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::rt::fork::{self, ForkHook, HeldAcrossFork};

/// Number of reader slots per cache (including the shared slot 0).
pub(super) const SLOTS: usize = 128;
// `my_slot` masks ids with `SLOTS - 1` so indexing per-slot arrays needs no bounds check.
const _: () = assert!(SLOTS.is_power_of_two());
const NO_ID: u32 = 0;
const SHARED_FOREVER: u32 = u32::MAX;

/// The id pool. Filled on first use under its own lock (not with a `Once`: a child forked while
/// another thread was inside a `Once` would wait for that thread forever). Place 40 of
/// `crate::rt::fork`'s order, held across `fork`; nothing is locked under it.
struct IdPool {
    filled: bool,
    free: Vec<u32>,
}

static FREE_IDS: Mutex<IdPool> = Mutex::new(IdPool {
    filled: false,
    free: Vec::new(),
});

fn free_ids() -> MutexGuard<'static, IdPool> {
    FREE_IDS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Place 40 of `rt::fork`'s order: `FREE_IDS`, held across `fork` (nothing is locked under it).
static FORK_HOOK: ForkHook = ForkHook {
    order: 40,
    prepare: || {
        // SAFETY: this hook's prepare, the lock just taken.
        unsafe { HELD.put(free_ids()) }
    },
    parent: || {
        // SAFETY: this hook's parent.
        drop(unsafe { HELD.take() })
    },
    child: || {
        // SAFETY: this hook's child.
        if let Some(mut g) = unsafe { HELD.take() } {
            fork_child(&mut g);
        }
    },
};
static HELD: HeldAcrossFork<MutexGuard<'static, IdPool>> = HeldAcrossFork::new();

/// In a child of `fork` (one thread, the pool locked by it): the ids of the parent's other
/// threads are free again, since those threads are gone and will never return them. Only this
/// thread's id stays taken. No allocation: the pool was filled with every id once, so its capacity
/// holds them all.
fn fork_child(g: &mut IdPool) {
    if !g.filled || g.free.capacity() < SLOTS - 1 {
        return;
    }
    let mine = MY_ID.try_with(|c| c.get()).unwrap_or(NO_ID);
    g.free.clear();
    g.free
        .extend((1..SLOTS as u32).rev().filter(|&id| id != mine));
}

struct IdGuard;

impl Drop for IdGuard {
    fn drop(&mut self) {
        let id = MY_ID
            .try_with(|c| c.replace(SHARED_FOREVER))
            .unwrap_or(NO_ID);
        if id != NO_ID && id != SHARED_FOREVER {
            if let Ok(mut pool) = FREE_IDS.lock() {
                pool.free.push(id);
            }
        }
    }
}

thread_local! {
    // const-initialised, no destructor: reading it never allocates (safe from hooks).
    static MY_ID: Cell<u32> = const { Cell::new(NO_ID) };
    static ID_GUARD: IdGuard = const { IdGuard };
}

/// This thread's slot, assigning one on first use. Not hook-safe (may allocate once per thread).
#[inline]
pub(super) fn my_slot() -> usize {
    match MY_ID.try_with(|c| c.get()) {
        Ok(NO_ID) => assign(),
        Ok(SHARED_FOREVER) | Err(_) => 0,
        Ok(id) => id as usize & (SLOTS - 1), // ids are < SLOTS: the mask only informs the compiler
    }
}

#[cold]
fn assign() -> usize {
    // Before the lock: registering the atfork handlers must not happen under one of our locks.
    fork::register(&FORK_HOOK);
    let id = {
        let mut pool = free_ids();
        if !pool.filled {
            pool.filled = true;
            pool.free.extend((1..SLOTS as u32).rev());
        }
        pool.free.pop().unwrap_or(SHARED_FOREVER)
    };
    let _ = MY_ID.try_with(|c| c.set(id));
    if id != SHARED_FOREVER && ID_GUARD.try_with(|_| ()).is_err() {
        // Thread is tearing down: give the id back and use the shared slot.
        let _ = MY_ID.try_with(|c| c.set(SHARED_FOREVER));
        free_ids().free.push(id);
        return 0;
    }
    if id == SHARED_FOREVER {
        0
    } else {
        id as usize
    }
}

/// One thread's counters in one cache (`Cache` keeps each in a `CachePadded`: 128 bytes on x86-64,
/// two lines, so adjacent-line prefetch does not couple neighbours).
#[derive(Default)]
pub(super) struct ReaderSlot {
    /// Threads of this slot currently inside a reader section.
    pub readers: AtomicU32,
    /// This slot's id has entered this cache before (see `Cache::join`); owner-written.
    pub joined: AtomicBool,
    /// Hits served by this slot's thread(s).
    pub hits: AtomicU64,
    /// Net regions this slot moved from idle to in use (may be negative: another thread released).
    pub in_use: AtomicI64,
}

impl ReaderSlot {
    /// Enter a reader section. `id` is the caller's slot id (0 = shared slot); `asym` is
    /// `membarrier::available()`. The caller then loads the writer flag.
    #[inline]
    pub(super) fn enter(&self, id: usize, asym: bool) {
        if id == 0 {
            // SeqCst pairs with the writer's SeqCst flag store + count loads (Dekker): either the
            // writer sees us, or we see its flag.
            self.readers.fetch_add(1, Ordering::SeqCst);
        } else if asym {
            // Exclusive slot, asymmetric fence: a plain store; the writer's membarrier supplies
            // the store-load barrier on our CPU. The compiler must not sink the store below the
            // caller's flag load.
            self.readers.store(1, Ordering::Relaxed);
            compiler_fence(Ordering::SeqCst);
        } else {
            // Single writer (the owner thread, which never nests sections: hooks use the shared
            // slot), so a swap suffices.
            self.readers.swap(1, Ordering::SeqCst);
        }
    }

    #[inline]
    pub(super) fn exit(&self, id: usize) {
        if id == 0 {
            self.readers.fetch_sub(1, Ordering::Release);
        } else {
            // Owner-only line: a plain release store, no locked instruction.
            self.readers.store(0, Ordering::Release);
        }
    }

    #[inline]
    pub(super) fn add_hit(&self, id: usize) {
        bump_u64(&self.hits, 1, id);
    }

    #[inline]
    pub(super) fn add_in_use(&self, id: usize, d: i64) {
        if id == 0 {
            self.in_use.fetch_add(d, Ordering::Relaxed);
        } else {
            let v = self.in_use.load(Ordering::Relaxed);
            self.in_use.store(v + d, Ordering::Relaxed);
        }
    }
}

#[inline]
fn bump_u64(c: &AtomicU64, d: u64, id: usize) {
    if id == 0 {
        c.fetch_add(d, Ordering::Relaxed);
    } else {
        // Only the owner of slot `id` writes this counter: a plain store cannot lose updates.
        c.store(c.load(Ordering::Relaxed) + d, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_get_distinct_ids_and_return_them() {
        let main = my_slot();
        assert_ne!(main, 0);
        assert_eq!(my_slot(), main, "stable per thread");
        let ids: Vec<usize> = (0..8)
            .map(|_| std::thread::spawn(my_slot))
            .map(|h| h.join().unwrap())
            .collect();
        assert!(ids.iter().all(|&i| i != 0 && i != main));
        // Ids are recycled at thread exit, so 300 sequential threads never exhaust the pool.
        for _ in 0..300 {
            assert_ne!(std::thread::spawn(my_slot).join().unwrap(), 0);
        }
    }

    /// Slot 0 is shared by every thread beyond the pool's `SLOTS - 1` ids (and by hooks), so its
    /// reader count and counters are read-modify-writes: one thread leaving does not hide another
    /// that is still inside (a writer would mutate the index under it), and hits made at once
    /// are all counted. (`tests/at_the_limit.rs` runs more threads than slots through a cache.)
    #[test]
    fn the_shared_slot_counts_every_reader_and_every_hit() {
        let s = ReaderSlot::default();
        s.enter(0, true);
        s.enter(0, false);
        s.exit(0);
        assert_eq!(
            s.readers.load(Ordering::SeqCst),
            1,
            "one reader left the shared slot: the other is still inside"
        );
        s.exit(0);
        assert_eq!(s.readers.load(Ordering::SeqCst), 0);
        const THREADS: u64 = 4;
        const N: u64 = 1_000_000;
        let s = std::sync::Arc::new(ReaderSlot::default());
        let start = std::sync::Arc::new(std::sync::Barrier::new(THREADS as usize));
        let hs: Vec<_> = (0..THREADS)
            .map(|_| {
                let (s, start) = (s.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    for _ in 0..N {
                        // (black_box: one update per call, not one folded per loop)
                        let s = std::hint::black_box(&*s);
                        s.add_hit(std::hint::black_box(0));
                        s.add_in_use(std::hint::black_box(0), 1);
                        s.add_in_use(std::hint::black_box(0), -1);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(s.hits.load(Ordering::SeqCst), THREADS * N, "hits lost");
        assert_eq!(s.in_use.load(Ordering::SeqCst), 0, "in-use updates lost");
    }

    /// fork while another thread holds the pool's lock: the prepare handler waits for it, so the
    /// child finds the pool unlocked, and every id but the forking thread's is free again (the
    /// threads that held them do not exist in the child).
    #[test]
    fn fork_never_leaves_the_pool_locked_and_frees_the_ids_of_threads_that_are_gone() {
        let mine = my_slot() as u32; // registers the atfork handlers
        assert_ne!(mine, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        let holder = std::thread::spawn(move || {
            let _ = my_slot();
            let g = free_ids();
            tx.send(()).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(200));
            drop(g);
        });
        rx.recv().unwrap();
        // SAFETY: the child only try-locks a mutex, reads it and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let code = match FREE_IDS.try_lock() {
                Ok(p) if p.free.len() == SLOTS - 2 && !p.free.contains(&mine) => 0,
                Ok(_) => 2,
                Err(_) => 1, // inherited locked
            };
            // SAFETY: leave without running the test harness in the child.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: our child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        holder.join().unwrap();
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "child: {} (1 = pool inherited locked, 2 = ids of gone threads not free)",
            libc::WEXITSTATUS(status)
        );
    }
}
