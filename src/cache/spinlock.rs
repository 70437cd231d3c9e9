//! A minimal test-and-test-and-set lock for critical sections of a few instructions (the slab's
//! free list): one locked instruction to take it and a plain release store to give it back, where
//! `std::sync::Mutex` pays a second locked instruction and a poison check. A holder that gets
//! descheduled makes others yield, not spin hot. Never held across a backend call (only, rarely,
//! across the allocation of a new chunk or free-list growth).

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};

pub(super) struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the lock serialises all access to `value`.
unsafe impl<T: Send> Sync for SpinLock<T> {}
// SAFETY: moving the lock moves the value.
unsafe impl<T: Send> Send for SpinLock<T> {}

pub(super) struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
}

impl<T> SpinLock<T> {
    pub(super) const fn new(value: T) -> Self {
        SpinLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    #[inline]
    pub(super) fn lock(&self) -> SpinGuard<'_, T> {
        while self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            wait_while(|| self.locked.load(Ordering::Relaxed));
        }
        SpinGuard { lock: self }
    }
}

/// Spin while `busy()`, yielding the CPU after 64 rounds: the thread we wait for (a lock holder,
/// a reader leaving its section, a writer mutating the index) may have been descheduled.
#[inline]
pub(super) fn wait_while(busy: impl Fn() -> bool) {
    let mut spins = 0u32;
    while busy() {
        spins += 1;
        if spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: we hold the lock.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: we hold the lock, exclusively.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn four_threads_lose_no_increment() {
        let l = Arc::new(SpinLock::new(0u64));
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for _ in 0..100_000 {
                        // Read, yield the CPU sometimes, write: lost updates show up without the lock.
                        let mut g = l.lock();
                        let v = *g;
                        std::hint::black_box(v);
                        *g = v + 1;
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(*l.lock(), 400_000);
    }
}
