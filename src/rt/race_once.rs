//! A value made on first use without anyone waiting for anyone: threads that race the first use
//! each make one, the first to publish wins, the others drop theirs.
//!
//! Why not `OnceLock`: its latecomers wait for the thread that is making the value. A child forked
//! while another parent thread was inside that initialiser inherits the "being made" state with
//! no thread left to finish it, and its first use waits forever. For tables of symbols looked up
//! with `dlsym` (cheap, idempotent, made at most once per racing thread) making twice is the
//! better trade.

use std::sync::atomic::{AtomicPtr, Ordering};

pub struct RaceOnce<T: 'static>(AtomicPtr<T>);

/// `T: Sync`: the one value is shared by every thread (`Send`: it may be made on any of them).
impl<T: Send + Sync + 'static> RaceOnce<T> {
    pub const fn new() -> Self {
        RaceOnce(AtomicPtr::new(std::ptr::null_mut()))
    }

    /// The value if one was published (never makes one: one atomic load, fine in a hook).
    pub fn get(&self) -> Option<&'static T> {
        let p = self.0.load(Ordering::Acquire);
        // SAFETY: published by `get_or_init` from a leaked Box, never freed.
        (!p.is_null()).then(|| unsafe { &*p })
    }

    /// The value, made by `make` if nobody has published one yet. After the first publish, one
    /// atomic load.
    pub fn get_or_init(&self, make: impl FnOnce() -> T) -> &'static T {
        let p = self.0.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: published below from a leaked Box, never freed.
            return unsafe { &*p };
        }
        let mine = Box::into_raw(Box::new(make()));
        match self.0.compare_exchange(
            std::ptr::null_mut(),
            mine,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            // SAFETY: ours, now published and never freed.
            Ok(_) => unsafe { &*mine },
            Err(winner) => {
                // SAFETY: `mine` was never shared; the winner's is published and never freed.
                drop(unsafe { Box::from_raw(mine) });
                unsafe { &*winner }
            }
        }
    }
}

impl<T: Send + Sync + 'static> Default for RaceOnce<T> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::RaceOnce;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::sync::Barrier;

    #[test]
    fn sixteen_racing_threads_all_get_the_one_published_value() {
        static ONCE: RaceOnce<usize> = RaceOnce::new();
        static MADE: AtomicUsize = AtomicUsize::new(0);
        let start = Barrier::new(16);
        let got: Vec<usize> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..16)
                .map(|i| {
                    let start = &start;
                    s.spawn(move || {
                        start.wait();
                        let v = ONCE.get_or_init(|| {
                            MADE.fetch_add(1, SeqCst);
                            i
                        });
                        (*v, v as *const usize as usize)
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        })
        .into_iter()
        .map(|(v, addr)| {
            assert_eq!(addr, ONCE.get_or_init(|| 99) as *const usize as usize);
            v
        })
        .collect();
        assert!(
            got.windows(2).all(|w| w[0] == w[1]),
            "one value for all: {got:?}"
        );
        assert!((1..=16).contains(&MADE.load(SeqCst)));
        assert_eq!(*ONCE.get_or_init(|| 99), got[0], "later calls make nothing");
    }
}
