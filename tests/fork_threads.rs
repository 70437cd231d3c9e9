//! fork while other threads are inside the library.
//!
//! Eight threads register, deregister and unmap in a loop (cache misses with userfaultfd watches,
//! hooks running on munmap), create and free private caches (monitor install, listener
//! subscribe/unsubscribe) and start short-lived threads (reader-slot ids), while the main thread
//! forks 50 times. Each child, forked at a random point of all that, builds a new cache and
//! registers, frees (munmap), maps the same address again and registers again, which must miss;
//! it does the same from a new thread; then it exits 0. A process-wide lock inherited locked from
//! a thread that does not exist in the child hangs it: the parent kills it after a timeout and
//! the test fails.
//!
//! A second test forks while threads start and end std threads: each child's first registration
//! starts the child's userfaultfd reader, which must not depend on std's thread machinery.
//!
//! C API (the `fh_*` exports), mlock backend, libc patching + userfaultfd.

mod fork_util;

use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use firehose::ffi::*;
use firehose::status::fh_status;
use fork_util::{cache_with, fork_run, register, wait_child};

const LEN: usize = 64 << 10;
const FORKS: usize = 50;
const WORKERS: usize = 8;
/// Stop forking after this many failed children (each hang costs the timeout).
const MAX_FAILURES: usize = 3;
/// [`fork_while_std_threads_start_and_exit`]: threads starting std threads, and forks.
const STD_CHURNERS: usize = 8;
const STD_FORKS: usize = 600;

fn new_cache() -> Result<*mut fh_cache, fh_status> {
    cache_with(|cfg| {
        cfg.backend = FH_BACKEND_MLOCK;
        cfg.ibv_pd = ptr::null_mut();
        cfg.monitor = FH_MONITOR_PATCH_LIBC | FH_MONITOR_USERFAULTFD;
        cfg.max_pinned = 64 << 20;
        cfg.max_regions = 1024;
    })
}

fn map(at: usize) -> usize {
    let flags = libc::MAP_PRIVATE
        | libc::MAP_ANONYMOUS
        | if at != 0 {
            libc::MAP_FIXED_NOREPLACE
        } else {
            0
        };
    // SAFETY: a fresh anonymous mapping (never over an existing one).
    let p = unsafe {
        libc::mmap(
            at as *mut c_void,
            LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED || (at != 0 && p as usize != at) {
        return 0;
    }
    // SAFETY: just mapped, writable.
    unsafe { ptr::write_bytes(p as *mut u8, 1, LEN) };
    p as usize
}

fn unmap(p: usize) {
    // SAFETY: a mapping of ours.
    unsafe { libc::munmap(p as *mut c_void, LEN) };
}

fn misses(c: *mut fh_cache) -> u64 {
    let mut s = std::mem::MaybeUninit::<fh_stats>::uninit();
    // SAFETY: live cache, valid out pointer.
    assert_eq!(unsafe { fh_get_stats(c, s.as_mut_ptr()) }, fh_status::FH_OK);
    // SAFETY: written on FH_OK.
    unsafe { s.assume_init() }.misses
}

/// register, munmap, map again at the same address, register: the second must miss. Returns an
/// exit code (0 = fine).
fn register_free_register(c: *mut fh_cache) -> i32 {
    let p = map(0);
    if p == 0 {
        return 3;
    }
    let m0 = misses(c);
    let Ok(h) = register(c, p, LEN) else { return 4 };
    // SAFETY: live cache, handle just issued.
    if unsafe { fh_deregister(c, h) } != fh_status::FH_OK {
        return 5;
    }
    unmap(p);
    if map(p) != p {
        return 0; // someone else took the address: nothing to check
    }
    let Ok(h) = register(c, p, LEN) else { return 6 };
    // SAFETY: as above.
    unsafe { fh_deregister(c, h) };
    let m = misses(c) - m0;
    unmap(p);
    if m != 2 {
        eprintln!("child: {m} misses for register, free, register (a stale hit)");
        return 7;
    }
    0
}

fn child() -> i32 {
    let c = match new_cache() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("child: fh_cache_new: {e:?}");
            return 2;
        }
    };
    let rc = register_free_register(c);
    if rc != 0 {
        return rc;
    }
    // A new thread takes a reader-slot id (the id pool) and registers too.
    let rc = in_raw_thread(|c| register_free_register(c as *mut fh_cache), c as usize);
    if rc != 0 {
        return 10 + rc;
    }
    // SAFETY: our cache, no other user.
    unsafe { fh_cache_free(c) };
    0
}

/// Run `f(arg)` on a new thread made with `pthread_create` and return its result (-1 if the thread
/// could not be made). Not `std::thread`: std's thread start and exit take a process-wide mutex of
/// its own (`std::sys::pal::unix::stack_overflow::thread_info`, Rust 1.95) that no atfork handler
/// covers, so a child forked while a std thread was starting or ending hangs in its own next
/// `std::thread::spawn` (seen in this test). That is std's hazard, not the library's; the
/// library's id pool is exercised the same way by these threads.
fn in_raw_thread(f: fn(usize) -> i32, arg: usize) -> i32 {
    struct Job {
        f: fn(usize) -> i32,
        arg: usize,
        rc: i32,
    }
    extern "C" fn start(p: *mut c_void) -> *mut c_void {
        // SAFETY: `p` is the `Job` below, alive until the join.
        let job = unsafe { &mut *(p as *mut Job) };
        job.rc = std::panic::catch_unwind(|| (job.f)(job.arg)).unwrap_or(99);
        ptr::null_mut()
    }
    let mut job = Job { f, arg, rc: -1 };
    let mut t: libc::pthread_t = 0;
    // SAFETY: `job` outlives the thread (joined below).
    let rc = unsafe {
        libc::pthread_create(
            &mut t,
            ptr::null(),
            start,
            &mut job as *mut Job as *mut c_void,
        )
    };
    if rc != 0 {
        return -1;
    }
    // SAFETY: a joinable thread of ours, joined once.
    unsafe { libc::pthread_join(t, ptr::null_mut()) };
    job.rc
}

struct Shared(*mut fh_cache);
// SAFETY: every fh_* call on one cache may come from any thread.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

fn worker(shared: Arc<Shared>, stop: Arc<AtomicBool>, seed: usize, rounds: Arc<AtomicUsize>) {
    let mut rng = fastrand::Rng::with_seed(seed as u64);
    while !stop.load(SeqCst) {
        // Worker 0 only churns threads (their ids are taken and given back under the pool's lock).
        let what = if seed == 1 { 1 } else { rng.usize(..8) };
        match what {
            // a private cache: install (idempotent, takes the install lock), subscribe,
            // register, unsubscribe
            0 => {
                if let Ok(c) = new_cache() {
                    let p = map(0);
                    if p != 0 {
                        if let Ok(h) = register(c, p, LEN) {
                            // SAFETY: live cache, handle just issued.
                            unsafe { fh_deregister(c, h) };
                        }
                        unmap(p);
                    }
                    // SAFETY: ours, no other user.
                    unsafe { fh_cache_free(c) };
                }
            }
            // a short-lived thread: takes and returns a reader-slot id
            1 => {
                in_raw_thread(
                    |c| {
                        let c = c as *mut fh_cache;
                        let p = map(0);
                        if p != 0 {
                            if let Ok(h) = register(c, p, LEN) {
                                // SAFETY: live cache, handle just issued.
                                unsafe { fh_deregister(c, h) };
                            }
                            unmap(p);
                        }
                        0
                    },
                    shared.0 as usize,
                );
            }
            // miss (uffd watch), release, unmap (hooks, invalidation)
            _ => {
                let p = map(0);
                if p != 0 {
                    if let Ok(h) = register(shared.0, p, LEN) {
                        // SAFETY: live cache, handle just issued.
                        unsafe { fh_deregister(shared.0, h) };
                    }
                    unmap(p);
                }
            }
        }
        rounds.fetch_add(1, SeqCst);
    }
}

#[test]
fn fork_while_threads_register_and_unmap() {
    let shared = Arc::new(Shared(new_cache().expect("fh_cache_new")));
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..WORKERS)
        .map(|k| {
            let (s, st, r) = (shared.clone(), stop.clone(), rounds.clone());
            std::thread::spawn(move || worker(s, st, k * 7919 + 1, r))
        })
        .collect();
    while rounds.load(SeqCst) < 100 {
        std::thread::yield_now();
    }
    let mut failures = Vec::new();
    for f in 0..FORKS {
        // Let the workers get somewhere between forks.
        std::thread::sleep(Duration::from_millis(2 + (f % 5) as u64));
        let pid = fork_run(child);
        if let Err(e) = wait_child(pid) {
            failures.push(format!("fork {f}: {e}"));
        }
        if failures.len() >= MAX_FAILURES {
            break;
        }
    }
    stop.store(true, SeqCst);
    for w in workers {
        w.join().unwrap();
    }
    // SAFETY: every worker is gone.
    unsafe { fh_cache_free(shared.0) };
    assert!(
        failures.is_empty(),
        "{} of {FORKS} children failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The child's first registration starts the child's own `fh-uffd` reader thread. Starting or
/// ending a std thread takes std's own process-wide mutex (`thread_info`, see [`in_raw_thread`]),
/// which no atfork handler covers: a reader started with `std::thread` hung in a child forked
/// while any std thread of the parent was starting or ending (its first registration waited
/// forever for the reader). Threads start and join empty std threads without pause while the main
/// thread forks; every child must register and exit. (With the std reader about 1 fork in 200
/// hung here, 2 cores.)
#[test]
fn fork_while_std_threads_start_and_exit() {
    // The parent's monitor (libc patching, userfaultfd) and reader are up before the first fork.
    let c = new_cache().expect("fh_cache_new");
    assert_eq!(register_free_register(c), 0);
    let stop = Arc::new(AtomicBool::new(false));
    let churners: Vec<_> = (0..STD_CHURNERS)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(SeqCst) {
                    std::thread::spawn(|| {}).join().unwrap();
                }
            })
        })
        .collect();
    let mut failure = None;
    for f in 0..STD_FORKS {
        if let Err(e) = wait_child(fork_run(child)) {
            failure = Some(format!("fork {f}: {e}"));
            break; // each hang costs the timeout
        }
    }
    stop.store(true, SeqCst);
    for t in churners {
        t.join().unwrap();
    }
    // SAFETY: ours, no other user.
    unsafe { fh_cache_free(c) };
    if let Some(e) = failure {
        panic!("a child failed: {e}");
    }
}
