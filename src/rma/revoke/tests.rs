//! The listener, queue and worker together, over a fake driver whose revocations finish after a
//! few progress rounds (or are held back), unpinning the range from the table as the real core
//! does. The real `Rma` is exercised in the VM (`tests/verbs-suite.d/64-rma-revoke.sh`).

use super::listener::{RevokeListener, Wait};
use super::*;
use crate::rt::seam::UnmapEvent;
use firehose_proto::InvalId;
use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A revocation under way: its id, the pinned ranges it covered when it started, the progress
/// rounds left before it finishes, whether the holder that never acks holds one of them.
type Pending = (u64, Vec<(u64, u64)>, u32, bool);

#[derive(Default)]
struct FakeState {
    next: u64,
    pending: Vec<Pending>,
    done: HashSet<u64>,
    /// Nothing finishes while set.
    hold: bool,
    /// An unmap the worker makes itself at its next progress (as libc trimming a heap), and how
    /// long that call took there.
    worker_unmap: Option<(Arc<Shared>, u64, u64)>,
    worker_unmap_took: Option<Duration>,
    invalidated: Vec<(u64, u64)>,
    /// Ranges (also pinned) that a holder which never acks holds: a revocation covering one
    /// never finishes, until that holder is given up on (`lost`).
    bad: Vec<(u64, u64)>,
    lost: bool,
    /// `Driver::holder_bound`.
    bound: Option<Duration>,
}

#[derive(Clone)]
struct Fake {
    st: Arc<Mutex<FakeState>>,
    pinned: Arc<PinnedRanges>,
    /// Every pinned range the test inserted, to remove the ones a revocation covers.
    all: Arc<Mutex<Vec<(u64, u64)>>>,
}

impl Fake {
    fn new(pinned: Arc<PinnedRanges>) -> Fake {
        Fake {
            st: Arc::default(),
            pinned,
            all: Arc::default(),
        }
    }
    fn pin(&self, a: u64, l: u64) {
        self.pinned.insert(a, l as usize);
        self.all.lock().unwrap().push((a, l));
    }
    fn hold(&self, on: bool) {
        self.st.lock().unwrap().hold = on;
    }
    fn invalidated(&self) -> Vec<(u64, u64)> {
        self.st.lock().unwrap().invalidated.clone()
    }
}

impl Driver for Fake {
    fn invalidate(&self, addr: u64, len: u64) -> Option<InvalId> {
        let mut s = self.st.lock().unwrap();
        s.next += 1;
        let id = s.next;
        // As the core: it revokes the regions pinned now; later pins are not its business.
        let end = addr.saturating_add(len);
        let covered = (self.all.lock().unwrap().iter())
            .filter(|&&(ra, rl)| ra < end && ra + rl > addr)
            .copied()
            .collect();
        let bad = !s.lost && s.bad.iter().any(|&(ba, bl)| ba < end && ba + bl > addr);
        s.pending.push((id, covered, 3, bad));
        s.invalidated.push((addr, len));
        Some(InvalId(id))
    }
    fn is_done(&self, id: InvalId) -> Option<bool> {
        Some(self.st.lock().unwrap().done.contains(&id.0))
    }
    fn progress(&self) -> Option<usize> {
        let unmap = self.st.lock().unwrap().worker_unmap.take();
        if let Some((sh, a, l)) = unmap {
            let t = Instant::now();
            sh.unmapped(a, l, Wait::WhileWorking);
            self.st.lock().unwrap().worker_unmap_took = Some(t.elapsed());
        }
        let mut s = self.st.lock().unwrap();
        if s.hold {
            return Some(0);
        }
        let mut finished = Vec::new();
        let lost = s.lost;
        s.pending.retain_mut(|(id, covered, left, bad)| {
            if *bad && !lost {
                return true;
            }
            *left -= 1;
            if *left == 0 {
                finished.push((*id, std::mem::take(covered)));
                false
            } else {
                true
            }
        });
        let n = finished.len();
        for (id, covered) in finished {
            // As the core does: the regions it covered are unpinned (once), then it is done.
            let mut all = self.all.lock().unwrap();
            for r in covered {
                if let Some(i) = all.iter().position(|&x| x == r) {
                    all.swap_remove(i);
                    assert!(self.pinned.remove(r.0, r.1 as usize));
                }
            }
            s.done.insert(id);
        }
        Some(n + 1)
    }
    fn wait_link(&self, d: Duration) {
        std::thread::sleep(d.min(Duration::from_millis(1)));
    }
    fn probe_peers(&self) {}
    fn probe_every(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn holder_bound(&self) -> Option<Duration> {
        self.st.lock().unwrap().bound
    }
    fn give_up_holders(&self, id: InvalId) -> Option<usize> {
        let mut s = self.st.lock().unwrap();
        let waits_for_bad = s.pending.iter().any(|p| p.0 == id.0 && p.3);
        if waits_for_bad && !s.lost {
            s.lost = true;
            return Some(1);
        }
        Some(0)
    }
}

fn settings(timeout_ms: u64) -> RevokeSettings {
    RevokeSettings {
        enabled: true,
        timeout: Duration::from_millis(timeout_ms),
        ..RevokeSettings::default()
    }
}

/// A revocation with a fake driver, started; its listener is also subscribed (events from other
/// tests reach it: each test uses its own addresses, `base`).
fn started(timeout_ms: u64, slots: usize) -> (Revocation, Fake) {
    let mut r = Revocation::new(settings(timeout_ms), slots);
    let f = Fake::new(r.pinned());
    r.start(Box::new(f.clone())).unwrap();
    (r, f)
}

/// `overlaps`, retried while a writer is busy (Busy is a legitimate answer, not a result).
fn settled(p: &PinnedRanges, a: u64, l: u64) -> Overlap {
    loop {
        match p.overlaps(a, l, 64) {
            Overlap::Busy => std::thread::yield_now(),
            o => return o,
        }
    }
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(20), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn no_overlap_returns_at_once_and_counts() {
    let (r, f) = started(60_000, 8);
    let base = 0x7100_0000_0000;
    f.pin(base, 0x2000);
    f.hold(true); // a wait would never end
    r.shared.unmapped(base + 0x2000, 0x1000, Wait::Full);
    r.shared.unmapped(base - 0x1000, 0x1000, Wait::Full);
    let s = r.stats();
    assert_eq!((s.fast_returns, s.waits, s.started), (2, 0, 0));
    assert!(f.invalidated().is_empty());
}

#[test]
fn overlap_waits_until_revoked_and_unpinned() {
    let (r, f) = started(60_000, 8);
    let base = 0x7200_0000_0000;
    f.pin(base, 0x2000);
    f.hold(true);
    let sh = r.shared.clone();
    let h = std::thread::spawn(move || sh.unmapped(base + 0x1000, 0x1000, Wait::Full));
    wait_until("revocation started", || !f.invalidated().is_empty());
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        !h.is_finished(),
        "the unmapping thread waits while holders have not acked"
    );
    assert_eq!(settled(&r.shared.pinned, base, 1), Overlap::Yes);
    f.hold(false);
    h.join().unwrap();
    assert_eq!(
        settled(&r.shared.pinned, base, 0x2000),
        Overlap::No,
        "unpinned before the unmap returned"
    );
    assert_eq!(f.invalidated(), vec![(base + 0x1000, 0x1000)]);
    let s = r.stats();
    assert_eq!((s.waits, s.started, s.completed, s.timeouts), (1, 1, 1, 0));
    assert_eq!(r.shared.queue.busy(), 0);
}

#[test]
fn inside_late_told_and_before_never_wait() {
    let (r, f) = started(60_000, 8);
    let base = 0x7300_0000_0000;
    f.pin(base, 0x1000);
    f.hold(true);
    let l = RevokeListener(r.shared.clone());
    let t = Instant::now();
    l.on_event(base as usize, 0x1000, UnmapEvent::Before);
    assert_eq!(r.stats().detached, 0, "Before queues nothing");
    l.on_event(base as usize, 0x1000, UnmapEvent::Late);
    l.on_event(base as usize, 0x1000, UnmapEvent::Told);
    {
        let _in = crate::rt::inside::enter();
        l.on_event(base as usize, 0x1000, UnmapEvent::Done);
    }
    assert!(t.elapsed() < Duration::from_secs(10));
    let s = r.stats();
    assert_eq!((s.detached, s.waits), (3, 0));
    wait_until("three started", || r.stats().started == 3);
    f.hold(false);
    wait_until("all done, slots freed", || {
        r.stats().completed == 3 && r.shared.queue.busy() == 0
    });
}

/// A trim waits for a working revoke past the stall limit; a thread inside the library never
/// waits in one, and neither does the worker itself (it could not turn while waiting).
#[test]
fn trims_wait_for_working_revokes_but_never_inside_the_library() {
    let (r, f) = started(60_000, 8);
    let base = 0x7380_0000_0000;
    for i in 0..4 {
        f.pin(base + i * 0x2000, 0x1000);
    }
    let l = RevokeListener(r.shared.clone());
    {
        let _in = crate::rt::inside::enter();
        l.on_event(base as usize, 0x1000, UnmapEvent::DoneInLibcTrim);
    }
    let s = r.stats();
    assert_eq!((s.waits, s.detached), (0, 1), "inside: {s:?}");
    // A worker that keeps turning while its revoke waits 200 ms (4x the stall limit): waited for.
    f.hold(true);
    let f2 = f.clone();
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        f2.hold(false);
    });
    let t = Instant::now();
    l.on_event(base as usize + 0x2000, 0x1000, UnmapEvent::DoneInLibcTrim);
    let took = t.elapsed();
    release.join().unwrap();
    let s = r.stats();
    assert_eq!((s.waits, s.stalls), (1, 0), "{s:?}");
    assert!(took >= Duration::from_millis(190), "{took:?}");
    wait_until("two done", || r.stats().completed == 2);
    // The worker's own trim: queued, not waited for.
    f.st.lock().unwrap().worker_unmap = Some((r.shared.clone(), base + 0x4000, 0x1000));
    // (The worker calls progress only while a revoke runs: start one, detached.)
    l.on_event(base as usize + 0x6000, 0x1000, UnmapEvent::Told);
    wait_until("the worker's unmap ran", || {
        f.st.lock().unwrap().worker_unmap_took.is_some()
    });
    let took = f.st.lock().unwrap().worker_unmap_took.unwrap();
    let s = r.stats();
    assert_eq!((s.waits, s.detached, s.stalls), (1, 3, 0), "{s:?}");
    assert!(
        took < Duration::from_millis(40),
        "the worker did not wait: {took:?}"
    );
    wait_until("all done, slots freed", || {
        r.stats().completed == 4 && r.shared.queue.busy() == 0
    });
}

/// `FH_REVOKE_STALL=0`: a trim never waits (queued, counted as detached, not as a stall).
#[test]
fn zero_stall_never_waits_in_a_trim() {
    let mut r = Revocation::new(
        RevokeSettings {
            stall: Duration::ZERO,
            ..settings(60_000)
        },
        8,
    );
    let f = Fake::new(r.pinned());
    r.start(Box::new(f.clone())).unwrap();
    let base = 0x7390_0000_0000;
    f.pin(base, 0x1000);
    f.hold(true);
    let l = RevokeListener(r.shared.clone());
    l.on_event(base as usize, 0x1000, UnmapEvent::DoneInLibcTrim);
    let s = r.stats();
    assert_eq!((s.waits, s.stalls, s.detached), (0, 0, 1), "{s:?}");
    f.hold(false);
    wait_until("done", || {
        r.stats().completed == 1 && r.shared.queue.busy() == 0
    });
}

#[test]
fn timeout_bounds_the_wait_and_the_revoke_finishes_later() {
    let (r, f) = started(60, 8);
    let base = 0x7400_0000_0000;
    f.pin(base, 0x1000);
    f.hold(true);
    let t = Instant::now();
    r.shared.unmapped(base, 0x1000, Wait::Full);
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(55), "{took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert_eq!(r.stats().timeouts, 1);
    assert_eq!(r.shared.queue.busy(), 1, "the worker still owns it");
    f.hold(false);
    wait_until("orphan freed", || r.shared.queue.busy() == 0);
    assert_eq!(r.stats().completed, 1);
    assert_eq!(settled(&r.shared.pinned, base, 0x1000), Overlap::No);
}

#[test]
fn zero_timeout_never_waits() {
    let (r, f) = started(0, 8);
    let base = 0x7500_0000_0000;
    f.pin(base, 0x1000);
    f.hold(true);
    r.shared.unmapped(base, 0x1000, Wait::Full);
    let s = r.stats();
    assert_eq!((s.waits, s.detached), (0, 1));
    f.hold(false);
}

#[test]
fn forked_child_is_inert() {
    let (r, f) = started(60_000, 8);
    let base = 0x7600_0000_0000;
    f.pin(base, 0x1000);
    f.hold(true);
    let l = RevokeListener(r.shared.clone());
    l.forked();
    l.on_event(base as usize, 0x1000, UnmapEvent::Done);
    assert_eq!(
        r.stats(),
        RevokeStats::default(),
        "nothing queued, nothing counted"
    );
}

/// 16 threads each pin a range of their own, unmap it (waiting), and check it is unpinned when
/// the unmap returns; 8 slots, so some pushes overflow into sweeps.
#[test]
fn sixteen_threads_each_see_their_range_unpinned() {
    let (r, f) = started(60_000, 8);
    let base = 0x7700_0000_0000u64;
    let hs: Vec<_> = (0..16u64)
        .map(|t| {
            let (sh, f) = (r.shared.clone(), f.clone());
            std::thread::spawn(move || {
                for k in 0..40u64 {
                    let a = base + (t << 24) + (k << 12);
                    f.pin(a, 0x1000);
                    sh.unmapped(a, 0x1000, Wait::Full);
                    assert_eq!(settled(&sh.pinned, a, 0x1000), Overlap::No, "t{t} k{k}");
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let s = r.stats();
    // Every unmap waited, except one whose range a sweep (another thread's push finding every
    // slot busy) had already revoked between its pin and its unmap: that one finds nothing
    // pinned and returns at once, correctly (its range is checked unpinned above either way).
    assert_eq!(s.waits + s.fast_returns, 16 * 40, "{s:?}");
    assert!(s.fast_returns == 0 || s.sweeps > 0, "{s:?}");
    assert_eq!(s.timeouts, 0);
    wait_until("every revocation finished", || {
        let s = r.stats();
        s.completed == s.started
    });
    assert_eq!(r.shared.queue.busy(), 0);
    println!(
        "16 threads x 40 unmaps: {} revocations, {} sweeps",
        s.started, s.sweeps
    );
}

/// Through the monitor's registry, as a hook delivers it.
#[test]
fn registry_delivers_done_to_the_subscribed_listener() {
    let (mut r, f) = started(60_000, 8);
    let base = 0x7800_0000_0000;
    f.pin(base, 0x1000);
    crate::monitor::notify_event_for_tests(base as usize, 0x1000, UnmapEvent::Done);
    assert_eq!(r.stats().waits, 1);
    assert_eq!(settled(&r.shared.pinned, base, 0x1000), Overlap::No);
    r.stop();
    r.stop(); // idempotent
}

#[test]
fn stop_releases_a_waiter() {
    let (mut r, f) = started(60_000, 8);
    let base = 0x7900_0000_0000;
    f.pin(base, 0x1000);
    f.hold(true);
    let sh = r.shared.clone();
    let h = std::thread::spawn(move || sh.unmapped(base, 0x1000, Wait::Full));
    wait_until("started", || r.stats().started == 1);
    let t = Instant::now();
    r.stop();
    h.join().unwrap();
    assert!(t.elapsed() < Duration::from_secs(10));
}

/// What an unmap of memory no peer pinned costs the hook with 10 000 ranges pinned (run with
/// --nocapture). Debug builds are slower; the bound only catches a linear scan.
#[test]
fn fast_path_cost() {
    let r = Revocation::new(settings(1000), 8);
    for i in 0..10_000u64 {
        r.shared
            .pinned
            .insert(0x7a00_0000_0000 + i * 0x40000, 0x20000);
    }
    let n = 200_000u64;
    let t = Instant::now();
    for i in 0..n {
        // Between two pinned ranges, never overlapping.
        r.shared.unmapped(
            0x7a00_0000_0000 + (i % 10_000) * 0x40000 + 0x20000,
            0x10000,
            Wait::Full,
        );
    }
    let per = t.elapsed().as_nanos() as f64 / n as f64;
    let empty = Revocation::new(settings(1000), 8);
    let t = Instant::now();
    for i in 0..n {
        empty.shared.unmapped(i << 12, 0x1000, Wait::Full);
    }
    let per_empty = t.elapsed().as_nanos() as f64 / n as f64;
    println!("fast path: {per:.1} ns with 10000 ranges, {per_empty:.1} ns with none");
    assert_eq!(r.stats().fast_returns, n);
    assert!(per < 5_000.0, "{per} ns per lookup");
}

/// The driver went away (its context dropped, or finalized): the worker ends and closes the
/// queue, so an unmapping thread does not wait out its timeout for nothing.
#[test]
fn a_gone_driver_ends_the_worker_and_frees_waiters() {
    struct Gone;
    impl Driver for Gone {
        fn invalidate(&self, _: u64, _: u64) -> Option<InvalId> {
            None
        }
        fn is_done(&self, _: InvalId) -> Option<bool> {
            None
        }
        fn progress(&self) -> Option<usize> {
            None
        }
        fn wait_link(&self, _: Duration) {}
        fn probe_peers(&self) {}
        fn probe_every(&self) -> Duration {
            Duration::from_secs(1)
        }
        fn holder_bound(&self) -> Option<Duration> {
            None
        }
        fn give_up_holders(&self, _: InvalId) -> Option<usize> {
            None
        }
    }
    let mut r = Revocation::new(settings(60_000), 8);
    r.start(Box::new(Gone)).unwrap();
    let base = 0x7b00_0000_0000;
    r.pinned().insert(base, 0x1000);
    let t = Instant::now();
    r.shared.unmapped(base, 0x1000, Wait::Full);
    assert!(t.elapsed() < Duration::from_secs(10));
    assert!(r.shared.queue.is_closed());
    assert_eq!(r.stats().timeouts, 0);
}

/// Pins `[a, a + 0x1000)` as held by the holder that never acks.
fn pin_bad(f: &Fake, a: u64) {
    f.pin(a, 0x1000);
    f.st.lock().unwrap().bad.push((a, 0x1000));
}

/// A holder that never acks (and is never given up on here: no bound) slows only the unmaps of
/// memory it holds. Its revokes nobody waits for any more (detached, or their waiters timed
/// out) give their slots back, so unmaps of memory only honest peers held, and of memory no
/// peer held, stay fast while its revokes hang, before and after its waiters' timeout.
#[test]
fn a_holder_that_never_acks_slows_only_unmaps_of_its_own_memory() {
    const TIMEOUT_MS: u64 = 2000;
    let fast = Duration::from_millis(TIMEOUT_MS / 5);
    let (r, f) = started(TIMEOUT_MS, 8);
    let base = 0x7c00_0000_0000u64;
    let bad = move |i: u64| base + i * 0x2000;
    let honest = |i: u64| base + 0x100_0000 + i * 0x2000;
    let nobodys = |i: u64| base + 0x200_0000 + i * 0x2000;
    for i in 0..8 {
        pin_bad(&f, bad(i));
        f.pin(honest(i), 0x1000);
    }
    // Two threads unmap its memory and wait: the whole timeout (their own firehoses).
    let waiters: Vec<_> = (0..2)
        .map(|i| {
            let sh = r.shared.clone();
            std::thread::spawn(move || {
                let t = Instant::now();
                sh.unmapped(bad(i), 0x1000, Wait::Full);
                t.elapsed()
            })
        })
        .collect();
    wait_until("the waiters' revokes started", || r.stats().started == 2);
    // Six more of its ranges revoked with nobody waiting: with the two waiters, every slot.
    for i in 2..8 {
        r.shared.unmapped(bad(i), 0x1000, Wait::Never);
        wait_until("started", || r.stats().started == i + 1);
    }
    let check = |i: u64| {
        let t = Instant::now();
        r.shared.unmapped(honest(i), 0x1000, Wait::Full);
        let took = t.elapsed();
        assert!(took < fast, "memory only honest peers held, {i}: {took:?}");
        assert_eq!(settled(&r.shared.pinned, honest(i), 0x1000), Overlap::No);
        let t = Instant::now();
        r.shared.unmapped(nobodys(i), 0x1000, Wait::Full);
        assert!(t.elapsed() < fast, "memory no peer held, {i}");
    };
    for i in 0..4 {
        check(i);
    }
    for took in waiters.into_iter().map(|h| h.join().unwrap()) {
        assert!(took >= Duration::from_millis(TIMEOUT_MS - 50), "{took:?}");
    }
    // Their waiters gave up too: still nothing slow for the others.
    for i in 4..8 {
        check(i);
    }
    let s = r.stats();
    assert_eq!((s.timeouts, s.sweeps, s.written_off), (2, 0, 0), "{s:?}");
    assert_eq!((s.started, s.completed), (16, 8), "{s:?}");
    wait_until("no slot held for the holder", || r.shared.queue.busy() == 0);
    for i in 0..8 {
        assert_eq!(settled(&r.shared.pinned, bad(i), 0x1000), Overlap::Yes);
    }
}

/// A holder silent past its bound (`FH_AM_TIMEOUT_MS` in the real driver) is given up on: the
/// revoke ends then (its waiter returns before `FH_REVOKE_TIMEOUT`, the memory unpinned),
/// counted; the holder, lost, costs nothing more.
#[test]
fn a_holder_silent_past_its_bound_is_given_up_on() {
    let mut r = Revocation::new(settings(20_000), 8);
    let f = Fake::new(r.pinned());
    f.st.lock().unwrap().bound = Some(Duration::from_millis(200));
    r.start(Box::new(f.clone())).unwrap();
    let base = 0x7d00_0000_0000u64;
    pin_bad(&f, base);
    pin_bad(&f, base + 0x2000);
    let t = Instant::now();
    r.shared.unmapped(base, 0x1000, Wait::Full);
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(190), "{took:?}");
    assert!(
        took < Duration::from_secs(10),
        "given up on, not waited out: {took:?}"
    );
    assert_eq!(settled(&r.shared.pinned, base, 0x1000), Overlap::No);
    let s = r.stats();
    assert_eq!(
        (s.timeouts, s.completed, s.written_off, s.holders_given_up),
        (0, 1, 1, 1),
        "{s:?}"
    );
    let t = Instant::now();
    r.shared.unmapped(base + 0x2000, 0x1000, Wait::Full);
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    let s = r.stats();
    assert_eq!((s.completed, s.written_off), (2, 1), "{s:?}");
    assert_eq!(r.shared.queue.busy(), 0);
}
