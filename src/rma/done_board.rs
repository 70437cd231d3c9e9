//! `DoneBoard`: one word per request slot saying "the request of this key is done", readable
//! without the operation table's lock. A blocking wait spins on its own request's word (and
//! progresses) instead of taking the table's lock on every round, a lock that every completion
//! (of any thread, the progress thread's too) takes as well; it takes the lock once, to collect
//! the result, when its word says done.
//!
//! The word of slot `i` holds the generation of the last request of that slot that finished
//! (`Slab` keys: generation in the high 32 bits, index in the low 32). A reused slot's new key
//! has a newer generation, so a stale word never says "done" for it; nothing is ever reset.
//! Written under the table's lock when a request ends (Release), read by waiters (Acquire).
//! Pages of `PAGE` words are allocated as the table grows (under its lock) and never move or go
//! until the board is dropped: after warm-up a request costs no allocation. Slots beyond
//! `PAGES * PAGE` have no word: a waiter on one falls back to the table (`is_done` says `None`).

use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

use super::slab::Key;

const PAGE: usize = 256;
const PAGES: usize = 4096;

type Page = [AtomicU32; PAGE];

pub(super) struct DoneBoard {
    pages: Box<[AtomicPtr<Page>]>,
}

impl Default for DoneBoard {
    fn default() -> Self {
        DoneBoard {
            pages: (0..PAGES)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
        }
    }
}

impl std::fmt::Debug for DoneBoard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DoneBoard")
    }
}

fn split(key: Key) -> (u32, usize) {
    ((key >> 32) as u32, key as u32 as usize)
}

impl DoneBoard {
    fn word(&self, idx: usize) -> Option<&AtomicU32> {
        let p = self.pages.get(idx / PAGE)?.load(Ordering::Acquire);
        // SAFETY: a non-null page was allocated by `ensure` and lives as long as `self`.
        (!p.is_null()).then(|| unsafe { &(*p)[idx % PAGE] })
    }

    /// Makes sure slot `key`'s word exists (called under the table's lock, when the slot is
    /// filled; allocates only the first time a page is reached).
    pub(super) fn ensure(&self, key: Key) {
        let page = split(key).1 / PAGE;
        let Some(slot) = self.pages.get(page) else {
            return;
        };
        if slot.load(Ordering::Acquire).is_null() {
            let fresh: Box<Page> = Box::new(std::array::from_fn(|_| AtomicU32::new(0)));
            // Only the table's lock holder calls this: no race for the slot.
            slot.store(Box::into_raw(fresh), Ordering::Release);
        }
    }

    /// The request of `key` is done (under the table's lock).
    pub(super) fn set_done(&self, key: Key) {
        let (gen, idx) = split(key);
        if let Some(w) = self.word(idx) {
            w.store(gen, Ordering::Release);
        }
    }

    /// Whether the request of `key` is done: `Some(true)` once `set_done` ran for it, `None`
    /// when its slot has no word (ask the table).
    pub(super) fn is_done(&self, key: Key) -> Option<bool> {
        let (gen, idx) = split(key);
        self.word(idx).map(|w| w.load(Ordering::Acquire) == gen)
    }
}

impl Drop for DoneBoard {
    fn drop(&mut self) {
        for p in self.pages.iter() {
            let p = p.load(Ordering::Acquire);
            if !p.is_null() {
                // SAFETY: allocated by `ensure` with `Box::into_raw`, freed once, here.
                drop(unsafe { Box::from_raw(p) });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_word_says_done_only_for_the_generation_that_finished() {
        let b = DoneBoard::default();
        let k = (1u64 << 32) | 300;
        assert_eq!(b.is_done(k), None, "no page yet");
        b.ensure(k);
        assert_eq!(b.is_done(k), Some(false));
        b.set_done(k);
        assert_eq!(b.is_done(k), Some(true));
        let reused = (2u64 << 32) | 300;
        assert_eq!(b.is_done(reused), Some(false), "the slot's next request");
        let far = (1u64 << 32) | (PAGE * PAGES) as u64;
        b.ensure(far);
        b.set_done(far);
        assert_eq!(b.is_done(far), None, "beyond the board");
    }
}
