//! Two cases of the revoke listener's wait inside libc's heap trimming, found by review of the
//! first version of that code and reproduced here before their fixes (each failed every time):
//!
//! 1. `heap_delete_*`: glibc deletes a whole secondary-arena heap with
//!    `__munmap(heap, heap_max_size())` under the arena mutex, and `heap_max_size()` is 4 huge
//!    pages (8 MiB with 2 MiB pages) with `GLIBC_TUNABLES=glibc.malloc.hugetlb=2` (glibc 2.35+),
//!    not 64 MiB. When only 64 MiB blocks counted as heaps, that `munmap` came as `Done` and the
//!    `free` waited the whole `FH_REVOKE_TIMEOUT` (800 ms here) with a stuck worker; the default
//!    64 MiB heap is the control. Now any aligned power of two of at least 8 MiB is a heap
//!    (`monitor::caller::glibc_heap_block`).
//! 2. `trylock_*`: a thread inside the library that holds a lock the worker only `try_lock`s (the
//!    link's receive stash, `net/verbs/link.rs`: a handler run from progress holds it) and frees
//!    memory that libc trims. When threads inside the library were let wait in trims, this one
//!    waited the whole timeout: the worker kept turning (so the stall watch never fired) but could
//!    not receive the acks. Now whether a thread is inside is read from a table
//!    (`src/rt/inside.rs`), without a thread-local, and such a thread never waits.

mod monitor_util;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use firehose::monitor::{self, MemoryListener, UnmapEvent};
use firehose::rma::revoke::{Driver, PinnedRanges, Revocation};
use firehose_proto::InvalId;
use monitor_util::{in_child, patch_libc_telling_callers_apart, revocation, run_in_child, PAGE};

const STALL: Duration = Duration::from_millis(100);
const TIMEOUT: Duration = Duration::from_millis(800);

/// Completes every revoke at the first progress call that can get `gate` (blocking when
/// `blocking`, else `try_lock`, as link.rs does with its receive stash).
struct Fake {
    pending: Mutex<Vec<u64>>,
    done: Mutex<Vec<u64>>,
    next: Mutex<u64>,
    gate: Arc<Mutex<()>>,
    blocking: bool,
}

impl Fake {
    fn gate_free(&self) -> bool {
        if self.blocking {
            drop(self.gate.lock().unwrap_or_else(|e| e.into_inner()));
            true
        } else {
            self.gate.try_lock().is_ok()
        }
    }
}

impl Driver for Fake {
    fn invalidate(&self, _addr: u64, _len: u64) -> Option<InvalId> {
        let mut n = self.next.lock().unwrap();
        *n += 1;
        self.pending.lock().unwrap().push(*n);
        Some(InvalId(*n))
    }
    fn is_done(&self, id: InvalId) -> Option<bool> {
        Some(self.done.lock().unwrap().contains(&id.0))
    }
    fn progress(&self) -> Option<usize> {
        if !self.gate_free() {
            return Some(0); // receives skipped: nothing delivered
        }
        let mut p = self.pending.lock().unwrap();
        let n = p.len();
        self.done.lock().unwrap().extend(p.drain(..));
        Some(n)
    }
    fn wait_link(&self, d: Duration) {
        if self.blocking {
            std::thread::sleep(d.min(Duration::from_micros(200)));
        }
        // else: link.rs `wait` returns at once when the stash is taken
    }
    fn probe_peers(&self) {}
    fn probe_every(&self) -> Duration {
        Duration::from_secs(1)
    }
}

/// Records the big `Done`/`DoneInLibcTrim` events (no allocation: hook context).
struct Rec {
    addr: [AtomicUsize; 64],
    len: [AtomicUsize; 64],
    trim: [AtomicUsize; 64],
    n: AtomicUsize,
}

impl MemoryListener for Rec {
    fn on_unmap(&self, _a: usize, _l: usize) {}
    fn on_event(&self, a: usize, l: usize, ev: UnmapEvent) {
        if ev.is_done() && l >= (1 << 20) {
            let i = self.n.fetch_add(1, SeqCst) % 64;
            self.addr[i].store(a, SeqCst);
            self.len[i].store(l, SeqCst);
            self.trim[i].store((ev == UnmapEvent::DoneInLibcTrim) as usize, SeqCst);
        }
    }
    fn wants_done(&self) -> bool {
        true
    }
}

fn setup(blocking: bool) -> Option<(Revocation, Arc<PinnedRanges>, Arc<Mutex<()>>)> {
    if !patch_libc_telling_callers_apart() {
        return None;
    }
    let mut r = revocation(TIMEOUT, STALL);
    let pinned = r.pinned();
    let gate = Arc::new(Mutex::new(()));
    r.start(Box::new(Fake {
        pending: Mutex::default(),
        done: Mutex::default(),
        next: Mutex::new(0),
        gate: gate.clone(),
        blocking,
    }))
    .unwrap();
    Some((r, pinned, gate))
}

fn brk_heap() -> (usize, usize) {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let Some(l) = maps.lines().find(|l| l.ends_with("[heap]")) else {
        return (0, 0);
    };
    let (a, b) = l
        .split_whitespace()
        .next()
        .unwrap()
        .split_once('-')
        .unwrap();
    (
        usize::from_str_radix(a, 16).unwrap(),
        usize::from_str_radix(b, 16).unwrap(),
    )
}

/// On a fresh thread (a secondary arena): fills one heap, starts a second, pins a page of the
/// second heap's first chunk, frees everything so glibc deletes the second heap (munmap of
/// `heap_size` bytes under the arena mutex). Returns how long the final free took.
fn heap_delete_child(heap_size: usize) {
    let Some((mut r, pinned, gate)) = setup(true) else {
        return;
    };
    let rec = Arc::new(Rec {
        addr: std::array::from_fn(|_| AtomicUsize::new(0)),
        len: std::array::from_fn(|_| AtomicUsize::new(0)),
        trim: std::array::from_fn(|_| AtomicUsize::new(0)),
        n: AtomicUsize::new(0),
    });
    let _sub = monitor::subscribe(rec.clone() as Arc<dyn MemoryListener>);
    // The worker is stuck (as on the arena mutex): a trim should stop at STALL.
    let hold = gate.lock().unwrap();
    // The pin is inserted by this thread (its table may allocate, which on the worker thread
    // would land in the new heap and keep it alive).
    let hand = Arc::new((AtomicUsize::new(0), AtomicUsize::new(0)));
    let hand2 = hand.clone();
    let h = std::thread::spawn(move || {
        const CHUNK: usize = 100 << 10; // heap, not mmap (threshold 128 KiB)
        let (blo, bhi) = brk_heap();
        let mut v: Vec<usize> = Vec::with_capacity(4096);
        let mut heap2 = None;
        let mut extra = 0;
        while v.len() < 4000 {
            // SAFETY: plain malloc.
            let p = unsafe { libc::malloc(CHUNK) } as usize;
            assert!(p != 0 && !(blo..bhi).contains(&p), "secondary arena");
            v.push(p);
            let base = p & !(heap_size - 1);
            match heap2 {
                None if base != v[0] & !(heap_size - 1) => heap2 = Some((v.len() - 1, base)),
                Some(_) => {
                    extra += 1;
                    if extra == 3 {
                        break;
                    }
                }
                None => {}
            }
        }
        let (first2, base2) = heap2.expect("a second heap was started");
        let page = (v[first2] + PAGE) & !(PAGE - 1);
        hand2.0.store(page, SeqCst);
        while hand2.1.load(SeqCst) == 0 {
            std::hint::spin_loop();
        }
        let mut last = Duration::ZERO;
        for &p in &v {
            let t = Instant::now();
            // SAFETY: ours, once.
            unsafe { libc::free(p as *mut _) };
            last = last.max(t.elapsed());
        }
        (last, base2)
    });
    let page = loop {
        let p = hand.0.load(SeqCst);
        if p != 0 {
            break p;
        }
        std::thread::yield_now();
    };
    pinned.insert(page as u64, PAGE);
    hand.1.store(1, SeqCst);
    let (took, heap2) = h.join().unwrap();
    pinned.remove(page as u64, PAGE);
    drop(hold);
    let s = r.stats();
    let n = rec.n.load(SeqCst).min(64);
    let mut heap_event = None;
    for i in 0..n {
        let (a, l) = (rec.addr[i].load(SeqCst), rec.len[i].load(SeqCst));
        eprintln!(
            "  done event {a:#x} +{l:#x} {}",
            if rec.trim[i].load(SeqCst) == 1 {
                "DoneInLibcTrim"
            } else {
                "Done"
            }
        );
        if a == heap2 && l == heap_size {
            heap_event = Some(rec.trim[i].load(SeqCst) == 1);
        }
    }
    eprintln!("heap {heap_size:#x} at {heap2:#x}: longest free {took:?}; {s:?}");
    assert_eq!(
        heap_event,
        Some(true),
        "glibc's heap munmap classified as a trim"
    );
    assert_eq!(
        s.timeouts, 0,
        "a free waited the whole timeout under the arena mutex"
    );
    assert!(took < TIMEOUT / 2, "longest free {took:?}");
    r.stop();
}

#[test]
fn heap_delete_default_64mib() {
    if in_child() {
        heap_delete_child(64 << 20);
        return;
    }
    run_in_child("heap_delete_default_64mib", &[]);
}

#[test]
fn heap_delete_with_hugetlb_tunable() {
    if in_child() {
        heap_delete_child(8 << 20); // 4 * Hugepagesize (2 MiB)
        return;
    }
    run_in_child(
        "heap_delete_with_hugetlb_tunable",
        &[("GLIBC_TUNABLES", "glibc.malloc.hugetlb=2")],
    );
}

fn trylock_child() {
    let Some((mut r, pinned, gate)) = setup(false) else {
        return;
    };
    // A handler running inside the library with the receive stash taken frees memory that libc
    // then trims (malloc_trim here: the same DoneInLibcTrim as heap_trim).
    // SAFETY: plain malloc/free/malloc_trim of our own blocks.
    let (p, q) = unsafe { (libc::malloc(100 << 10) as usize, libc::malloc(100 << 10)) };
    assert!(q as usize > p);
    let page = (p + 2 * PAGE) & !(PAGE - 1);
    pinned.insert(page as u64, PAGE);
    let took = {
        let _inside = firehose::inside::enter();
        let _stash = gate.lock().unwrap();
        unsafe { libc::free(p as *mut _) };
        let t = Instant::now();
        unsafe { libc::malloc_trim(0) };
        t.elapsed()
    };
    pinned.remove(page as u64, PAGE);
    unsafe { libc::free(q) };
    let s = r.stats();
    eprintln!("malloc_trim inside the library, stash held: {took:?}; {s:?}");
    assert_eq!(s.timeouts, 0, "waited the whole FH_REVOKE_TIMEOUT: {s:?}");
    assert!(took < TIMEOUT / 2, "took {took:?}");
    r.stop();
}

#[test]
fn trylock_worker_and_a_thread_inside_the_library_holding_the_lock() {
    if in_child() {
        trylock_child();
        return;
    }
    run_in_child(
        "trylock_worker_and_a_thread_inside_the_library_holding_the_lock",
        &[],
    );
}
