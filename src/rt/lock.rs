//! `Lock`: a mutex without poisoning, for the hottest locks of the library (the remote-pinning
//! engine's, taken at the start and at the completion of every put and get; the verbs link's
//! post, send-CQ and receive locks, taken on every post and poll). Uncontended it
//! costs one compare-and-swap to take and one swap to give back; `std::sync::Mutex` adds its
//! poison bookkeeping (the global panic count read when taking and again when giving back),
//! which the engine's users ignored anyway (a holder that panics releases the lock on unwinding,
//! as here, and the next holder goes on).
//!
//! The word has three states (after Drepper, "Futexes Are Tricky"): 0 free, 1 held, 2 held and
//! maybe slept on. A taker that finds it held spins a little, then marks it 2 and sleeps on the
//! futex until a swap finds it free; a giver that swaps out a 2 wakes one sleeper.

use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{
    AtomicU32,
    Ordering::{Acquire, Relaxed, Release},
};

use super::futex;

const FREE: u32 = 0;
const HELD: u32 = 1;
const SLEPT_ON: u32 = 2;

pub(crate) struct Lock<T> {
    state: AtomicU32,
    val: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a guard, and one guard exists at a time (the state
// word's protocol); moving the value between threads needs `T: Send`, as for `Mutex`.
unsafe impl<T: Send> Send for Lock<T> {}
// SAFETY: as above: shared references to the lock hand out exclusive access one at a time.
unsafe impl<T: Send> Sync for Lock<T> {}

/// Exclusive access to the value until dropped (on the thread that took it).
#[must_use = "the lock is given back when the guard drops"]
pub(crate) struct LockGuard<'a, T> {
    lock: &'a Lock<T>,
    _thread: PhantomData<*const ()>,
}

impl<T> Lock<T> {
    pub(crate) const fn new(val: T) -> Self {
        Lock {
            state: AtomicU32::new(FREE),
            val: UnsafeCell::new(val),
        }
    }

    #[inline]
    pub(crate) fn lock(&self) -> LockGuard<'_, T> {
        if self
            .state
            .compare_exchange(FREE, HELD, Acquire, Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
        LockGuard {
            lock: self,
            _thread: PhantomData,
        }
    }

    /// The lock if it is free now, else `None` (no spin, no sleep).
    #[inline]
    pub(crate) fn try_lock(&self) -> Option<LockGuard<'_, T>> {
        self.state
            .compare_exchange(FREE, HELD, Acquire, Relaxed)
            .ok()
            .map(|_| LockGuard {
                lock: self,
                _thread: PhantomData,
            })
    }

    /// `lock` when it was held (out of line).
    #[cold]
    #[inline(never)]
    fn lock_contended(&self) {
        // A short spin while the holder has no sleeper to wake: critical sections are short.
        for _ in 0..100 {
            match self.state.load(Relaxed) {
                FREE => {
                    if self
                        .state
                        .compare_exchange(FREE, HELD, Acquire, Relaxed)
                        .is_ok()
                    {
                        return;
                    }
                }
                HELD => std::hint::spin_loop(),
                _ => break,
            }
        }
        // Marked as slept on from here: whoever takes it so gives back a 2, and wakes one.
        while self.state.swap(SLEPT_ON, Acquire) != FREE {
            futex::wait(&self.state, SLEPT_ON, None);
        }
    }

    #[cfg(test)]
    pub(crate) fn get_mut(&mut self) -> &mut T {
        self.val.get_mut()
    }
}

impl<T> Drop for LockGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        if self.lock.state.swap(FREE, Release) == SLEPT_ON {
            futex::wake(&self.lock.state, 1);
        }
    }
}

impl<T> Deref for LockGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this guard is the one holder (the state word's protocol).
        unsafe { &*self.lock.val.get() }
    }
}

impl<T> DerefMut for LockGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes this borrow the only one.
        unsafe { &mut *self.lock.val.get() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn threads_take_turns_and_sleepers_are_woken() {
        let l = Arc::new(Lock::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000u64 {
                        let mut g = l.lock();
                        let v = *g;
                        if i % 1000 == 0 {
                            // Held across a sleep: the others spin out and sleep on the futex.
                            std::thread::sleep(std::time::Duration::from_micros(200));
                        }
                        *g = v + 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*l.lock(), 80_000);
        assert_eq!(l.state.load(Relaxed), FREE);
    }

    #[test]
    fn try_lock_takes_only_a_free_lock_and_excludes_like_lock() {
        let l = Arc::new(Lock::new(0u64));
        let g = l.try_lock().expect("free");
        assert!(l.try_lock().is_none(), "held: try_lock must not take it");
        drop(g);
        assert_eq!(l.state.load(Relaxed), FREE);
        // Mixed with `lock` across 16 threads: no increment is lost.
        let threads: Vec<_> = (0..16)
            .map(|t| {
                let l = l.clone();
                std::thread::spawn(move || {
                    let mut done = 0;
                    while done < 5_000 {
                        let g = if t % 2 == 0 {
                            l.try_lock()
                        } else {
                            Some(l.lock())
                        };
                        if let Some(mut g) = g {
                            let v = *g;
                            std::hint::spin_loop();
                            *g = v + 1;
                            done += 1;
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*l.lock(), 80_000);
        assert_eq!(l.state.load(Relaxed), FREE);
    }

    #[test]
    fn a_panicking_holder_gives_it_back() {
        let l = Arc::new(Lock::new(1u32));
        let l2 = l.clone();
        let r = std::thread::spawn(move || {
            let _g = l2.lock();
            panic!("holder fails");
        })
        .join();
        assert!(r.is_err());
        let mut g = l.lock();
        *g += 1;
        drop(g);
        assert_eq!(*Arc::try_unwrap(l).ok().unwrap().get_mut(), 2);
    }
}
