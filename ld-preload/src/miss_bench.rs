//! Native measurement of what a miss through the shim costs beyond the real registration, with no
//! device: the hooks' dispatch over a cache whose backend is `mlock`/`munlock` (like
//! `ibv_reg_mr`, it walks and pins the pages and splits the mapping), userfaultfd watching on, a
//! buffer at a new address every time (every registration a miss, as a benchmark that walks its
//! buffer), against the same `mlock`/`munlock` pair called directly (no cache).
//!
//! ```sh
//! cargo test --release -p firehose-preload miss_bench -- --ignored --nocapture
//! ```
//! Needs userfaultfd (root, or `vm.unprivileged_userfaultfd=1`) and an unlimited `RLIMIT_MEMLOCK`
//! (root); prints the fastest of 5 alternating rounds, asserts nothing
//! about speed.

use std::ffi::c_void;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use firehose::internals::monitor::{self, MonitorOptions};
use firehose::internals::pin::MlockPinner;
use firehose::internals::pin::{Access, PinError, Pinned, Pinner};

use crate::ffi_types::*;
use crate::pd_cache::{PdCache, TEST_UFFD};
use crate::serial::serial;
use crate::verbs_hooks::{ibv_dereg_mr, register_for_test};
use crate::{bypass, miss_cost};

/// `MlockPinner`, timed for the miss breakdown as `RealPinner` times the real calls.
struct Timed(MlockPinner);

impl Pinner for Timed {
    fn pin(&self, addr: usize, len: usize, access: Access) -> Result<Pinned, PinError> {
        let t0 = Instant::now();
        let r = self.0.pin(addr, len, access);
        miss_cost::pinned(t0.elapsed().as_nanos() as u64);
        r
    }
    fn unpin(&self, pinned: Pinned, addr: usize, len: usize) {
        let t0 = Instant::now();
        self.0.unpin(pinned, addr, len);
        miss_cost::unpinned(t0.elapsed().as_nanos() as u64);
    }
    fn name(&self) -> &'static str {
        "timed-mlock"
    }
}

/// This thread's CPU time in seconds: the host is shared, and wall time counts other tenants'
/// turns on the CPU.
fn cpu_s() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is writable.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

const LEN: usize = 65536;
const STEP: usize = LEN + 4096;
const ITERS: usize = 4000;

fn arena() -> *mut u8 {
    let size = ITERS * STEP;
    // SAFETY: a fresh private anonymous mapping, written once so every page is resident (the
    // benchmark's buffers were touched before they are sent: first touch is not what is measured).
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        std::ptr::write_bytes(p as *mut u8, 1, size);
        p as *mut u8
    }
}

fn free_arena(p: *mut u8) {
    // SAFETY: the mapping made by `arena`.
    unsafe { libc::munmap(p as *mut c_void, ITERS * STEP) };
}

/// The arena slot of registration `i`: a new one each time, or with `repeat_every` = k > 0, every
/// k-th registration one of 4 buffers that come back (a working set among fresh buffers).
fn slot(i: usize, repeat_every: usize) -> usize {
    if repeat_every > 0 && i.is_multiple_of(repeat_every) {
        i / repeat_every % 4
    } else {
        i
    }
}

/// mlock + munlock of each buffer: what registration costs without any cache.
fn direct(repeat_every: usize) -> f64 {
    let a = arena();
    let t0 = cpu_s();
    for i in 0..ITERS {
        // SAFETY: inside the arena.
        unsafe {
            let p = a.add(slot(i, repeat_every) * STEP) as *const c_void;
            assert_eq!(libc::mlock(p, LEN), 0, "mlock (needs root)");
            libc::munlock(p, LEN);
        }
    }
    let us = (cpu_s() - t0) * 1e6 / ITERS as f64;
    free_arena(a);
    us
}

/// The same buffers through the hooks' dispatch: (us per registration, breakdown, bypassed).
/// `even`: the bypass's break-even share in 1/256 (0: measured, as the shim runs).
fn through_shim(
    pd_id: usize,
    uffd: bool,
    bypass_on: bool,
    repeat_every: usize,
    even: u32,
) -> (f64, miss_cost::Breakdown, u64) {
    TEST_UFFD.store(uffd, Relaxed);
    bypass::reset();
    bypass::set_enabled(bypass_on);
    bypass::force_break_even(even);
    let mut pd = Box::new(IbvPd {
        context: pd_id as *mut c_void,
        handle: 9,
    });
    let pdp: *mut IbvPd = &mut *pd;
    PdCache::install_for_test(pdp, Arc::new(Timed(MlockPinner::new())));
    let a = arena();
    let dummy = 0x7777usize as *mut IbvMr;
    let w0 = monitor::watch_costs();
    let b0 = bypass::BYPASSED.load(Relaxed);
    miss_cost::reset();
    let t0 = cpu_s();
    for i in 0..ITERS {
        // SAFETY: a fake pd whose cache pins with mlock; the pass-through closure is the "real"
        // registration (mlock), undone below as the application's real ibv_dereg_mr would.
        unsafe {
            let p = a.add(slot(i, repeat_every) * STEP) as *mut c_void;
            let mr = register_for_test(pdp, p, LEN, p as u64, 1 | 2 | 4, || {
                assert_eq!(libc::mlock(p, LEN), 0);
                dummy
            });
            assert!(!mr.is_null());
            if mr == dummy {
                libc::munlock(p, LEN);
            } else {
                assert_eq!(ibv_dereg_mr(mr), 0);
            }
        }
    }
    let us = (cpu_s() - t0) * 1e6 / ITERS as f64;
    let b = miss_cost::since(w0);
    crate::pd_cache::drop_pd(pdp);
    free_arena(a);
    bypass::set_enabled(true);
    bypass::reset();
    TEST_UFFD.store(false, Relaxed);
    (us, b, bypass::BYPASSED.load(Relaxed) - b0)
}

/// CPU ns per hit: the same buffer registered and deregistered `n` times through the hooks.
fn hits(n: usize) -> f64 {
    TEST_UFFD.store(true, Relaxed);
    bypass::reset();
    let mut pd = Box::new(IbvPd {
        context: 0xD4 as *mut c_void,
        handle: 9,
    });
    let pdp: *mut IbvPd = &mut *pd;
    PdCache::install_for_test(pdp, Arc::new(Timed(MlockPinner::new())));
    let a = arena();
    let p = a as *mut c_void;
    let t0 = cpu_s();
    for _ in 0..n {
        // SAFETY: as in `through_shim`; the range stays cached, so every call but the first hits.
        unsafe {
            let mr = register_for_test(pdp, p, LEN, p as u64, 1 | 2 | 4, std::ptr::null_mut);
            assert!(!mr.is_null());
            assert_eq!(ibv_dereg_mr(mr), 0);
        }
    }
    let ns = (cpu_s() - t0) * 1e9 / n as f64;
    crate::pd_cache::drop_pd(pdp);
    free_arena(a);
    TEST_UFFD.store(false, Relaxed);
    bypass::reset();
    ns
}

#[test]
#[ignore = "a benchmark: run with --release --ignored --nocapture"]
fn miss_bench() {
    let _s = serial();
    let st = monitor::install(MonitorOptions {
        patch_libc: false,
        userfaultfd: true,
    });
    println!(
        "miss through the shim, {ITERS} buffers of {LEN} B at new addresses, mlock as the \
         registration (userfaultfd {})",
        if st.uffd { "on" } else { "REFUSED" }
    );
    // Rounds alternate the modes (the host is shared: the fastest of 5 rounds, the least disturbed).
    // Two workloads: every buffer new; and 1 in 4 registrations one of 4 buffers that come back,
    // where the bypass's share decides (the fixed 1 in 8 it had, and the measured break-even).
    let modes = [
        ("cache, uffd on, FH_BYPASS=off", 0xD1, true, false, 0, 32),
        ("cache, uffd off, FH_BYPASS=off", 0xD2, false, false, 0, 32),
        ("cache, uffd on, FH_BYPASS=auto", 0xD3, true, true, 0, 0),
        ("1 in 4 repeats, no cache", 0, false, false, 4, 0),
        ("1 in 4 repeats, bypass at 1 in 8", 0xD5, true, true, 4, 32),
        ("1 in 4 repeats, FH_BYPASS=auto", 0xD6, true, true, 4, 0),
    ];
    let mut runs: Vec<Vec<(f64, miss_cost::Breakdown, u64)>> = vec![Vec::new(); modes.len()];
    for _ in 0..5 {
        for (i, &(_, id, uffd, byp, rep, even)) in modes.iter().enumerate() {
            runs[i].push(if id == 0 {
                (direct(rep), miss_cost::Breakdown::default(), 0)
            } else {
                through_shim(id, uffd, byp, rep, even)
            });
        }
    }
    let fastest = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[0]
    };
    let mut base: Vec<f64> = (0..5).map(|_| direct(0)).collect();
    let base = fastest(&mut base);
    println!("  no cache (mlock+munlock)          {base:8.2} CPU us/reg  1.00x");
    let mut base_rep = base;
    for (i, &(name, id, _, _, rep, _)) in modes.iter().enumerate() {
        let mut us: Vec<f64> = runs[i].iter().map(|r| r.0).collect();
        let m = fastest(&mut us);
        if id == 0 {
            base_rep = m;
            println!("  {name:33} {m:8.2} CPU us/reg  1.00x");
            continue;
        }
        let against = if rep > 0 { base_rep } else { base };
        // The breakdown of the fastest round.
        let r = runs[i]
            .iter()
            .find(|r| r.0 == m)
            .expect("the fastest is a round");
        println!(
            "  {name:33} {m:8.2} CPU us/reg  {:.2}x of no cache's time; {} bypassed",
            m / against,
            r.2
        );
        if let Some(l) = miss_cost::lines(&r.1) {
            print!("{l}");
        }
    }
    let mut h: Vec<f64> = (0..5).map(|_| hits(200_000)).collect();
    println!(
        "  a hit (register + deregister the same buffer)  {:.0} CPU ns",
        fastest(&mut h)
    );
}
