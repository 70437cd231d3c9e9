//! Hook -> worker: the ranges whose firehoses must be revoked, in a fixed array of slots
//! allocated once (the hook side never allocates, never locks; it sleeps on a futex).
//!
//! A slot's `state` word is its whole protocol (and the futex its waiter sleeps on):
//! `FREE` -> (pusher) `CLAIMED` -> `QUEUED` -> (worker) `WORKING` -> `DONE` -> (waiter) `FREE`.
//! `ORPHAN` is or-ed in when nobody waits (pushed detached, or the waiter gave up): then the
//! worker frees the slot itself when the revoke is over. A waiter that gives up and a worker
//! that finishes race on one compare-exchange, so exactly one of them frees the slot.
//!
//! When every slot is taken, a push asks for a *sweep* instead: the worker revokes everything
//! peers hold here (always enough, never wrong, just expensive) and publishes the number of the
//! last request it covered, which the overflowing waiter sleeps on.

use crate::rt::futex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

/// Slots of a queue made by `Revocation` (waiters at once before sweeps take over).
pub(crate) const DEFAULT_SLOTS: usize = 64;

const FREE: u32 = 0;
const CLAIMED: u32 = 1;
const QUEUED: u32 = 2;
const WORKING: u32 = 3;
const DONE: u32 = 4;
const ORPHAN: u32 = 0x100;
/// A waiter re-checks `closed` at least this often (a close between its check and its sleep
/// changes no word it sleeps on).
const SLICE: Duration = Duration::from_millis(50);

#[derive(Default)]
struct Slot {
    state: AtomicU32,
    addr: AtomicU64,
    len: AtomicU64,
}

/// What a push got: a slot, or a sweep request (the queue was full).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ticket {
    Slot(usize),
    Sweep(u32),
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waited {
    Done,
    TimedOut,
    /// The queue was closed (the context is going away): nothing more will be revoked.
    Closed,
    /// The worker showed no progress for the `stall` limit (`wait_watching`).
    Stalled,
}

pub(crate) struct RevokeQueue {
    slots: Box<[Slot]>,
    /// Bumped by every push: the worker sleeps on it.
    work: AtomicU32,
    /// Sweep requests so far (the last one's number).
    sweep_asked: AtomicU32,
    /// The number of the last request a finished sweep covered: overflow waiters sleep on it.
    sweep_done: AtomicU32,
    closed: AtomicBool,
    /// The worker's signs of life (`beat`), read by waiters that watch for a stall.
    beat: AtomicU64,
}

impl std::fmt::Debug for RevokeQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RevokeQueue({} slots)", self.slots.len())
    }
}

/// `a` is at or past `b` on a wrapping counter.
fn reached(a: u32, b: u32) -> bool {
    a.wrapping_sub(b) as i32 >= 0
}

impl RevokeQueue {
    pub(crate) fn new(slots: usize) -> Self {
        RevokeQueue {
            slots: (0..slots.max(1)).map(|_| Slot::default()).collect(),
            work: AtomicU32::new(0),
            sweep_asked: AtomicU32::new(0),
            sweep_done: AtomicU32::new(0),
            closed: AtomicBool::new(false),
            beat: AtomicU64::new(0),
        }
    }

    fn kick(&self) {
        self.work.fetch_add(1, SeqCst);
        futex::wake(&self.work, 1);
    }

    /// Hook side: queues a revoke of `[addr, addr + len)`. `detached`: nobody will wait for it.
    /// No allocation, no lock.
    pub(crate) fn push(&self, addr: u64, len: u64, detached: bool) -> Ticket {
        for (i, s) in self.slots.iter().enumerate() {
            if s.state.load(SeqCst) == FREE
                && s.state
                    .compare_exchange(FREE, CLAIMED, SeqCst, SeqCst)
                    .is_ok()
            {
                s.addr.store(addr, SeqCst);
                s.len.store(len, SeqCst);
                let orphan = if detached { ORPHAN } else { 0 };
                s.state.store(QUEUED | orphan, SeqCst);
                self.kick();
                return Ticket::Slot(i);
            }
        }
        let req = self.sweep_asked.fetch_add(1, SeqCst).wrapping_add(1);
        self.kick();
        Ticket::Sweep(req)
    }

    /// Hook side: sleeps until the ticket's revoke is over, at most `timeout`. A slot is freed
    /// here (or handed to the worker to free). No allocation, no lock.
    #[cfg(test)]
    pub(crate) fn wait(&self, t: Ticket, timeout: Duration) -> Waited {
        self.wait_watching(t, timeout, None)
    }

    /// As [`RevokeQueue::wait`], and with `stall`, also gives up (`Stalled`) once the worker has
    /// not [`RevokeQueue::beat`] for that long: it may be blocked on a lock this thread holds.
    pub(crate) fn wait_watching(
        &self,
        t: Ticket,
        timeout: Duration,
        stall: Option<Duration>,
    ) -> Waited {
        let start = Instant::now();
        let mut last_beat = (self.beat.load(SeqCst), start);
        // `Err(why)`: stop waiting now. `Ok(nap)`: sleep at most that long, then look again.
        let mut look = || -> Result<Duration, Waited> {
            if self.closed.load(SeqCst) {
                return Err(Waited::Closed);
            }
            let now = Instant::now(); // clock_gettime through the vDSO: no allocation
            let left = timeout.saturating_sub(now - start);
            if left.is_zero() {
                return Err(Waited::TimedOut);
            }
            let Some(limit) = stall else {
                return Ok(left.min(SLICE));
            };
            let b = self.beat.load(SeqCst);
            if b != last_beat.0 {
                last_beat = (b, now);
            }
            if now - last_beat.1 >= limit {
                return Err(Waited::Stalled);
            }
            // A few looks per limit, at most one per millisecond.
            Ok(left
                .min(SLICE)
                .min((limit / 4).max(Duration::from_millis(1))))
        };
        match t {
            Ticket::Slot(i) => {
                let s = &self.slots[i];
                loop {
                    let st = s.state.load(SeqCst);
                    if st == DONE {
                        s.state.store(FREE, SeqCst);
                        return Waited::Done;
                    }
                    match look() {
                        Ok(nap) => futex::wait(&s.state, st, Some(nap)),
                        // Leave the slot to the worker (or to nobody, once closed); if the
                        // worker just finished, take it instead.
                        Err(why) => {
                            if s.state
                                .compare_exchange(st, st | ORPHAN, SeqCst, SeqCst)
                                .is_ok()
                            {
                                return why;
                            }
                        }
                    }
                }
            }
            Ticket::Sweep(req) => loop {
                let d = self.sweep_done.load(SeqCst);
                if reached(d, req) {
                    return Waited::Done;
                }
                match look() {
                    Ok(nap) => futex::wait(&self.sweep_done, d, Some(nap)),
                    Err(why) => return why,
                }
            },
        }
    }

    /// Worker side: a sign of life, given at every turn of its loop (see `wait_watching`).
    pub(crate) fn beat(&self) {
        self.beat.fetch_add(1, SeqCst);
    }

    /// Worker side: the counter to pass to [`RevokeQueue::sleep`], read *before* looking for
    /// work (a push after the read makes the sleep return at once).
    pub(crate) fn work_seq(&self) -> u32 {
        self.work.load(SeqCst)
    }

    /// Worker side: sleeps until a push after `seen`, a close, or `timeout`.
    pub(crate) fn sleep(&self, seen: u32, timeout: Duration) {
        if !self.closed.load(SeqCst) {
            futex::wait(&self.work, seen, Some(timeout));
        }
    }

    /// Worker side: takes every queued range (`f(slot, addr, len)`); each must later be
    /// [`RevokeQueue::complete`]d. Returns how many.
    pub(crate) fn take(&self, mut f: impl FnMut(usize, u64, u64)) -> usize {
        let mut n = 0;
        for (i, s) in self.slots.iter().enumerate() {
            let st = s.state.load(SeqCst);
            if st & !ORPHAN != QUEUED {
                continue;
            }
            // A waiter may or-in ORPHAN meanwhile: then retry from the fresh value.
            let mut cur = st;
            loop {
                let next = WORKING | (cur & ORPHAN);
                match s.state.compare_exchange(cur, next, SeqCst, SeqCst) {
                    Ok(_) => {
                        f(i, s.addr.load(SeqCst), s.len.load(SeqCst));
                        n += 1;
                        break;
                    }
                    Err(now) if now & !ORPHAN == QUEUED => cur = now,
                    Err(_) => break,
                }
            }
        }
        n
    }

    /// Worker side: the revoke of a taken slot is over: wake its waiter (or free it).
    pub(crate) fn complete(&self, slot: usize) {
        let s = &self.slots[slot];
        loop {
            let st = s.state.load(SeqCst);
            if st & ORPHAN != 0 {
                s.state.store(FREE, SeqCst);
                break;
            }
            if s.state
                .compare_exchange(WORKING, DONE, SeqCst, SeqCst)
                .is_ok()
            {
                break;
            }
        }
        futex::wake_all(&s.state);
    }

    /// Worker side: frees a taken slot nobody waits for any more (pushed detached, or its waiter
    /// gave up), so that a revoke a holder never acknowledges keeps no slot: the worker goes on
    /// tracking it by itself, and must then not [`RevokeQueue::complete`] the slot. `false`
    /// while a waiter is still there (only the worker moves a `WORKING | ORPHAN` slot on, so
    /// the check and the store do not race with anybody).
    pub(crate) fn release_orphan(&self, slot: usize) -> bool {
        let s = &self.slots[slot];
        if s.state.load(SeqCst) != WORKING | ORPHAN {
            return false;
        }
        s.state.store(FREE, SeqCst);
        true
    }

    /// Worker side: the newest sweep request, if one is not yet covered.
    pub(crate) fn sweep_wanted(&self) -> Option<u32> {
        let asked = self.sweep_asked.load(SeqCst);
        (asked != self.sweep_done.load(SeqCst)).then_some(asked)
    }

    /// Worker side: a sweep started after request `req` was read is over.
    pub(crate) fn sweep_finished(&self, req: u32) {
        self.sweep_done.store(req, SeqCst);
        futex::wake_all(&self.sweep_done);
    }

    /// Stops everything: waiters return `Closed`, the worker's sleep returns.
    pub(crate) fn close(&self) {
        self.closed.store(true, SeqCst);
        self.kick();
        futex::wake_all(&self.work);
        for s in self.slots.iter() {
            futex::wake_all(&s.state);
        }
        futex::wake_all(&self.sweep_done);
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(SeqCst)
    }

    /// Slots not free (tests: all come back).
    #[cfg(test)]
    pub(crate) fn busy(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.state.load(SeqCst) != FREE)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    /// A worker that completes whatever it takes (and sweeps), until closed.
    fn worker(q: Arc<RevokeQueue>, seen_ranges: Arc<AtomicUsize>) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || loop {
            let seen = q.work_seq();
            if q.is_closed() {
                return;
            }
            let mut got = Vec::new();
            q.take(|i, a, l| {
                assert_eq!(l, a ^ 0x5555, "addr and len travel together");
                got.push(i)
            });
            seen_ranges.fetch_add(got.len(), SeqCst);
            for i in got {
                q.complete(i);
            }
            if let Some(req) = q.sweep_wanted() {
                q.sweep_finished(req);
            }
            q.sleep(seen, Duration::from_millis(20));
        })
    }

    #[test]
    fn push_wait_complete() {
        let q = Arc::new(RevokeQueue::new(4));
        let n = Arc::new(AtomicUsize::new(0));
        let w = worker(q.clone(), n.clone());
        let t = q.push(0x1000, 0x1000 ^ 0x5555, false);
        assert_eq!(t, Ticket::Slot(0));
        assert_eq!(q.wait(t, Duration::from_secs(10)), Waited::Done);
        assert_eq!(q.busy(), 0, "the waiter freed its slot");
        let t = q.push(0x2000, 0x2000 ^ 0x5555, true);
        assert!(matches!(t, Ticket::Slot(_)));
        let t0 = Instant::now();
        while q.busy() != 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "detached slot freed by the worker"
            );
            std::thread::yield_now();
        }
        q.close();
        w.join().unwrap();
        assert_eq!(n.load(SeqCst), 2);
    }

    #[test]
    fn timeout_orphans_and_worker_frees_later() {
        let q = RevokeQueue::new(2);
        let t = q.push(1, 1 ^ 0x5555, false);
        let t0 = Instant::now();
        assert_eq!(q.wait(t, Duration::from_millis(30)), Waited::TimedOut);
        assert!(t0.elapsed() >= Duration::from_millis(25));
        assert_eq!(q.busy(), 1, "still queued: the worker owns it now");
        let mut taken = vec![];
        q.take(|i, _, _| taken.push(i));
        assert_eq!(taken, vec![0]);
        q.complete(0);
        assert_eq!(q.busy(), 0, "an orphan is freed by the worker");
    }

    /// A taken slot comes back at once when nobody waits for it (detached, or its waiter gave
    /// up), never while its waiter waits.
    #[test]
    fn orphans_are_released_before_their_revoke_ends() {
        let q = RevokeQueue::new(2);
        let waited = q.push(1, 1 ^ 0x5555, false);
        let detached = q.push(2, 2 ^ 0x5555, true);
        assert_eq!((waited, detached), (Ticket::Slot(0), Ticket::Slot(1)));
        assert!(!q.release_orphan(1), "not taken yet");
        q.take(|_, _, _| {});
        assert!(!q.release_orphan(0), "its waiter is still there");
        assert!(q.release_orphan(1));
        assert_eq!(q.busy(), 1);
        assert_eq!(q.wait(waited, Duration::from_millis(10)), Waited::TimedOut);
        assert!(q.release_orphan(0), "its waiter gave up");
        assert_eq!(q.busy(), 0);
        assert_eq!(q.push(3, 3 ^ 0x5555, false), Ticket::Slot(0), "reused");
    }

    #[test]
    fn a_silent_worker_ends_a_watching_wait_a_beating_one_does_not() {
        let q = Arc::new(RevokeQueue::new(2));
        let stall = Some(Duration::from_millis(100));
        // Nobody beats: `Stalled` after the limit, long before the timeout; the slot is orphaned
        // (the worker frees it later), as after a timeout.
        let t = q.push(1, 1 ^ 0x5555, false);
        let t0 = Instant::now();
        assert_eq!(
            q.wait_watching(t, Duration::from_secs(10), stall),
            Waited::Stalled
        );
        assert!(t0.elapsed() >= Duration::from_millis(100));
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert_eq!(q.busy(), 1);
        q.take(|_, _, _| {});
        q.complete(0);
        assert_eq!(q.busy(), 0);
        // Zero: gives up at once.
        let t = q.push(2, 2 ^ 0x5555, false);
        assert_eq!(
            q.wait_watching(t, Duration::from_secs(10), Some(Duration::ZERO)),
            Waited::Stalled
        );
        q.take(|_, _, _| {});
        q.complete(0);
        // A worker that beats every millisecond and completes after 400 ms (4x the limit).
        let t = q.push(3, 3 ^ 0x5555, false);
        let q2 = q.clone();
        let w = std::thread::spawn(move || {
            let t0 = Instant::now();
            let mut taken = vec![];
            while t0.elapsed() < Duration::from_millis(400) {
                q2.beat();
                q2.take(|i, _, _| taken.push(i));
                std::thread::sleep(Duration::from_millis(1));
            }
            for i in taken {
                q2.complete(i);
            }
        });
        assert_eq!(
            q.wait_watching(t, Duration::from_secs(10), stall),
            Waited::Done
        );
        w.join().unwrap();
        assert_eq!(q.busy(), 0);
        // No watch: a silent worker is waited for until the timeout.
        let t = q.push(4, 4 ^ 0x5555, false);
        assert_eq!(
            q.wait_watching(t, Duration::from_millis(60), None),
            Waited::TimedOut
        );
    }

    #[test]
    fn full_queue_asks_for_a_sweep() {
        let q = RevokeQueue::new(1);
        let a = q.push(1, 1 ^ 0x5555, false);
        let b = q.push(2, 2 ^ 0x5555, false);
        assert_eq!(a, Ticket::Slot(0));
        assert_eq!(b, Ticket::Sweep(1));
        assert_eq!(q.wait(b, Duration::from_millis(10)), Waited::TimedOut);
        assert_eq!(q.sweep_wanted(), Some(1));
        q.sweep_finished(1);
        assert_eq!(q.sweep_wanted(), None);
        assert_eq!(q.wait(b, Duration::from_millis(10)), Waited::Done);
        let c = q.push(3, 3 ^ 0x5555, true);
        assert_eq!(c, Ticket::Sweep(2), "numbered in order");
    }

    #[test]
    fn close_releases_waiters() {
        let q = Arc::new(RevokeQueue::new(1));
        let q2 = q.clone();
        let h = std::thread::spawn(move || {
            let t = q2.push(1, 1 ^ 0x5555, false);
            let u = q2.push(2, 2 ^ 0x5555, false);
            (
                q2.wait(t, Duration::from_secs(60)),
                q2.wait(u, Duration::from_secs(60)),
            )
        });
        std::thread::sleep(Duration::from_millis(20));
        let t0 = Instant::now();
        q.close();
        assert_eq!(h.join().unwrap(), (Waited::Closed, Waited::Closed));
        assert!(t0.elapsed() < Duration::from_secs(5));
    }

    /// 16 threads push and wait (some detached, some with a tiny timeout) through 8 slots, so
    /// sweeps happen too: every waited push ends Done or TimedOut, every slot comes back.
    #[test]
    fn sixteen_threads_through_eight_slots() {
        let q = Arc::new(RevokeQueue::new(8));
        let n = Arc::new(AtomicUsize::new(0));
        let w = worker(q.clone(), n.clone());
        let hs: Vec<_> = (0..16u64)
            .map(|t| {
                let q = q.clone();
                std::thread::spawn(move || {
                    let mut done = 0;
                    for k in 0..300u64 {
                        let a = (t << 32) | k;
                        let tk = q.push(a, a ^ 0x5555, k % 5 == 0);
                        if k % 5 == 0 {
                            continue;
                        }
                        let to = if k % 7 == 0 {
                            Duration::ZERO
                        } else {
                            Duration::from_secs(30)
                        };
                        match q.wait(tk, to) {
                            Waited::Done => done += 1,
                            Waited::TimedOut => assert!(to.is_zero(), "only the zero timeouts"),
                            Waited::Closed | Waited::Stalled => panic!("not closed, not watching"),
                        }
                    }
                    done
                })
            })
            .collect();
        let done: usize = hs.into_iter().map(|h| h.join().unwrap()).sum();
        assert!(done > 16 * 200);
        let t0 = Instant::now();
        while q.busy() != 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "{} slots stuck",
                q.busy()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        q.close();
        w.join().unwrap();
    }
}
