//! `DoneBoard`: one word per request slot saying "the request of this key is done, with this
//! result", readable without the operation table's lock. A blocking wait spins on its own
//! request's word (and progresses) instead of taking the table's lock on every round, a lock
//! that every completion (of any thread, the progress thread's too) takes as well; when the word
//! says done, the wait collects the result from the word itself (`collect`, one compare-and-swap
//! that marks it collected, so a result is handed out once) and leaves the table's entry for the
//! next `start` to remove (`Rma`'s reap cell): a blocking op takes the engine lock twice, at
//! its start and at its completion.
//!
//! The word of slot `i` holds the generation of the last request of that slot that finished
//! (`Slab` keys: generation in the high 32 bits, index in the low 32), its result and whether
//! it was collected. A reused slot's new key has a newer generation, so a stale word never says
//! "done" for it; nothing is ever reset. A slot is reused only after its entry left the table,
//! which is after its result was collected (or the request was implicit, with no word). Written
//! under the table's lock when a request ends (Release), read by waiters (Acquire).
//! Pages of `PAGE` words are allocated as the table grows (under its lock) and never move or go
//! until the board is dropped: after warm-up a request costs no allocation. Slots beyond
//! `PAGES * PAGE` have no word: a waiter on one falls back to the table (`is_done` says `None`).

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use super::slab::Key;
use crate::rma::RmaError;

/// Word layout: generation in bits 0..32, result in 32..40 (0: `Ok`, else 1 + the error's
/// discriminant), collected at bit 40.
const RESULT_SHIFT: u32 = 32;
const COLLECTED: u64 = 1 << 40;

/// The errors in discriminant order (`RmaError` is `repr(u8)`, discriminants 0, 1, ...).
const ERRORS: [RmaError; 22] = {
    use RmaError::*;
    [
        Null,
        ZeroLength,
        Overflow,
        BadAccess,
        BadRank,
        UnknownHandle,
        NoMemory,
        PinFailed,
        TooLarge,
        BadConfig,
        NoDevice,
        Unsupported,
        PeerLost,
        Timeout,
        Finalized,
        MsgTooLong,
        RemoteFault,
        RemoteDenied,
        TooManyCaches,
        Bootstrap,
        Busy,
        Forked,
    ]
};

#[inline(always)]
pub(super) fn encode(r: Result<(), RmaError>) -> u64 {
    match r {
        Ok(()) => 0,
        Err(e) => u64::from(e as u8) + 1,
    }
}

fn decode(w: u64) -> Result<(), RmaError> {
    match (w >> RESULT_SHIFT) as u8 {
        0 => Ok(()),
        c => Err(ERRORS
            .get(usize::from(c) - 1)
            .copied()
            .unwrap_or(RmaError::Unsupported)),
    }
}

/// The result of `encode`'s code (a parked completion's, `engine`).
pub(super) fn decode_code(c: u64) -> Result<(), RmaError> {
    decode(c << RESULT_SHIFT)
}

const PAGE: usize = 256;
const PAGES: usize = 4096;

type Page = [AtomicU64; PAGE];

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

/// A request's word and the generation that says "done" in it (`DoneBoard::slot`).
#[derive(Clone, Copy)]
pub(super) struct Slot<'a> {
    word: &'a AtomicU64,
    gen: u32,
}

fn split(key: Key) -> (u32, usize) {
    ((key >> 32) as u32, key as u32 as usize)
}

impl DoneBoard {
    #[inline]
    fn word(&self, idx: usize) -> Option<&AtomicU64> {
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
            let fresh: Box<Page> = Box::new(std::array::from_fn(|_| AtomicU64::new(0)));
            // Only the table's lock holder calls this: no race for the slot.
            slot.store(Box::into_raw(fresh), Ordering::Release);
        }
    }

    /// The request of `key` is done with result `r` (under the table's lock, once per key).
    #[inline]
    pub(super) fn set_done(&self, key: Key, r: Result<(), RmaError>) {
        let (gen, idx) = split(key);
        if let Some(w) = self.word(idx) {
            w.store(
                u64::from(gen) | encode(r) << RESULT_SHIFT,
                Ordering::Release,
            );
        }
    }

    /// Whether slot `key` can have a word (a slot beyond the board has none, whatever was
    /// allocated).
    #[inline(always)]
    pub(super) fn covers(key: Key) -> bool {
        split(key).1 < PAGES * PAGE
    }

    /// `set_done` for a result (`encode`'s `code`) two parties publish, whichever comes first (a
    /// parked fast completion and the flush of it, `engine`): written unless the word already
    /// holds this generation's result (collected or not) or a newer one's (generations compared
    /// with wrap-around), so a result is still handed out once. Called with or without the table's
    /// lock; the word exists (`covers`, filled slot).
    #[inline]
    pub(super) fn publish(&self, key: Key, code: u64) {
        let (gen, idx) = split(key);
        let Some(w) = self.word(idx) else {
            return;
        };
        let new = u64::from(gen) | code << RESULT_SHIFT;
        let mut v = w.load(Ordering::Acquire);
        // Until the word holds this result or a newer one (it changes only by publishing and
        // collecting).
        while ((v as u32).wrapping_sub(gen) as i32) < 0 {
            match w.compare_exchange(v, new, Ordering::Release, Ordering::Acquire) {
                Ok(_) => return,
                Err(now) => v = now,
            }
        }
    }

    /// Takes the result of the request of `key` if it is done and nobody took it yet:
    /// `Some(Some(result))` exactly once per done request (the word is then marked collected;
    /// its table entry is the caller's to have removed); `Some(None)` while it runs, or when it
    /// was collected already, or for a key that is not the slot's current one; `None` when its
    /// slot has no word (ask the table).
    #[inline]
    pub(super) fn collect(&self, key: Key) -> Option<Option<Result<(), RmaError>>> {
        Some(Self::take(self.slot(key)?))
    }

    /// Where `collect` looks for `key`'s result (`None`: no word, ask the table), for a waiter
    /// that collects more than once (`take`).
    #[inline]
    pub(super) fn slot(&self, key: Key) -> Option<Slot<'_>> {
        let (gen, idx) = split(key);
        Some(Slot {
            word: self.word(idx)?,
            gen,
        })
    }

    /// `collect` on a word `slot` found: the result once, else `None`.
    #[inline]
    pub(super) fn take(s: Slot<'_>) -> Option<Result<(), RmaError>> {
        let Slot { word: w, gen } = s;
        let v = w.load(Ordering::Acquire);
        if v as u32 != gen || v & COLLECTED != 0 {
            return None;
        }
        // Only collectors change a done word (to collected): a failed exchange is another's.
        match w.compare_exchange(v, v | COLLECTED, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => Some(decode(v)),
            Err(_) => None,
        }
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
        assert_eq!(b.collect(k), None, "no page yet");
        b.ensure(k);
        assert_eq!(b.collect(k), Some(None));
        b.set_done(k, Err(RmaError::RemoteDenied));
        let reused = (2u64 << 32) | 300;
        assert_eq!(b.collect(reused), Some(None), "the slot's next request");
        assert_eq!(b.collect(k), Some(Some(Err(RmaError::RemoteDenied))));
        assert_eq!(b.collect(k), Some(None), "collected once");
        b.set_done(reused, Ok(()));
        assert_eq!(b.collect(k), Some(None), "an older generation");
        assert_eq!(b.collect(reused), Some(Some(Ok(()))));
        let far = (1u64 << 32) | (PAGE * PAGES) as u64;
        b.ensure(far);
        b.set_done(far, Ok(()));
        assert_eq!(b.collect(far), None, "beyond the board");
    }

    #[test]
    fn every_error_round_trips_through_a_word() {
        assert_eq!(
            RmaError::Forked as usize + 1,
            ERRORS.len(),
            "ERRORS lists every error"
        );
        for (i, &e) in ERRORS.iter().enumerate() {
            assert_eq!(e as usize, i);
            assert_eq!(decode(encode(Err(e)) << RESULT_SHIFT), Err(e));
        }
        assert_eq!(decode(encode(Ok(())) << RESULT_SHIFT), Ok(()));
    }
}
