//! Listener registry: a fixed array of slots that hook context reads without locks.
//!
//! Why fixed: `notify_unmapped` runs inside patched libc functions (possibly inside malloc) and on
//! the userfaultfd reader thread, so it must not allocate or take a mutex. Each slot holds a thin
//! pointer to a boxed `Arc<dyn MemoryListener>` plus an in-flight counter; unsubscribe clears the
//! pointer, then waits for the counter to reach zero so the listener is never called after
//! `Subscription::drop` returns.

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use super::MemoryListener;

/// How many listeners can be subscribed at once (one per cache, plus tests).
pub const MAX_LISTENERS: usize = 32;

type Boxed = Arc<dyn MemoryListener>;

struct Slot {
    listener: AtomicPtr<Boxed>,
    in_flight: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    listener: AtomicPtr::new(std::ptr::null_mut()),
    in_flight: AtomicUsize::new(0),
};
static SLOTS: [Slot; MAX_LISTENERS] = [EMPTY; MAX_LISTENERS];
/// Serialises subscribe/unsubscribe (never taken on the hook path).
static WRITERS: Mutex<()> = Mutex::new(());

/// Keeps a listener subscribed; dropping it unsubscribes and waits for in-flight calls to finish.
///
/// Do not drop a `Subscription` from inside its own listener's `on_unmap` (it would wait for
/// itself forever).
#[derive(Debug)]
#[must_use = "dropping the Subscription unsubscribes the listener"]
pub struct Subscription {
    slot: Option<usize>,
}

impl Subscription {
    /// False when all [`MAX_LISTENERS`] slots were taken: the listener was not subscribed.
    pub fn is_active(&self) -> bool {
        self.slot.is_some()
    }
}

/// Subscribe a listener; see [`Subscription`]. When every slot is taken the returned
/// subscription is inactive (check [`Subscription::is_active`]).
pub fn subscribe(l: Arc<dyn MemoryListener>) -> Subscription {
    let _w = WRITERS.lock().unwrap_or_else(|e| e.into_inner());
    for (i, slot) in SLOTS.iter().enumerate() {
        if slot.listener.load(SeqCst).is_null() {
            let raw = Box::into_raw(Box::new(l));
            slot.listener.store(raw, SeqCst);
            return Subscription { slot: Some(i) };
        }
    }
    Subscription { slot: None }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let Some(i) = self.slot else { return };
        let _w = WRITERS.lock().unwrap_or_else(|e| e.into_inner());
        let slot = &SLOTS[i];
        let raw = slot.listener.swap(std::ptr::null_mut(), SeqCst);
        // A notifier that loaded the pointer incremented `in_flight` before (SeqCst), so once we
        // see zero here, nobody holds `raw` any more and nobody new can load it.
        let mut spins = 0u32;
        while slot.in_flight.load(SeqCst) != 0 {
            spins += 1;
            if spins < 100 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        if !raw.is_null() {
            // SAFETY: `raw` came from Box::into_raw in `subscribe`, was removed from the slot by the
            // swap above (so it is freed exactly once), and no notifier still uses it.
            drop(unsafe { Box::from_raw(raw) });
        }
    }
}

/// Fan an event out to every subscribed listener. No allocation, no lock: hook-safe.
pub fn notify_all(addr: usize, len: usize) {
    for slot in SLOTS.iter() {
        // Cheap pre-check so an empty registry costs 32 loads, not 64 RMWs.
        if slot.listener.load(SeqCst).is_null() {
            continue;
        }
        slot.in_flight.fetch_add(1, SeqCst);
        let raw = slot.listener.load(SeqCst);
        if !raw.is_null() {
            // SAFETY: the pointer stays valid while `in_flight` > 0 (see Drop above).
            unsafe { (*raw).on_unmap(addr, len) };
        }
        slot.in_flight.fetch_sub(1, SeqCst);
    }
}

/// Number of subscribed listeners (diagnostics and tests).
pub fn listener_count() -> usize {
    SLOTS
        .iter()
        .filter(|s| !s.listener.load(SeqCst).is_null())
        .count()
}
