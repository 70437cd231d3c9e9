//! Writer exclusion: the cache mutex (`Writer`, proof it is held) and the reader exclusion
//! (`Exclusive`, proof no reader is inside the index). Lock order is written next to the mutex in
//! core.rs.

use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

use super::core::Cache;
use super::counters::HoldsMutex;
use super::index::Index;
use super::membarrier;
use super::readers::my_slot;
use super::spinlock::wait_while;
use super::writer_state::WriterState;

/// Proof that the cache mutex is held.
pub(super) struct Writer<'a> {
    pub(super) cache: &'a Cache,
    pub(super) state: MutexGuard<'a, WriterState>,
}

impl HoldsMutex for Writer<'_> {}

/// Proof that readers are excluded; lowers the writer flag on drop.
pub(super) struct Exclusive<'a> {
    pub(super) cache: &'a Cache,
}

impl Drop for Exclusive<'_> {
    fn drop(&mut self) {
        // Release: a reader that sees the flag down sees the index as we left it. (Raising the
        // flag is the store that needs SeqCst: see `Writer::exclude`.)
        self.cache.gate.lower_writer();
    }
}

impl Exclusive<'_> {
    #[allow(clippy::mut_from_ref)]
    pub(super) fn index(&self) -> &mut Index {
        // SAFETY: readers are excluded and the mutex serialises writers, so this is the only
        // reference to the index while `self` lives (callers never hold two at once).
        unsafe { &mut *self.cache.index.get() }
    }
}

impl Writer<'_> {
    pub(super) fn exclude(&self) -> Exclusive<'_> {
        let c = self.cache;
        c.gate.raise_writer();
        // A slot joining after these loads sees the flag (its join RMWs precede its flag load).
        let n = c.gate.joined.0.load(Ordering::SeqCst);
        let max = c.gate.joined.1.load(Ordering::SeqCst);
        if membarrier::available() {
            let me = my_slot();
            let alone = n == 0 || (n == 1 && me != 0 && c.slots[me].joined.load(Ordering::Relaxed));
            if !alone {
                // Make every exclusive reader's plain "entered" store visible (or let it see our
                // flag): see membarrier.rs.
                membarrier::heavy();
            }
        }
        for s in c.slots[..=max].iter() {
            wait_while(|| s.readers.load(Ordering::SeqCst) != 0);
        }
        Exclusive { cache: c }
    }

    pub(super) fn index(&self) -> &Index {
        // SAFETY: we hold the mutex, so no writer mutates the index concurrently; shared reads are
        // fine alongside readers.
        unsafe { &*self.cache.index.get() }
    }
}

impl Cache {
    pub(super) fn lock(&self) -> Writer<'_> {
        Writer {
            cache: self,
            state: self.mutex.lock().unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// First entry of slot `sid` into this cache: counted before its first reader section, so a
    /// writer either sees the slot or the slot sees the writer's flag.
    #[cold]
    pub(super) fn join(&self, sid: usize) {
        self.slots[sid].joined.store(true, Ordering::Relaxed);
        self.gate.joined.1.fetch_max(sid, Ordering::SeqCst);
        self.gate.joined.0.fetch_add(1, Ordering::SeqCst);
    }
}
