//! What the callers tell the helper, and the queue it travels in (the paper's DQ, section 4.1).
//!
//! `fh_register` pushes a `Use` (after its lookup or pin: the event carries whether the caller
//! had to pin and how long it waited). A `Release` is not pushed by `fh_deregister`: the helper
//! thread makes it when it sees the handle gone (`releases.rs`), which saves the caller a clock
//! read and a push. The helper thread is the only consumer. The queue is crossbeam's
//! `ArrayQueue`: bounded and allocated once, so a push never allocates or blocks, and lock-free
//! for any number of producers (the paper's single-producer ring assumes one communicating
//! thread; MPI_THREAD_MULTIPLE programs and the shim have many).
//! A full queue drops the event and counts it, as the paper's ring overwrites old entries: the
//! predictor loses one sample, the region stays lazily cached; correctness never depends on an
//! event arriving.

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_queue::ArrayQueue;

/// A registered range as the helper tracks it: page-aligned bounds plus access bits (regions of
/// different remote rights are different cache entries).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub start: usize,
    pub end: usize,
    pub access: u32,
}

impl Key {
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

/// One registration a caller got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Use {
    /// Small per-thread number (the predictor keeps one context window per thread).
    pub tid: u32,
    /// The caller's call site (return address or `#[track_caller]` location; 0 if unknown).
    pub site: usize,
    pub key: Key,
    pub handle: u64,
    /// When the caller asked (ns, `clock::now_ns`).
    pub t: u64,
    /// How long the caller spent in the registration (ns).
    pub wait_ns: u64,
    /// The caller pinned it itself (a miss on its own thread).
    pub pinned_here: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Use(Use),
    /// The handle of a `Use` was deregistered (seen at `t`).
    Release {
        handle: u64,
        t: u64,
    },
}

/// Capacity of a helper's event queue (a push past it drops the event).
pub(crate) const EVENT_CAPACITY: usize = 4096;

pub struct EventQueue {
    q: ArrayQueue<Event>,
    dropped: AtomicU64,
}

impl EventQueue {
    pub fn new(capacity: usize) -> EventQueue {
        EventQueue {
            q: ArrayQueue::new(capacity.max(1)),
            dropped: AtomicU64::new(0),
        }
    }

    /// Never blocks, never allocates. False (and counted) when the queue is full.
    #[inline]
    pub fn push(&self, ev: Event) -> bool {
        if self.q.push(ev).is_ok() {
            return true;
        }
        self.dropped.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// Consumer side (the helper thread).
    pub fn pop(&self) -> Option<Event> {
        self.q.pop()
    }

    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    #[cfg(any(test, feature = "test-support"))]
    pub fn len(&self) -> usize {
        self.q.len()
    }

    #[cfg(any(test, feature = "test-support"))]
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    /// 16 producers, one consumer running meanwhile: every event pushed successfully arrives
    /// exactly once, every failed push is counted, nothing else arrives.
    #[test]
    fn sixteen_producers_no_lost_or_doubled_events() {
        const THREADS: u64 = 16;
        const PER: u64 = 20_000;
        let q = Arc::new(EventQueue::new(256));
        let done = Arc::new(AtomicBool::new(false));
        let consumer = {
            let (q, done) = (q.clone(), done.clone());
            std::thread::spawn(move || {
                let mut seen = HashSet::new();
                loop {
                    let finished = done.load(Ordering::Acquire);
                    let mut any = false;
                    while let Some(ev) = q.pop() {
                        any = true;
                        let Event::Release { handle, .. } = ev else {
                            panic!("unexpected {ev:?}")
                        };
                        assert!(seen.insert(handle), "event {handle} arrived twice");
                    }
                    if finished && !any {
                        return seen;
                    }
                    if !any {
                        std::thread::yield_now();
                    }
                }
            })
        };
        let producers: Vec<_> = (0..THREADS)
            .map(|t| {
                let q = q.clone();
                std::thread::spawn(move || {
                    let mut ok = Vec::new();
                    for i in 0..PER {
                        let handle = t << 32 | i;
                        if q.push(Event::Release { handle, t: i }) {
                            ok.push(handle);
                        }
                    }
                    ok
                })
            })
            .collect();
        let mut pushed = HashSet::new();
        for p in producers {
            pushed.extend(p.join().unwrap());
        }
        done.store(true, Ordering::Release);
        let seen = consumer.join().unwrap();
        assert_eq!(seen, pushed, "exactly the successful pushes arrive");
        assert_eq!(
            pushed.len() as u64 + q.dropped(),
            THREADS * PER,
            "every push either arrived or was counted as dropped"
        );
    }

    #[test]
    fn full_queue_drops_and_counts() {
        let q = EventQueue::new(2);
        let ev = Event::Release { handle: 1, t: 0 };
        assert!(q.push(ev) && q.push(ev));
        assert!(!q.push(ev));
        assert_eq!((q.len(), q.dropped()), (2, 1));
        assert_eq!(q.pop(), Some(ev));
    }
}
