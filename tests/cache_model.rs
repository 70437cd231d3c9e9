//! Property test of the pin-down cache against a simple model, plus a multithreaded stress test.
//!
//! The counting double gives every pin a unique serial (= lkey), so every registration can be
//! traced back to the exact pin that served it: where, with which rights, and when. The model
//! keeps the invalidation history and the live handles and checks, after every step:
//! no stale hit, containment + access, refcounts (in_use), pinned bytes == the double's live
//! bytes, counter identities, and the bounds whenever nothing is in use.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use firehose::cache::CacheError::{self, *};
use firehose::cache::{Cache, Limits, Registration};
use firehose::pin::counting::CountingPinner;
use firehose::pin::{Access, PinError, Pinned, Pinner};
use proptest::prelude::*;

const P: usize = 4096;

#[derive(Debug, Clone)]
enum Op {
    Register {
        page: usize,
        off: usize,
        len: usize,
        access: u32,
    },
    Deregister(usize),
    DoubleDeregister(usize),
    Bogus(u64),
    Invalidate {
        page: usize,
        pages: usize,
    },
    SetLimits {
        pages: usize,
        regions: usize,
    },
    Flush,
    Budget(Option<usize>),
    FailAll,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (1usize..40, 0usize..P, 1usize..4 * P, 0u32..16)
            .prop_map(|(page, off, len, access)| Op::Register { page, off, len, access }),
        1 => (0usize..P, 0usize..4).prop_map(|(off, _)| Op::Register { page: 1, off, len: 0, access: 1 }),
        1 => Just(Op::Register { page: 3, off: 0, len: 1, access: 32 }),
        5 => any::<usize>().prop_map(Op::Deregister),
        1 => any::<usize>().prop_map(Op::DoubleDeregister),
        1 => any::<u64>().prop_map(Op::Bogus),
        3 => (0usize..44, 1usize..6).prop_map(|(page, pages)| Op::Invalidate { page, pages }),
        1 => (1usize..40, 1usize..10).prop_map(|(pages, regions)| Op::SetLimits { pages, regions }),
        1 => Just(Op::Flush),
        1 => prop::option::of(1usize..30).prop_map(Op::Budget),
        1 => Just(Op::FailAll),
    ]
}

struct Model {
    live: Vec<(Registration, usize, usize, Access)>, // registration, aligned start/end, access
    released: Vec<u64>,
    invals: Vec<(usize, usize, usize)>, // (step, start, end)
    first_seen: HashMap<u32, usize>,    // serial -> step at which it was pinned
    valid_calls: u64,
    ok_hits: u64,
    ok_misses: u64,
    limits: Limits,
}

fn check_step(c: &Cache, pin: &CountingPinner, m: &Model) -> Result<(), TestCaseError> {
    let s = c.stats();
    prop_assert_eq!(pin.bad_unpins(), 0, "double or wrong unpin");
    prop_assert_eq!(s.pinned_bytes, pin.live_bytes() as u64);
    prop_assert_eq!(s.regions, pin.live_count() as u64);
    prop_assert!(s.pinned_peak >= s.pinned_bytes);
    let live_serials: BTreeSet<u32> = pin.live().iter().map(|r| r.serial).collect();
    let held: BTreeSet<u32> = m.live.iter().map(|(r, ..)| r.lkey).collect();
    prop_assert!(
        held.is_subset(&live_serials),
        "a held registration was unpinned"
    );
    prop_assert_eq!(s.in_use, held.len() as u64, "in_use = regions with holders");
    prop_assert_eq!(s.hits + s.misses, m.valid_calls);
    prop_assert_eq!(s.hits, m.ok_hits);
    prop_assert_eq!(s.misses - s.pin_failures, m.ok_misses);
    prop_assert_eq!(pin.pins(), m.ok_misses, "one pin per successful miss");
    if m.live.is_empty() {
        prop_assert!(
            s.pinned_bytes as usize <= m.limits.max_pinned,
            "{:?} {:?}",
            s,
            m.limits
        );
        prop_assert!(
            s.regions as usize <= m.limits.max_regions,
            "{:?} {:?}",
            s,
            m.limits
        );
    }
    Ok(())
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let pin = Arc::new(CountingPinner::new());
    let limits = Limits {
        max_pinned: 24 * P,
        max_regions: 6,
    };
    let c = Cache::new(pin.clone(), limits, None);
    let mut m = Model {
        live: vec![],
        released: vec![],
        invals: vec![],
        first_seen: HashMap::new(),
        valid_calls: 0,
        ok_hits: 0,
        ok_misses: 0,
        limits,
    };
    let mut fail_all_was_set = false;
    for (step, op) in ops.into_iter().enumerate() {
        if fail_all_was_set {
            pin.set_fail_all(false);
            fail_all_was_set = false;
        }
        match op {
            Op::Register {
                page,
                off,
                len,
                access,
            } => {
                let addr = page * P + off;
                let access = Access(access);
                let res = c.register(addr, len, access);
                let (s, e) = (addr & !(P - 1), (addr + len + P - 1) & !(P - 1));
                let expect_invalid = len == 0 || !access.is_valid() || e - s > m.limits.max_pinned;
                match res {
                    Ok(r) => {
                        prop_assert!(!expect_invalid);
                        prop_assert_eq!((r.addr, r.len), (addr, len));
                        m.valid_calls += 1;
                        let rec = pin.record(r.lkey).expect("key from the double");
                        prop_assert!(rec.addr <= s && e <= rec.addr + rec.len, "containment");
                        prop_assert!(rec.access.covers(access), "access rights");
                        let pinned_at = *m.first_seen.entry(r.lkey).or_insert(step);
                        if pinned_at == step {
                            m.ok_misses += 1;
                        } else {
                            m.ok_hits += 1;
                        }
                        for &(t, is, ie) in &m.invals {
                            prop_assert!(
                                !(t > pinned_at && is < rec.addr + rec.len && rec.addr < ie),
                                "stale hit: region {:?} pinned at step {} overlaps invalidation \
                                 [{:#x},{:#x}) at step {}",
                                rec,
                                pinned_at,
                                is,
                                ie,
                                t
                            );
                        }
                        m.live.push((r, s, e, access));
                    }
                    Err(ZeroLength | BadAccess | TooLarge) => {
                        prop_assert!(expect_invalid, "{:?}", res)
                    }
                    Err(NoMemory | PinFailed) => {
                        prop_assert!(!expect_invalid);
                        m.valid_calls += 1;
                    }
                    Err(e) => prop_assert!(false, "unexpected {:?}", e),
                }
            }
            Op::Deregister(i) => {
                if !m.live.is_empty() {
                    let (r, ..) = m.live.swap_remove(i % m.live.len());
                    prop_assert_eq!(c.deregister(r.handle), Ok(()));
                    m.released.push(r.handle);
                }
            }
            Op::DoubleDeregister(i) => {
                if !m.released.is_empty() {
                    let h = m.released[i % m.released.len()];
                    prop_assert_eq!(c.deregister(h), Err(UnknownHandle));
                }
            }
            Op::Bogus(h) => {
                if !m.live.iter().any(|(r, ..)| r.handle == h) {
                    prop_assert_eq!(c.deregister(h), Err(UnknownHandle));
                }
            }
            Op::Invalidate { page, pages } => {
                c.invalidate(page * P + 7, pages * P - 7);
                m.invals.push((step, page * P, (page + pages) * P));
            }
            Op::SetLimits { pages, regions } => {
                m.limits = Limits {
                    max_pinned: pages * P,
                    max_regions: regions,
                };
                c.set_limits(m.limits);
                prop_assert_eq!(c.limits(), m.limits);
            }
            Op::Flush => {
                let before = pin.live_count();
                let n = c.flush();
                prop_assert_eq!(pin.live_count(), before - n);
                let held: BTreeSet<u32> = m.live.iter().map(|(r, ..)| r.lkey).collect();
                prop_assert_eq!(
                    pin.live_count(),
                    held.len(),
                    "flush leaves exactly the held regions"
                );
            }
            Op::Budget(b) => pin.set_budget(b.map(|p| p * P)),
            Op::FailAll => {
                pin.set_fail_all(true);
                fail_all_was_set = true;
            }
        }
        check_step(&c, &pin, &m)?;
    }
    // Refcounts are consistent: releasing everything leaves nothing in use, flush unpins all.
    for (r, ..) in m.live.drain(..) {
        prop_assert_eq!(c.deregister(r.handle), Ok(()));
    }
    prop_assert_eq!(c.stats().in_use, 0);
    c.flush();
    prop_assert_eq!(pin.live_count(), 0);
    prop_assert_eq!(c.stats().pinned_bytes, 0);
    drop(c);
    prop_assert_eq!(pin.bad_unpins(), 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
    #[test]
    fn cache_matches_model(ops in prop::collection::vec(op(), 1..120)) {
        run(ops)?;
    }
}

/// Pinner wrapper stamping each pin with a global logical time taken after the pin completed.
struct Timed {
    inner: CountingPinner,
    clock: Arc<AtomicU64>,
    at: Mutex<HashMap<u32, u64>>,
}

impl Pinner for Timed {
    fn pin(&self, addr: usize, len: usize, access: Access) -> Result<Pinned, PinError> {
        let p = self.inner.pin(addr, len, access)?;
        let t = self.clock.fetch_add(1, Ordering::SeqCst);
        self.at.lock().unwrap().insert(p.lkey, t);
        Ok(p)
    }
    fn unpin(&self, p: Pinned, addr: usize, len: usize) {
        self.inner.unpin(p, addr, len)
    }
    fn name(&self) -> &'static str {
        "timed"
    }
}

#[test]
fn threads_register_while_another_invalidates() {
    const THREADS: usize = 8;
    const OPS: usize = 20_000;
    let clock = Arc::new(AtomicU64::new(1));
    let pin = Arc::new(Timed {
        inner: CountingPinner::new(),
        clock: clock.clone(),
        at: Mutex::new(HashMap::new()),
    });
    let c = Cache::new(
        pin.clone(),
        Limits {
            max_pinned: 64 * P,
            max_regions: 24,
        },
        None,
    );
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Ranges the invalidator pushed so far: workers keep going until it has really run (on a
    // loaded host a fast cache could otherwise finish before the invalidator is scheduled).
    let pushed = Arc::new(std::sync::atomic::AtomicUsize::new(0));

    let inv = {
        let (c, clock, stop, pushed) = (c.clone(), clock.clone(), stop.clone(), pushed.clone());
        std::thread::spawn(move || {
            let mut log = vec![];
            let mut rng = fastrand::Rng::with_seed(99);
            while !stop.load(Ordering::Relaxed) {
                let page = rng.usize(..64);
                let ts = clock.fetch_add(1, Ordering::SeqCst);
                c.invalidate(page * P, 2 * P);
                let te = clock.fetch_add(1, Ordering::SeqCst);
                log.push((ts, te, page * P, page * P + 2 * P));
                pushed.fetch_add(1, Ordering::Relaxed);
                std::thread::yield_now();
            }
            log
        })
    };
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (c, clock, pushed) = (c.clone(), clock.clone(), pushed.clone());
            std::thread::spawn(move || {
                let mut log = vec![];
                let mut held: Vec<Registration> = vec![];
                let mut rng = fastrand::Rng::with_seed(t as u64 + 1);
                for i in 0..50 * OPS {
                    if i >= OPS && pushed.load(Ordering::Relaxed) >= 100 {
                        break;
                    }
                    let r = rng.u64(..) >> 33;
                    if r % 3 != 0 || held.is_empty() {
                        let page = r as usize % 64;
                        let len = 1 + (r as usize >> 8) % (3 * P);
                        let access = Access((r >> 20) as u32 & 15);
                        let t0 = clock.fetch_add(1, Ordering::SeqCst);
                        match c.register(page * P, len, access) {
                            Ok(reg) => {
                                log.push((t0, reg.lkey, page * P, page * P + len, access));
                                held.push(reg);
                            }
                            Err(e) => assert_eq!(e, CacheError::NoMemory, "unexpected"),
                        }
                    } else {
                        let reg = held.swap_remove(r as usize % held.len());
                        assert_eq!(c.deregister(reg.handle), Ok(()));
                        assert_eq!(c.deregister(reg.handle), Err(UnknownHandle));
                    }
                    if held.len() > 4 {
                        let reg = held.remove(0);
                        c.deregister(reg.handle).unwrap();
                    }
                }
                for reg in held {
                    c.deregister(reg.handle).unwrap();
                }
                log
            })
        })
        .collect();
    let logs: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    stop.store(true, Ordering::Relaxed);
    let invals = inv.join().unwrap();
    assert!(
        invals.len() >= 100,
        "the invalidator ran ({} ranges)",
        invals.len()
    );

    let at = pin.at.lock().unwrap().clone();
    let mut checked = 0;
    for (t0, lkey, s, e, access) in logs.into_iter().flatten() {
        let rec = pin.inner.record(lkey).unwrap();
        assert!(rec.addr <= s && e <= rec.addr + rec.len && rec.access.covers(access));
        let tp = at[&lkey];
        // The invalidator's log is ordered by time, so the invalidations that started after the
        // pin and returned before the registration began are one contiguous slice.
        let lo = invals.partition_point(|&(ts, ..)| ts <= tp);
        let hi = invals.partition_point(|&(_, te, ..)| te < t0);
        for &(ts, te, is, ie) in invals.get(lo..hi.max(lo)).unwrap_or(&[]) {
            assert!(
                !(is < rec.addr + rec.len && rec.addr < ie),
                "stale hit: pin {rec:?} at {tp}, invalidated [{is:#x},{ie:#x}) during {ts}..{te}, \
                 registered at {t0}"
            );
        }
        checked += 1;
    }
    assert!(checked > THREADS * OPS / 2);
    let s = c.stats();
    assert_eq!(s.in_use, 0);
    assert_eq!(s.pinned_bytes, pin.inner.live_bytes() as u64);
    assert_eq!(s.regions, pin.inner.live_count() as u64);
    assert!(s.regions <= 24 && s.pinned_bytes <= 64 * P as u64, "{s:?}");
    assert!(s.hits > 0 && s.invalidations > 0, "{s:?}");
    c.flush();
    assert_eq!(pin.inner.live_count(), 0);
    assert_eq!(pin.inner.bad_unpins(), 0);
}

/// Lock-free pin double: one live flag per serial, so a checking reader adds no fence of its own
/// (a mutex in the double would hide store-load reordering in the reader protocol).
struct Flags {
    next: AtomicU64,
    live: Vec<std::sync::atomic::AtomicBool>,
    bad: AtomicU64,
}

impl Pinner for Flags {
    fn pin(&self, _addr: usize, _len: usize, _access: Access) -> Result<Pinned, PinError> {
        let s = self.next.fetch_add(1, Ordering::Relaxed) as usize % self.live.len();
        self.live[s].store(true, Ordering::Release);
        Ok(Pinned {
            token: s,
            lkey: s as u32,
            rkey: s as u32,
        })
    }
    fn unpin(&self, p: Pinned, _addr: usize, _len: usize) {
        if !self.live[p.token].swap(false, Ordering::AcqRel) {
            self.bad.fetch_add(1, Ordering::Relaxed);
        }
    }
    fn name(&self) -> &'static str {
        "flags"
    }
}

/// The reader/writer window of the hit path: readers hit one region non-stop while a writer
/// misses on other addresses, so every miss runs the eviction hand (and index mutations) as a
/// writer. If a reader could be inside its section unseen by the writer (e.g. its "entered"
/// store not yet visible and no barrier), the writer could evict and unpin the region the reader
/// is acquiring: the reader would then hold a handle on an unpinned range.
#[test]
fn hits_race_evicting_writer() {
    const READERS: usize = 2;
    let pin = Arc::new(Flags {
        next: AtomicU64::new(0),
        live: (0..1 << 20)
            .map(|_| std::sync::atomic::AtomicBool::new(false))
            .collect(),
        bad: AtomicU64::new(0),
    });
    let c = Cache::new(
        pin.clone(),
        Limits {
            max_pinned: 1 << 30,
            // Every miss evicts every idle region: the readers' regions are evicted whenever
            // they are idle, i.e. right between two hits.
            max_regions: 1,
        },
        None,
    );
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..READERS)
        .map(|t| {
            let (c, pin, stop) = (c.clone(), pin.clone(), stop.clone());
            std::thread::spawn(move || {
                let (mut hits, mut stale) = (0u64, 0u64);
                let addr = (1 + t) * 16 * P;
                while !stop.load(Ordering::Relaxed) {
                    let r = c.register(addr, P, Access(1)).unwrap();
                    if !pin.live[r.lkey as usize].load(Ordering::Acquire) {
                        stale += 1;
                    }
                    hits += 1;
                    c.deregister(r.handle).unwrap();
                }
                (hits, stale)
            })
        })
        .collect();
    let writer = {
        let c = c.clone();
        std::thread::spawn(move || {
            for i in 0..60_000usize {
                let r = c.register((100 + i % 64) * P, P, Access(1)).unwrap();
                c.deregister(r.handle).unwrap();
            }
        })
    };
    writer.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    let (mut hits, mut stale) = (0, 0);
    for h in readers {
        let (a, b) = h.join().unwrap();
        hits += a;
        stale += b;
    }
    assert!(hits > 1000, "readers ran ({hits} ops)");
    assert_eq!(stale, 0, "handles on unpinned ranges ({hits} ops)");
    assert_eq!(pin.bad.load(Ordering::Relaxed), 0, "double unpin");
    c.flush();
    let s = c.stats();
    assert_eq!((s.in_use, s.regions, s.pinned_bytes), (0, 0, 0), "{s:?}");
}
