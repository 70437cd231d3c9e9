//! Unit tests of the cache core against the counting double (fake addresses: the double never
//! touches memory).

use std::sync::Arc;

use super::CacheError::*;
use super::{Cache, Limits, QUEUE_CAPACITY};
use crate::pin::counting::CountingPinner;
use crate::pin::Access;

const P: usize = 4096;
const RW: Access = Access(1 | 2);
const R: Access = Access::REMOTE_READ;

fn cache(max_pinned: usize, max_regions: usize) -> (Arc<CountingPinner>, Arc<Cache>) {
    let pin = Arc::new(CountingPinner::new());
    let c = Cache::new(
        pin.clone(),
        Limits {
            max_pinned,
            max_regions,
        },
        None,
    );
    (pin, c)
}

#[test]
fn validation_errors_change_nothing() {
    let (pin, c) = cache(1 << 30, 100);
    assert_eq!(c.register(P, 0, R), Err(ZeroLength));
    assert_eq!(c.register(usize::MAX - 5, 10, R), Err(Overflow));
    assert_eq!(
        c.register(usize::MAX - 5, 3, R),
        Err(Overflow),
        "page round-up overflows"
    );
    assert_eq!(c.register(P, 10, Access(16)), Err(BadAccess));
    assert_eq!(c.register(P, (1 << 30) + 1, R), Err(TooLarge));
    assert_eq!(c.deregister(12345), Err(UnknownHandle));
    assert_eq!(pin.attempts(), 0);
    assert_eq!(c.stats(), Default::default());
}

#[test]
fn hit_after_lazy_release_and_exact_addr_returned() {
    let (pin, c) = cache(1 << 30, 100);
    let a = c.register(P + 100, 50, RW).unwrap();
    assert_eq!((a.addr, a.len), (P + 100, 50));
    let rec = pin.record(a.lkey).unwrap();
    assert_eq!((rec.addr, rec.len), (P, P));
    c.deregister(a.handle).unwrap();
    assert_eq!(c.deregister(a.handle), Err(UnknownHandle));
    let b = c.register(P + 8, 8, Access::REMOTE_WRITE).unwrap();
    assert_eq!(b.lkey, a.lkey, "contained + covered access = hit");
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.regions, s.in_use), (1, 1, 1, 1));
    assert_eq!(s.pinned_bytes, P as u64);
    c.deregister(b.handle).unwrap();
    assert_eq!(c.stats().in_use, 0);
    assert_eq!(c.flush(), 1);
    assert_eq!(pin.live_count(), 0);
}

#[test]
fn a_key_never_grants_more_remote_rights_than_asked() {
    let (pin, c) = cache(1 << 30, 100);
    let rd = Access(Access::LOCAL_WRITE.0 | R.0);
    let a = c.register(P, P, rd).unwrap();
    let b = c.register(P, 2 * P, Access::REMOTE_WRITE).unwrap();
    assert_ne!(a.lkey, b.lkey);
    let rb = pin.record(b.lkey).unwrap();
    assert_eq!((rb.addr, rb.len), (P, 2 * P));
    assert_eq!(rb.access, Access::REMOTE_WRITE, "no union of remote rights");
    // The read region left the index (it overlaps) but stays pinned for its holder, then goes.
    assert_eq!(pin.live_count(), 2);
    c.deregister(a.handle).unwrap();
    assert_eq!(pin.live_count(), 1);
    // A read request over the write region is a miss: its rkey would also allow remote write.
    let r2 = c.register(P, P, R).unwrap();
    assert_ne!(
        r2.lkey, b.lkey,
        "a remote-write key served a remote-read request"
    );
    assert_eq!(pin.record(r2.lkey).unwrap().access, R);
    // Nor the other way round, and no remote rights at all is a class of its own too.
    let w2 = c.register(P, P, Access::REMOTE_WRITE).unwrap();
    assert_ne!(w2.lkey, r2.lkey);
    let l = c.register(P, P, Access::LOCAL_WRITE).unwrap();
    assert_eq!(pin.record(l.lkey).unwrap().access.0 & Access::REMOTE.0, 0);
    for h in [b.handle, r2.handle, w2.handle, l.handle] {
        c.deregister(h).unwrap();
    }
}

#[test]
fn same_remote_rights_merge_and_local_rights_are_a_superset() {
    let (pin, c) = cache(1 << 30, 100);
    let a = c.register(P, 2 * P, R).unwrap();
    let b = c
        .register(2 * P, 2 * P, Access(Access::LOCAL_WRITE.0 | R.0))
        .unwrap();
    let rb = pin.record(b.lkey).unwrap();
    assert_eq!(
        (rb.addr, rb.len),
        (P, 3 * P),
        "same remote class: union of extents"
    );
    assert_eq!(rb.access, Access(Access::LOCAL_WRITE.0 | R.0));
    c.deregister(a.handle).unwrap();
    let h = c.register(P, P, R).unwrap();
    assert_eq!(
        h.lkey, b.lkey,
        "more local rights, same remote rights: a hit"
    );
    c.deregister(h.handle).unwrap();
    c.deregister(b.handle).unwrap();
}

#[test]
fn invalidate_in_use_and_idle_and_old_handle_after_reuse() {
    let (pin, c) = cache(1 << 30, 100);
    let a = c.register(P, P, RW).unwrap();
    let idle = c.register(10 * P, P, RW).unwrap();
    c.deregister(idle.handle).unwrap();
    c.invalidate(P, 1);
    c.invalidate(10 * P, P);
    // Idle invalidated region is unpinned at the next call, not inside invalidate.
    assert_eq!(pin.live_count(), 2);
    let b = c.register(P, P, RW).unwrap();
    assert_ne!(a.lkey, b.lkey, "no stale hit after invalidate");
    assert_eq!(pin.live_count(), 2, "a (in use) and b");
    assert_eq!(c.stats().invalidations, 2);
    // Case 12: the old handle only drops the old region.
    c.deregister(a.handle).unwrap();
    assert_eq!(pin.live_count(), 1);
    let b2 = c.register(P, P, RW).unwrap();
    assert_eq!(b2.lkey, b.lkey);
    assert_eq!(pin.bad_unpins(), 0);
}

/// With a helper (`defer_unpins`), the last release of a detached region leaves its unpin to the
/// helper's queue; `flush` unpins those too. (It did not: the shim's `ibv_dealloc_pd`, which
/// flushes first, then failed with EBUSY on a registration only that queue still held; found by
/// review.)
#[test]
fn flush_unpins_what_waits_for_the_helper() {
    let (pin, c) = cache(1 << 30, 100);
    c.defer_unpins();
    let a = c.register(P, P, RW).unwrap();
    c.invalidate(P, P); // detached while in use
    c.register(20 * P, P, RW).unwrap(); // any call drains the invalidation
    c.deregister(a.handle).unwrap(); // last holder: queued for the helper
    assert_eq!(pin.live_count(), 2, "a waits in the helper's queue");
    c.flush();
    assert_eq!(
        pin.live_count(),
        1,
        "flush unpinned a (the other is in use)"
    );
    assert_eq!(c.unpin_deferred(), 0, "and left nothing queued");
    assert_eq!(pin.bad_unpins(), 0);
}

#[test]
fn lru_bounds_and_too_large() {
    let (pin, c) = cache(4 * P, 3);
    let mut keys = vec![];
    for i in 0..5 {
        let r = c.register(i * 2 * P, P, R).unwrap();
        keys.push(r.lkey);
        c.deregister(r.handle).unwrap();
    }
    let s = c.stats();
    assert!(s.regions <= 3 && s.pinned_bytes <= 4 * P as u64, "{s:?}");
    assert_eq!(s.evictions, 2);
    // In-use regions are never evicted, even above the bounds.
    let held: Vec<_> = (0..4)
        .map(|i| c.register(100 * P + i * 2 * P, P, R).unwrap())
        .collect();
    assert_eq!(pin.live_count(), 4);
    for h in &held {
        c.deregister(h.handle).unwrap();
    }
    assert!(
        c.stats().regions <= 3,
        "lazy release trims back to the bound"
    );
    c.set_limits(Limits {
        max_pinned: 4 * P,
        max_regions: 1,
    });
    assert_eq!(c.stats().regions, 1);
    assert_eq!(pin.live_count(), 1);
    assert_eq!(c.register(0, 5 * P, R), Err(TooLarge));
}

#[test]
fn no_memory_evicts_and_retries_then_fails() {
    let (pin, c) = cache(1 << 30, 100);
    pin.set_budget(Some(2 * P));
    let a = c.register(0, P, R).unwrap();
    let b = c.register(2 * P, P, R).unwrap();
    c.deregister(a.handle).unwrap();
    let d = c.register(4 * P, P, R).unwrap(); // evicts a
    let s = c.stats();
    assert_eq!((s.pin_retries, s.evictions, s.regions), (1, 1, 2));
    // Everything in use: clear error, no hang.
    assert_eq!(c.register(6 * P, P, R), Err(NoMemory));
    assert_eq!(c.stats().pin_failures, 1);
    pin.set_fail_all(true);
    assert_eq!(c.register(8 * P, P, R), Err(PinFailed));
    c.deregister(b.handle).unwrap();
    c.deregister(d.handle).unwrap();
}

#[test]
fn hook_filter_keeps_the_queue_empty_for_unrelated_ranges() {
    let (_pin, c) = cache(1 << 30, 100);
    let a = c.register(1 << 40, P, R).unwrap();
    // Case 5: many unmaps of memory the cache does not hold leave nothing queued.
    for i in 0..40_000usize {
        c.invalidate((1 << 30) + i * P, P);
    }
    assert_eq!(c.queued_invalidations(), 0);
    // Relevant ones are bounded by the ring, overflow invalidates everything (safe).
    for _ in 0..3 * QUEUE_CAPACITY {
        c.invalidate(1 << 40, P);
    }
    assert!(c.queued_invalidations() <= QUEUE_CAPACITY);
    let b = c.register(1 << 40, P, R).unwrap();
    assert_ne!(a.lkey, b.lkey);
    assert_eq!(c.queued_invalidations(), 0);
}

#[test]
fn drop_unpins_everything() {
    let (pin, c) = cache(1 << 30, 100);
    let a = c.register(0, P, R).unwrap();
    let _b = c.register(4 * P, P, R).unwrap();
    c.deregister(a.handle).unwrap();
    c.invalidate(4 * P, P); // held + invalidated
    let _ = c.register(8 * P, P, R).unwrap();
    drop(c);
    assert_eq!(pin.live_count(), 0);
    assert_eq!(pin.bad_unpins(), 0);
}

#[test]
fn cache_is_send_sync() {
    fn ok<T: Send + Sync>() {}
    ok::<Cache>();
}

#[test]
/// Holding more regions than the bounds allow, then releasing them: the last ones released stay
/// cached (a miss path that refused to cache regions beyond the bounds lost them all here).
fn release_after_overcommit_keeps_the_last_ones_cached() {
    let (pin, c) = cache(64 << 20, 3);
    let buf = |i: usize| 0x10_0000 + i * 8 * P;
    for i in 0..8 {
        let r = c.register(buf(i), 4 * P, RW).unwrap();
        c.deregister(r.handle).unwrap();
    }
    assert_eq!(c.stats().regions, 3);
    let held: Vec<_> = (0..8)
        .map(|i| c.register(buf(i), 4 * P, RW).unwrap())
        .collect();
    let s = c.stats();
    assert_eq!(s.in_use, 8);
    assert_eq!(pin.live_count(), 8);
    for h in &held {
        c.deregister(h.handle).unwrap();
    }
    let s = c.stats();
    assert_eq!(s.regions, 3, "the three cached ones stay");
    // 8 held with room for 3: the other 5 went out uncached and were unpinned at release.
    assert_eq!(s.uncached, 5);
    assert_eq!(s.evictions + s.uncached, s.misses - s.regions);
    c.set_limits(Limits {
        max_pinned: 64 << 20,
        max_regions: 1,
    });
    assert_eq!(c.stats().regions, 1);
    assert_eq!(pin.live_count(), 1);
    assert_eq!(pin.bad_unpins(), 0);
}

#[test]
/// With no room (zero bounds here), a registration is pinned for its holder only: never indexed,
/// so a second request for the same range pins again, and the release unpins at once.
fn no_room_hands_out_uncached_registrations() {
    let (pin, c) = cache(1 << 30, 0);
    let a = c.register(4 * P, P, RW).unwrap();
    let b = c.register(4 * P, P, RW).unwrap();
    assert_ne!(a.lkey, b.lkey, "an uncached region is never hit");
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.uncached), (0, 2, 2));
    assert_eq!((s.regions, s.in_use, s.pinned_bytes), (2, 2, 2 * P as u64));
    // Invalidation while held: the holder's keys stay pinned until its release.
    c.invalidate(4 * P, P);
    assert_eq!(pin.live_count(), 2);
    c.deregister(a.handle).unwrap();
    assert_eq!(
        pin.live_count(),
        1,
        "unpinned at its release, no trim needed"
    );
    c.deregister(b.handle).unwrap();
    let s = c.stats();
    assert_eq!(
        (s.regions, s.in_use, s.pinned_bytes, s.evictions),
        (0, 0, 0, 0)
    );
    assert_eq!(s.pinned_peak, 2 * P as u64);
    assert_eq!(pin.live_count(), 0);
    assert_eq!(pin.bad_unpins(), 0);
    // Raising the bound makes the same range cacheable again.
    c.set_limits(Limits {
        max_pinned: 1 << 30,
        max_regions: 1,
    });
    let d = c.register(4 * P, P, RW).unwrap();
    c.deregister(d.handle).unwrap();
    let e = c.register(4 * P, P, RW).unwrap();
    assert_eq!(e.lkey, d.lkey, "cached once there is room");
    c.deregister(e.handle).unwrap();
}

/// What `HookPinner` runs inside one `pin`: (addr, len) of the range just pinned.
type PinAction = Box<dyn FnOnce(usize, usize) + Send>;

/// The counting double plus a one-shot action run inside `pin`, after the backend pinned: what a
/// hook on another thread (an unmap) or a concurrent reader can do while a miss is pinning.
struct HookPinner {
    inner: CountingPinner,
    during_pin: std::sync::Mutex<Option<PinAction>>,
}

impl crate::pin::Pinner for HookPinner {
    fn pin(
        &self,
        addr: usize,
        len: usize,
        access: Access,
    ) -> Result<crate::pin::Pinned, crate::pin::PinError> {
        let res = self.inner.pin(addr, len, access);
        let action = self.during_pin.lock().unwrap().take();
        if let Some(f) = action {
            f(addr, len);
        }
        res
    }
    fn unpin(&self, pinned: crate::pin::Pinned, addr: usize, len: usize) {
        self.inner.unpin(pinned, addr, len)
    }
    fn name(&self) -> &'static str {
        "hook"
    }
}

fn hook_cache() -> (Arc<HookPinner>, Arc<Cache>) {
    let pin = Arc::new(HookPinner {
        inner: CountingPinner::new(),
        during_pin: std::sync::Mutex::new(None),
    });
    let limits = Limits {
        max_pinned: 1 << 30,
        max_regions: 100,
    };
    let c = Cache::new(pin.clone(), limits, None);
    (pin, c)
}

#[test]
/// An unmap reported while the miss is pinning (after the backend pinned the old pages) must not
/// leave the region cached: its caller gets it, the next request pins again.
fn invalidation_during_the_pin_is_not_lost() {
    let (pin, c) = hook_cache();
    let weak = Arc::downgrade(&c);
    *pin.during_pin.lock().unwrap() = Some(Box::new(move |a, l| {
        weak.upgrade().unwrap().invalidate(a, l);
    }));
    let a = c.register(4 * P, P, RW).unwrap();
    assert_ne!(a.lkey, 0);
    let b = c.register(4 * P, P, RW).unwrap();
    assert_ne!(
        a.lkey, b.lkey,
        "a region invalidated mid-pin was cached and hit"
    );
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.invalidations), (0, 2, 1));
    c.deregister(a.handle).unwrap();
    assert_eq!(
        pin.inner.live_count(),
        1,
        "the stale one is unpinned at its release"
    );
    c.deregister(b.handle).unwrap();
    let d = c.register(4 * P, P, RW).unwrap();
    assert_eq!(d.lkey, b.lkey, "the second one was cached normally");
    c.deregister(d.handle).unwrap();
    assert_eq!(pin.inner.bad_unpins(), 0);
}

#[test]
/// A reader that finds the region while the miss that created it is still pinning must not get
/// its placeholder keys: it waits for the miss and then hits the pinned region.
fn reader_during_the_pin_waits_for_the_keys() {
    let (pin, c) = hook_cache();
    let weak = Arc::downgrade(&c);
    let reader = Arc::new(std::sync::Mutex::new(None));
    let slot = reader.clone();
    *pin.during_pin.lock().unwrap() = Some(Box::new(move |a, l| {
        let c2 = weak.upgrade().unwrap();
        let h = std::thread::spawn(move || {
            let r = c2.register(a, l, RW).unwrap();
            c2.deregister(r.handle).unwrap();
            r.lkey
        });
        // Give the reader time to look the range up while the region is still PENDING.
        std::thread::sleep(std::time::Duration::from_millis(50));
        *slot.lock().unwrap() = Some(h);
    }));
    let a = c.register(4 * P, P, RW).unwrap();
    let h = reader.lock().unwrap().take().unwrap();
    assert_eq!(
        h.join().unwrap(),
        a.lkey,
        "the reader must see the pinned keys"
    );
    let s = c.stats();
    assert_eq!((s.hits, s.misses), (1, 1));
    c.deregister(a.handle).unwrap();
}

/// A backend whose next pin panics (armed), else the counting double.
struct PanicOnce {
    inner: CountingPinner,
    armed: std::sync::atomic::AtomicBool,
}

impl crate::pin::Pinner for PanicOnce {
    fn pin(
        &self,
        addr: usize,
        len: usize,
        access: Access,
    ) -> Result<crate::pin::Pinned, crate::pin::PinError> {
        if self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
            panic!("injected backend panic");
        }
        self.inner.pin(addr, len, access)
    }
    fn unpin(&self, pinned: crate::pin::Pinned, addr: usize, len: usize) {
        self.inner.unpin(pinned, addr, len)
    }
    fn name(&self) -> &'static str {
        "panic-once"
    }
}

#[test]
fn a_panic_inside_a_miss_leaves_no_pending_region() {
    let pin = Arc::new(PanicOnce {
        inner: CountingPinner::new(),
        armed: true.into(),
    });
    let c = Cache::new(
        pin.clone(),
        Limits {
            max_pinned: 1 << 30,
            max_regions: 100,
        },
        None,
    );
    let c2 = c.clone();
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || c2.register(P, P, R)));
    assert!(res.is_err(), "the backend's panic reaches the caller");
    // The same call again: a real miss with real keys, not the placeholder of the dead miss.
    let r = c.register(P, P, R).unwrap();
    let rec = pin
        .inner
        .record(r.lkey)
        .expect("keys of a live pin, not a placeholder");
    assert_eq!((rec.addr, rec.len), (P, P));
    let s = c.stats();
    assert_eq!((s.hits, s.regions, s.in_use), (0, 1, 1));
    c.deregister(r.handle).unwrap();
    assert_eq!(c.flush(), 1);
    assert_eq!(pin.inner.live_count(), 0);
}

#[test]
fn a_quarantined_cache_refuses_everything_and_leaves_the_pins_alone() {
    let (pin, c) = cache(1 << 30, 100);
    let held = c.register(P, P, R).unwrap();
    let idle = c.register(4 * P, P, R).unwrap();
    c.deregister(idle.handle).unwrap();
    // What the atfork child handler does (through `MemoryListener::forked`).
    crate::rt::seam::MemoryListener::forked(&*c);
    assert!(c.is_forked());
    assert_eq!(
        c.register(P, P, R),
        Err(Forked),
        "no hit on the parent's pin"
    );
    assert_eq!(c.register(8 * P, P, R), Err(Forked));
    assert_eq!(c.deregister(held.handle), Err(Forked));
    assert_eq!(c.flush(), 0);
    assert_eq!(c.process_invalidations(), 0);
    let attempts = pin.attempts();
    drop(c);
    assert_eq!(pin.attempts(), attempts);
    assert_eq!(
        pin.live_count(),
        2,
        "the parent's pins are not the child's to undo"
    );
}

/// The gate (gate.rs) under threads: once `invalidate` has returned, no thread's register may
/// hand out the keys of the region it covered, whether the range went through the ring or
/// (bursts wider than the ring) through the overflow bit. Hitters learn each invalidated key
/// only after the `invalidate` call returned (release/acquire), then must never get it again.
#[test]
fn no_hit_on_an_invalidated_region_under_threads() {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    const RANGES: usize = 2 * QUEUE_CAPACITY;
    let (_pin, c) = cache(usize::MAX, usize::MAX);
    let dead = Arc::new((0..RANGES).map(|_| AtomicU32::new(0)).collect::<Vec<_>>());
    let stop = Arc::new(AtomicBool::new(false));
    let hitters: Vec<_> = (0..2)
        .map(|t| {
            let (c, dead, stop) = (c.clone(), dead.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    let k = i % RANGES;
                    i += 1;
                    let gone = dead[k].load(Ordering::Acquire);
                    let r = c.register((k + 1) * P, P, RW).unwrap();
                    assert_ne!(r.lkey, gone, "range {k}: a hit after invalidate returned");
                    c.deregister(r.handle).unwrap();
                }
            })
        })
        .collect();
    let t0 = std::time::Instant::now();
    let mut round = 0usize;
    while t0.elapsed() < std::time::Duration::from_millis(1500) {
        // Alternate one range at a time (the ring) and bursts of every range (overflow).
        let burst = if round % 4 == 3 { RANGES } else { 1 };
        let first = round % RANGES;
        let mut keys = Vec::with_capacity(burst);
        for j in 0..burst {
            let k = (first + j) % RANGES;
            let r = c.register((k + 1) * P, P, RW).unwrap();
            c.deregister(r.handle).unwrap();
            keys.push((k, r.lkey));
        }
        for &(k, _) in &keys {
            c.invalidate((k + 1) * P, P);
        }
        for &(k, key) in &keys {
            // Published only after every `invalidate` above returned.
            dead[k].store(key, Ordering::Release);
        }
        round += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for h in hitters {
        h.join().unwrap();
    }
    assert!(round > 10);
}

/// The helper's `prefetch`: pins without a handle (counted apart from hits and misses), a
/// second one finds it cached, and a check that fails after the pin undoes it before anyone
/// could see the region.
#[test]
fn prefetch_pins_ahead_and_a_failed_check_undoes_it() {
    let (pin, c) = cache(1 << 30, 100);
    let yes = || true;
    assert_eq!(c.prefetch(P, 4 * P, RW, &yes), Ok(true));
    assert_eq!(c.prefetch(P, 4 * P, RW, &yes), Ok(false));
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.prefetched, s.in_use), (0, 0, 1, 0));
    let r = c.register(P + 10, 3 * P, RW).unwrap();
    assert_eq!(c.stats().hits, 1, "the caller hits the region pinned ahead");
    c.deregister(r.handle).unwrap();
    assert_eq!(c.evict_range(P, P), 4 * P, "idle: unpinned");
    assert_eq!(pin.live_count(), 0);
    let no = || false;
    assert_eq!(c.prefetch(8 * P, P, RW, &no), Err(Busy));
    assert_eq!((pin.live_count(), pin.bad_unpins()), (0, 0));
    assert_eq!(c.stats().regions, 0);
    let r = c.register(8 * P, P, RW).unwrap();
    assert_eq!(c.stats().misses, 1, "nothing of the undone pin is left");
    // In use: evict_range leaves it alone.
    assert_eq!(c.evict_range(8 * P, P), 0);
    c.deregister(r.handle).unwrap();
    assert_eq!(c.prefetch(0, 0, RW, &yes), Err(ZeroLength));
}
