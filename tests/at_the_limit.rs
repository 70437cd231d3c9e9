//! Fixed-size structures on the invalidation path, at and past their limits. Each
//! test drives one structure past its capacity and checks that nothing an
//! unmap reported can still be used: a full structure may make the library invalidate more, or
//! wait, but never forget an unmap.
//!
//! * the cache's invalidation ring (`QUEUE_CAPACITY`): more ranges than it holds, from several
//!   threads, while the cache's owner is in the middle of a miss, and concurrently with hits;
//! * the reader slots (128 per cache): more threads than slots alive at once, the rest sharing
//!   slot 0, hitting and invalidating;
//! * the unmap log (64 slots): an unmap still running after 64 newer ones;
//! * the pins-ahead table (64 slots): full, it refuses the next pin, and the pins it holds still
//!   make an overlapping unmap wait.
//!
//! Other structures have their limit tests next to them: the guard's window and its nested
//! rounds (`monitor::guard::tests`), the listener registry (`tests/monitor_registry.rs`:
//! `slots_run_out_then_free_up`, `cache_new_fails_when_no_listener_slot_is_left`), the prune
//! ring (`monitor::prune_ring::tests::push_drain_and_overflow`), the inside table
//! (`inside::tests::a_full_window_counts_unknown_threads_as_inside`), the shared reader slot
//! (`cache::readers::tests::the_shared_slot_counts_every_reader_and_every_hit`).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use firehose::cache::{Cache, Limits, QUEUE_CAPACITY};
use firehose::helper::{pins_ahead, unmap_log};
use firehose::pin::counting::CountingPinner;
use firehose::pin::{Access, PinError, Pinned, Pinner};

const P: usize = 4096;
const RW: Access = Access(1 | 2);

/// The tests fill process-wide tables (the reader-id pool, the unmap log, the pins-ahead
/// table): one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// What `DuringPin` runs inside one pin, after the backend pinned.
type Action = Box<dyn FnOnce() + Send>;

/// The counting double, plus an action run inside the pin of one chosen address (the cache's
/// mutex is held then, and readers run).
struct DuringPin {
    inner: CountingPinner,
    at: AtomicUsize,
    action: Mutex<Option<Action>>,
}

impl Pinner for DuringPin {
    fn pin(&self, addr: usize, len: usize, access: Access) -> Result<Pinned, PinError> {
        let res = self.inner.pin(addr, len, access);
        if addr == self.at.load(SeqCst) {
            let f = self.action.lock().unwrap().take();
            if let Some(f) = f {
                f();
            }
        }
        res
    }
    fn unpin(&self, pinned: Pinned, addr: usize, len: usize) {
        self.inner.unpin(pinned, addr, len)
    }
    fn name(&self) -> &'static str {
        "during-pin"
    }
}

fn unbounded() -> Limits {
    Limits {
        max_pinned: usize::MAX,
        max_regions: usize::MAX,
    }
}

/// Three times the ring's capacity of invalidations, from four threads, all made (and returned)
/// while the cache's owner is inside a miss (its mutex held, so nothing drains): the ring fills
/// and overflows. Afterwards no range any of them overlapped may be hit: not the idle regions,
/// not the ones in use, not the region the miss was pinning. (Regions nobody invalidated may be
/// dropped too: the overflow invalidates everything.)
#[test]
fn invalidations_past_the_ring_from_threads_during_a_miss_leave_nothing_to_hit() {
    let _s = serial();
    const RANGES: usize = 3 * QUEUE_CAPACITY;
    const THREADS: usize = 4;
    let pin = Arc::new(DuringPin {
        inner: CountingPinner::new(),
        at: AtomicUsize::new(0),
        action: Mutex::new(None),
    });
    let c = Cache::new(pin.clone(), unbounded(), None);
    let range = |k: usize| (k + 1) * 4 * P;
    // Half of them held (in use), half idle.
    let mut held = Vec::new();
    let keys: Vec<u32> = (0..RANGES)
        .map(|k| {
            let r = c.register(range(k), P, RW).unwrap();
            if k % 2 == 0 {
                held.push(r.handle);
            } else {
                c.deregister(r.handle).unwrap();
            }
            r.lkey
        })
        .collect();
    let trigger = range(RANGES + 10);
    pin.at.store(trigger, SeqCst);
    let queued = Arc::new(AtomicUsize::new(0));
    let (c2, q2) = (Arc::downgrade(&c), queued.clone());
    *pin.action.lock().unwrap() = Some(Box::new(move || {
        let c = c2.upgrade().unwrap();
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let c = c.clone();
                std::thread::spawn(move || {
                    if t == 0 {
                        // The range the owner is pinning (PENDING in the index).
                        c.invalidate(trigger + 100, 1);
                    }
                    for k in (t..RANGES).step_by(THREADS) {
                        c.invalidate(range(k), P);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        q2.store(c.queued_invalidations(), SeqCst);
    }));
    let t = c.register(trigger, P, RW).unwrap();
    assert_eq!(
        queued.load(SeqCst),
        QUEUE_CAPACITY,
        "the ring was full while the owner pinned"
    );
    let t2 = c.register(trigger, P, RW).unwrap();
    assert_ne!(
        t2.lkey, t.lkey,
        "the region invalidated while it was pinned was hit"
    );
    let stale: Vec<usize> = (0..RANGES)
        .filter(|&k| {
            let r = c.register(range(k), P, RW).unwrap();
            c.deregister(r.handle).unwrap();
            r.lkey == keys[k]
        })
        .collect();
    assert!(
        stale.is_empty(),
        "{} of {RANGES} invalidated ranges hit: {stale:?}",
        stale.len()
    );
    for h in held.into_iter().chain([t.handle, t2.handle]) {
        c.deregister(h).unwrap();
    }
    assert_eq!(c.stats().in_use, 0);
    assert_eq!(pin.inner.bad_unpins(), 0);
}

/// Several threads each invalidate bursts wider than the ring (together far more than it
/// holds) while others hit and miss: once an `invalidate` returned, no register anywhere may
/// hand out the key of the region it covered. A hitter reads the dead key before it registers
/// (release/acquire), so every key it must not get was dead before its call began.
#[test]
fn bursts_past_the_ring_from_several_threads_never_leave_a_hit() {
    let _s = serial();
    const PER: usize = QUEUE_CAPACITY + 8;
    const INVALIDATORS: usize = 4;
    const RANGES: usize = PER * INVALIDATORS;
    let pin = Arc::new(CountingPinner::new());
    let c = Cache::new(pin.clone(), unbounded(), None);
    let range = |k: usize| (k + 1) * 2 * P;
    // Nobody invalidates it: only an overflow (which invalidates everything) drops it.
    let canary = range(RANGES + 5);
    let first = c.register(canary, P, RW).unwrap();
    c.deregister(first.handle).unwrap();
    let dead: Arc<Vec<AtomicU32>> = Arc::new((0..RANGES).map(|_| AtomicU32::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let hitters: Vec<_> = (0..3)
        .map(|t| {
            let (c, dead, stop) = (c.clone(), dead.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = t * 7;
                let mut n = 0u64;
                while !stop.load(SeqCst) {
                    let k = i % RANGES;
                    i += 5;
                    let gone = dead[k].load(SeqCst);
                    let r = c.register(range(k), P, RW).unwrap();
                    assert_ne!(r.lkey, gone, "range {k}: a hit after invalidate returned");
                    c.deregister(r.handle).unwrap();
                    n += 1;
                }
                n
            })
        })
        .collect();
    let invalidators: Vec<_> = (0..INVALIDATORS)
        .map(|t| {
            let (c, dead) = (c.clone(), dead.clone());
            std::thread::spawn(move || {
                let mine = t * PER..(t + 1) * PER;
                let t0 = Instant::now();
                let mut rounds = 0;
                while t0.elapsed() < Duration::from_millis(1500) {
                    let keys: Vec<(usize, u32)> = mine
                        .clone()
                        .map(|k| {
                            let r = c.register(range(k), P, RW).unwrap();
                            c.deregister(r.handle).unwrap();
                            (k, r.lkey)
                        })
                        .collect();
                    for &(k, _) in &keys {
                        c.invalidate(range(k), P);
                    }
                    for &(k, key) in &keys {
                        dead[k].store(key, SeqCst);
                    }
                    rounds += 1;
                }
                rounds
            })
        })
        .collect();
    let rounds: usize = invalidators.into_iter().map(|h| h.join().unwrap()).sum();
    stop.store(true, SeqCst);
    let hits: u64 = hitters.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(
        rounds > 4 && hits > 100,
        "rounds {rounds}, hitter calls {hits}"
    );
    let last = c.register(canary, P, RW).unwrap();
    assert_ne!(
        last.lkey, first.lkey,
        "the ring never overflowed: the test did not reach the limit"
    );
    c.deregister(last.handle).unwrap();
    assert_eq!(c.stats().in_use, 0);
    assert_eq!(pin.bad_unpins(), 0);
}

/// More threads alive at once than a cache has reader slots (128, slot 0 shared by the rest),
/// each hitting its own range, invalidating it, and invalidating others' ranges: a register
/// after its own `invalidate` returned is always a miss, every key handed out is one pinned for
/// that thread's range, and the hits counted through the shared slot are exactly the hits seen
/// (a hit is the same key as this thread's previous registration: every pin has a new key).
#[test]
fn threads_beyond_the_reader_slots_never_hit_what_they_invalidated() {
    let _s = serial();
    const THREADS: usize = 160;
    const ROUNDS: usize = 10;
    const HITS: usize = 300;
    let pin = Arc::new(CountingPinner::new());
    let c = Cache::new(pin.clone(), unbounded(), None);
    let range = |t: usize| (t + 1) * 8 * P;
    let all_in = Arc::new(Barrier::new(THREADS));
    let hs: Vec<_> = (0..THREADS)
        .map(|t| {
            let (c, pin, all_in) = (c.clone(), pin.clone(), all_in.clone());
            std::thread::spawn(move || {
                let mut last = 0u32;
                let mut hits = 0u64;
                let mut check = |r: &firehose::cache::Registration| {
                    let rec = pin.record(r.lkey).map(|p| p.addr);
                    assert_eq!(
                        rec,
                        Some(range(t)),
                        "thread {t}: key {} is not a pin of its range",
                        r.lkey
                    );
                    if r.lkey == last {
                        hits += 1;
                    }
                    last = r.lkey;
                };
                // The first register takes this thread's reader id (or slot 0 when none is
                // left); the barrier keeps all of them alive together from here on.
                let r = c.register(range(t), P, RW).unwrap();
                check(&r);
                c.deregister(r.handle).unwrap();
                all_in.wait();
                for round in 0..ROUNDS {
                    // Hits only (nobody invalidates now): the fast path, many threads on the
                    // shared slot at once.
                    all_in.wait();
                    for _ in 0..HITS {
                        let a = c.register(range(t), P, RW).unwrap();
                        check(&a);
                        c.deregister(a.handle).unwrap();
                    }
                    all_in.wait();
                    let b = c.register(range(t), P, RW).unwrap();
                    check(&b);
                    // Another thread's memory goes away (it may lose a hit, never gain one).
                    if t % 4 == 0 {
                        let o = (t + 1 + round) % THREADS;
                        c.invalidate(range(o), P);
                    }
                    c.invalidate(range(t), P);
                    let after = c.register(range(t), P, RW).unwrap();
                    assert_ne!(
                        after.lkey, b.lkey,
                        "thread {t} round {round}: a hit after its invalidate returned"
                    );
                    check(&after);
                    c.deregister(after.handle).unwrap();
                    c.deregister(b.handle).unwrap();
                }
                all_in.wait();
                hits
            })
        })
        .collect();
    let seen: u64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
    let s = c.stats();
    assert_eq!(
        s.hits, seen,
        "hits counted (shared slot included) vs hits seen"
    );
    assert!(seen > 0, "no hit at all: the test checked nothing");
    assert_eq!(s.in_use, 0);
    assert_eq!(pin.bad_unpins(), 0);
}

// Made-up high ranges nothing in this process maps or unmaps.
const LOG_BASE: usize = 0x7eef_0000_0000;
const AHEAD_BASE: usize = 0x7dde_0000_0000;

/// An unmap still running after more newer ones than the log has slots (64): its slot now
/// holds another unmap, but it must still count as in flight (a pin ahead of its range would
/// land on whatever is mapped there next), and a mark taken now must cover it (come before it,
/// or be so old that every range reads as raced).
#[test]
fn an_unmap_older_than_the_log_still_counts_as_in_flight() {
    let _s = serial();
    let (a, b) = (LOG_BASE, LOG_BASE + 0x1000);
    let old = unmap_log::begin(a, b);
    // More newer unmaps than slots, of other ranges: some still running, the rest ended.
    let newer: Vec<u64> = (0..70)
        .map(|i| {
            let s = LOG_BASE + 0x10_0000 + i * 0x1000;
            unmap_log::begin(s, s + 0x1000)
        })
        .collect();
    let running_then = unmap_log::in_flight_overlapping(a, b);
    let mark_then = unmap_log::mark_before_unfinished();
    for s in newer {
        unmap_log::end(s);
    }
    let running_after = unmap_log::in_flight_overlapping(a, b);
    let mark_after = unmap_log::mark_before_unfinished();
    unmap_log::end(old);
    assert!(running_then, "70 newer unmaps in flight hid the old one");
    assert!(
        running_after,
        "the old unmap's slot was overwritten by ended ones: it still runs"
    );
    // A mark at or before the old unmap, or one so old that every range reads as raced.
    for (m, when) in [(mark_then, "in flight"), (mark_after, "ended")] {
        assert!(
            unmap_log::begun_since(m, a, b),
            "the mark taken with the newer unmaps {when} is after the old one"
        );
    }
}

/// The pins-ahead table full (64 pins ahead at once): the next pin ahead is refused (the helper
/// then does not pin), and each pin it holds, the first taken included, still makes an
/// overlapping unmap wait until that pin ends. Once one ends, a slot is free again.
#[test]
fn a_full_pins_ahead_table_refuses_the_next_and_still_holds_unmaps() {
    let _s = serial();
    let slot_range = |i: usize| (AHEAD_BASE + i * 0x10000, AHEAD_BASE + i * 0x10000 + 0x8000);
    let (filled_tx, filled_rx) = std::sync::mpsc::channel::<usize>();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let released = Arc::new(AtomicBool::new(false));
    let r2 = released.clone();
    let holder = std::thread::spawn(move || {
        let mut held = Vec::new();
        while let Some(g) = {
            let (s, e) = slot_range(held.len());
            pins_ahead::enter(s, e)
        } {
            held.push(g);
            assert!(held.len() <= 1024, "the table never filled up");
        }
        filled_tx.send(held.len()).unwrap();
        go_rx.recv().unwrap();
        // Keep the pins a while longer, so the unmaps below really wait.
        std::thread::sleep(Duration::from_millis(100));
        r2.store(true, SeqCst);
        drop(held);
    });
    let n = filled_rx.recv().unwrap();
    assert!(n >= 1, "no slot at all");
    let refused = pins_ahead::enter(AHEAD_BASE + 0x1000_0000, AHEAD_BASE + 0x1000_8000);
    assert!(refused.is_none(), "a pin ahead past the table's {n} slots");
    go_tx.send(()).unwrap();
    let (s0, _) = slot_range(0);
    let t = Instant::now();
    assert!(
        pins_ahead::wait_for_overlapping(s0 + 0x1000, s0 + 0x2000),
        "the first pin of a full table did not make an unmap wait"
    );
    assert!(released.load(SeqCst), "the wait ended before the pin did");
    assert!(
        t.elapsed() < Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
    holder.join().unwrap();
    let again = pins_ahead::enter(AHEAD_BASE, AHEAD_BASE + 0x1000);
    assert!(again.is_some(), "slots free again once the pins ended");
}
