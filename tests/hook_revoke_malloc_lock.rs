//! The revoke listener's wait inside unmaps that glibc makes with a malloc arena lock held.
//!
//! `RevokeListener` waits after a hooked unmap of memory pinned for peers until the `fh-revoke`
//! worker has revoked it. But glibc calls the patched `__madvise(MADV_DONTNEED)` from
//! `malloc_trim` (`mtrim`) and, on a non-main arena, `__madvise`/`mmap(MAP_FIXED)`/`__munmap`
//! from `free` (`heap_trim`), all with the arena's mutex held. The worker allocates (its job
//! vectors; the real driver's `Target::invalidate` builds maps and encodes messages): when it
//! shares that arena (`MALLOC_ARENA_MAX=1`, common on HPC systems, or any arena reuse) it blocks
//! on the mutex and the revoke cannot finish until the waiter gives up. Before the fix, that was
//! `FH_REVOKE_TIMEOUT` later (the whole timeout, 3 s here).
//!
//! The fix: the hooks tell libc's own calls apart (their return address,
//! `src/monitor/caller.rs`), and when libc trims a heap (its own `madvise`, `mmap(MAP_FIXED)`,
//! or `munmap` of a whole heap) the wait also ends once the worker has shown no progress for
//! `FH_REVOKE_STALL` (`revoke_stalls`). Checked here, each in a fresh child process:
//! - `malloc_trim` over a freed heap chunk pinned for peers, `MALLOC_ARENA_MAX=1`, a driver that
//!   allocates like the real one: returns within the stall limit, and the revoke then finishes
//!   in the background;
//! - with a worker that is merely slow (it keeps turning), `malloc_trim` waits for the whole
//!   revoke: the stall limit does not cut a working revoke short;
//! - with a worker stuck on a lock, the application's own `munmap` and libc's `munmap` from
//!   `free` of an mmapped chunk (no lock held there) still wait out the full timeout; only
//!   `malloc_trim` stops at the stall limit.

mod monitor_util;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use firehose::rma::revoke::{Driver, PinnedRanges, Revocation};
use firehose_proto::InvalId;
use monitor_util::{
    in_child, map, patch_libc_telling_callers_apart, revocation, run_in_child, PAGE,
};

/// Completes every revoke `delay` after it started, at a progress call; allocates per revoke as
/// the real driver does (a buffer larger than any tcache bin, so the allocation goes to the
/// arena). While `stuck` holds its lock, `progress` blocks on it (a worker blocked on a lock).
struct Fake {
    pending: Mutex<Vec<(u64, Instant)>>,
    done: Mutex<Vec<u64>>,
    next: Mutex<u64>,
    delay: Duration,
    stuck: Arc<Mutex<()>>,
}

impl Driver for Fake {
    fn invalidate(&self, _addr: u64, _len: u64) -> Option<InvalId> {
        let msg = vec![0u8; 64 << 10]; // the REVOKE messages the real driver encodes
        std::hint::black_box(&msg);
        let mut n = self.next.lock().unwrap();
        *n += 1;
        self.pending.lock().unwrap().push((*n, Instant::now()));
        Some(InvalId(*n))
    }
    fn is_done(&self, id: InvalId) -> Option<bool> {
        Some(self.done.lock().unwrap().contains(&id.0))
    }
    fn progress(&self) -> Option<usize> {
        drop(self.stuck.lock().unwrap_or_else(|e| e.into_inner()));
        let mut p = self.pending.lock().unwrap();
        let before = p.len();
        let mut done = self.done.lock().unwrap();
        p.retain(|&(id, t)| {
            let over = t.elapsed() >= self.delay;
            if over {
                done.push(id);
            }
            !over
        });
        Some(before - p.len())
    }
    fn wait_link(&self, d: Duration) {
        std::thread::sleep(d.min(Duration::from_micros(200)));
    }
    fn probe_peers(&self) {}
    fn probe_every(&self) -> Duration {
        Duration::from_secs(1)
    }
}

const STALL: Duration = Duration::from_millis(100);

/// Patches libc and starts a revocation on a `Fake`; `None` (after a SKIP line) when this build
/// cannot tell libc's calls apart.
fn setup(
    timeout: Duration,
    delay: Duration,
) -> Option<(Revocation, Arc<PinnedRanges>, Arc<Mutex<()>>)> {
    if !patch_libc_telling_callers_apart() {
        return None;
    }
    let mut r = revocation(timeout, STALL);
    let pinned = r.pinned();
    let stuck = Arc::new(Mutex::new(()));
    r.start(Box::new(Fake {
        pending: Mutex::default(),
        done: Mutex::default(),
        next: Mutex::new(0),
        delay,
        stuck: stuck.clone(),
    }))
    .unwrap();
    Some((r, pinned, stuck))
}

/// Waits (bounded) until `n` revokes have completed, and every one started: the background part.
fn settles(r: &Revocation, n: u64) -> bool {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        let s = r.stats();
        if s.completed >= n && s.started == s.completed {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

fn trim_child() {
    let timeout = Duration::from_secs(3);
    let Some((mut r, pinned, _stuck)) = setup(timeout, Duration::ZERO) else {
        return;
    };
    // Control: a plain munmap of pinned memory waits for the revoke, briefly.
    let a = map(2 * PAGE);
    pinned.insert(a as u64, PAGE);
    let t = Instant::now();
    // SAFETY: our mapping.
    assert_eq!(unsafe { libc::munmap(a as *mut _, 2 * PAGE) }, 0);
    let control = t.elapsed();
    let s = r.stats();
    assert_eq!((s.waits, s.timeouts, s.stalls), (1, 0, 0), "control: {s:?}");
    assert!(
        control < Duration::from_millis(500),
        "control took {control:?}"
    );
    pinned.remove(a as u64, PAGE);

    let took = trim_pinned_chunk(&pinned);
    let s = r.stats();
    eprintln!("malloc_trim took {took:?} (control munmap {control:?}); {s:?}");
    assert!(
        s.waits >= 2,
        "malloc_trim's madvise reached the revoke listener: {s:?}"
    );
    assert_eq!(
        s.timeouts, 0,
        "malloc_trim waited out the whole FH_REVOKE_TIMEOUT ({took:?}): the revoke worker \
         was blocked on the arena lock the waiting thread held"
    );
    assert!(s.stalls >= 1, "the wait ended on the stall limit: {s:?}");
    assert!(
        took < Duration::from_millis(500),
        "malloc_trim took {took:?}"
    );
    assert!(
        settles(&r, 2),
        "the revoke finished in the background: {:?}",
        r.stats()
    );
    r.stop();
}

#[test]
fn malloc_trim_of_memory_pinned_for_peers_does_not_stall() {
    if in_child() {
        trim_child();
        return;
    }
    run_in_child(
        "malloc_trim_of_memory_pinned_for_peers_does_not_stall",
        &[("MALLOC_ARENA_MAX", "1")],
    );
}

/// `free` of a chunk big enough to be mmapped (glibc then calls `munmap` itself, with no lock
/// held), pinned for peers; returns how long the `free` took.
fn free_pinned_chunk(pinned: &PinnedRanges) -> Duration {
    // SAFETY: plain malloc of our own block.
    let p = unsafe { libc::malloc(1 << 20) } as usize;
    assert_ne!(p, 0);
    let page = (p + PAGE) & !(PAGE - 1);
    pinned.insert(page as u64, PAGE);
    let t = Instant::now();
    // SAFETY: ours, freed once.
    unsafe { libc::free(p as *mut _) };
    let took = t.elapsed();
    pinned.remove(page as u64, PAGE);
    took
}

/// `malloc_trim` over a freed heap chunk of whole pages pinned for peers (glibc's `mtrim` holds
/// the arena's mutex around its `madvise(MADV_DONTNEED)`); returns how long the trim took.
fn trim_pinned_chunk(pinned: &PinnedRanges) -> Duration {
    // q, above p, keeps p's chunk off the top of the heap.
    // SAFETY: plain malloc/free of our own blocks.
    let (p, q) = unsafe { (libc::malloc(100 << 10) as usize, libc::malloc(100 << 10)) };
    assert!(q as usize > p, "q above p, keeping p's chunk off the top");
    let page = (p + 2 * PAGE) & !(PAGE - 1);
    pinned.insert(page as u64, PAGE);
    // SAFETY: ours, freed once.
    unsafe { libc::free(p as *mut _) };
    let t = Instant::now();
    // SAFETY: no preconditions.
    unsafe { libc::malloc_trim(0) };
    let took = t.elapsed();
    pinned.remove(page as u64, PAGE);
    // SAFETY: ours, freed once.
    unsafe { libc::free(q) };
    took
}

fn slow_child() {
    // A revoke takes 400 ms, four times the stall limit, and the worker keeps turning meanwhile.
    let delay = Duration::from_millis(400);
    let Some((mut r, pinned, _stuck)) = setup(Duration::from_secs(5), delay) else {
        return;
    };
    let took = trim_pinned_chunk(&pinned);
    let s = r.stats();
    eprintln!("malloc_trim took {took:?}; {s:?}");
    assert_eq!((s.waits, s.stalls, s.timeouts), (1, 0, 0), "{s:?}");
    assert_eq!(
        s.completed, 1,
        "malloc_trim returned after its revoke: {s:?}"
    );
    assert!(
        took >= delay,
        "malloc_trim waited for the whole revoke: {took:?}"
    );
    r.stop();
}

#[test]
fn a_slow_but_working_revoke_is_waited_for_in_a_trim() {
    if in_child() {
        slow_child();
        return;
    }
    run_in_child("a_slow_but_working_revoke_is_waited_for_in_a_trim", &[]);
}

fn stuck_child() {
    let timeout = Duration::from_millis(800);
    let Some((mut r, pinned, stuck)) = setup(timeout, Duration::ZERO) else {
        return;
    };
    let hold = stuck.lock().unwrap();
    // The application's own munmap: the full timeout, whatever the worker does.
    let a = map(2 * PAGE);
    pinned.insert(a as u64, PAGE);
    let t = Instant::now();
    // SAFETY: our mapping.
    assert_eq!(unsafe { libc::munmap(a as *mut _, 2 * PAGE) }, 0);
    let own = t.elapsed();
    pinned.remove(a as u64, PAGE);
    let s = r.stats();
    assert_eq!(
        (s.waits, s.timeouts, s.stalls),
        (1, 1, 0),
        "own munmap: {s:?}"
    );
    assert!(own >= timeout, "own munmap took {own:?}");
    // libc's munmap from free (no lock held there): the full timeout too.
    let took = free_pinned_chunk(&pinned);
    let s = r.stats();
    assert_eq!((s.waits, s.timeouts, s.stalls), (2, 2, 0), "free: {s:?}");
    assert!(took >= timeout, "free took {took:?}");
    // libc trimming its heap: stops at the stall limit.
    let trim = trim_pinned_chunk(&pinned);
    let s = r.stats();
    eprintln!("own munmap {own:?}, free {took:?}, malloc_trim {trim:?}; {s:?}");
    assert_eq!(
        (s.waits, s.timeouts, s.stalls),
        (3, 2, 1),
        "malloc_trim: {s:?}"
    );
    assert!(trim >= STALL && trim < timeout, "malloc_trim took {trim:?}");
    drop(hold);
    assert!(
        settles(&r, 3),
        "the revokes finished once the worker moved: {:?}",
        r.stats()
    );
    r.stop();
}

#[test]
fn a_stuck_worker_cuts_only_trims_short() {
    if in_child() {
        stuck_child();
        return;
    }
    run_in_child("a_stuck_worker_cuts_only_trims_short", &[]);
}
