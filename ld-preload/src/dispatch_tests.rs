//! Host tests of the hooks' dispatch, without a device: a fake protection domain whose cache runs
//! over the library's counting pinner (`PdCache::install_for_test`), driven through the exported
//! `ibv_*` functions and the exported `munmap`. Paths that would reach the real libibverbs with a
//! fake pd (pass-through registration, foreign dereg, dealloc) are exercised in the VM suite;
//! here pass-through is observed through `register`'s closure instead.

use std::ffi::c_void;
use std::sync::Arc;

use firehose::internals::pin::Access;
use firehose::internals::pin::CountingPinner;

use crate::ffi_types::*;
use crate::pd_cache::{self, PdCache};
use crate::serial::serial;
use crate::stats::snapshot;
use crate::verbs_hooks::*;

const RW: i32 = 1 | 2 | 4;

struct FakePd {
    pd: Box<IbvPd>,
    pinner: Arc<CountingPinner>,
}

fn fake_pd(context: usize) -> FakePd {
    let mut pd = Box::new(IbvPd {
        context: context as *mut c_void,
        handle: 7,
    });
    let pinner = Arc::new(CountingPinner::new());
    PdCache::install_for_test(&mut *pd, pinner.clone());
    FakePd { pd, pinner }
}

impl FakePd {
    fn ptr(&mut self) -> *mut IbvPd {
        &mut *self.pd
    }
}

pub(crate) fn anon(len: usize) -> *mut u8 {
    // SAFETY: a fresh private anonymous mapping.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    p as *mut u8
}

#[test]
fn wrapper_has_the_exact_range_and_a_hit_reuses_the_keys() {
    let _s = serial();
    let mut f = fake_pd(0xC0);
    let buf = anon(65536);
    let s0 = snapshot();
    // SAFETY: a valid (fake) pd whose cache never calls libibverbs; `buf` is mapped.
    unsafe {
        let a = ibv_reg_mr(f.ptr(), buf.add(100) as *mut c_void, 5000, RW);
        assert!(!a.is_null());
        assert_eq!((*a).addr as usize, buf as usize + 100);
        assert_eq!((*a).length, 5000);
        assert_eq!((*a).pd, f.ptr());
        assert_eq!((*a).context as usize, 0xC0);
        let b = ibv_reg_mr_iova2(
            f.ptr(),
            buf.add(100) as *mut c_void,
            5000,
            buf as u64 + 100,
            7,
        );
        assert!(!b.is_null() && b != a, "a second wrapper");
        assert_eq!(
            ((*b).lkey, (*b).rkey),
            ((*a).lkey, (*a).rkey),
            "a hit: same keys"
        );
        assert_eq!(f.pinner.pins(), 1, "one real pin for two registrations");
        let s1 = snapshot();
        assert_eq!(s1.app_reg_calls - s0.app_reg_calls, 2);
        assert_eq!(s1.hit_bytes - s0.hit_bytes, 5000);
        assert_eq!(s1.wrappers_live - s0.wrappers_live, 2);
        assert_eq!(ibv_dereg_mr(a), 0);
        assert_eq!(ibv_dereg_mr(b), 0);
        assert_eq!(snapshot().wrappers_live, s0.wrappers_live);
        assert_eq!(f.pinner.live_count(), 1, "lazy release keeps it pinned");
        libc::munmap(buf as *mut c_void, 65536);
    }
}

/// A second (or concurrent) `ibv_dereg_mr` of a wrapper is refused: it went to libibverbs, which
/// deregistered the cached MR other wrappers share (their lkey dead) and freed our slot into
/// malloc's heap (found by review with a fake libibverbs). Here libibverbs is never reached: the
/// pinner keeps the shared registration, the other wrapper stays usable.
#[test]
fn a_second_dereg_of_a_wrapper_is_refused_and_changes_nothing() {
    let _s = serial();
    let mut f = fake_pd(0xC2);
    let buf = anon(65536);
    let s0 = snapshot();
    // SAFETY: a valid (fake) pd whose cache never calls libibverbs; `buf` is mapped.
    unsafe {
        let a = ibv_reg_mr(f.ptr(), buf as *mut c_void, 8192, RW);
        let b = ibv_reg_mr(f.ptr(), buf as *mut c_void, 8192, RW);
        assert!(!a.is_null() && !b.is_null() && a != b);
        assert_eq!(ibv_dereg_mr(a), 0);
        assert_eq!(ibv_dereg_mr(a), libc::EINVAL, "a second dereg");
        assert_eq!(
            ibv_rereg_mr(a, 0, std::ptr::null_mut(), std::ptr::null_mut(), 0, 0),
            IBV_REREG_MR_ERR_INPUT,
            "a rereg of a deregistered wrapper"
        );
        let s1 = snapshot();
        assert_eq!(s1.stale_deregs - s0.stale_deregs, 2);
        assert_eq!(
            s1.passthrough_dereg, s0.passthrough_dereg,
            "nothing reached libibverbs"
        );
        assert_eq!(
            f.pinner.live_count(),
            1,
            "the shared registration is still pinned"
        );
        assert_eq!(
            (*b).addr as usize,
            buf as usize,
            "the other wrapper is intact"
        );
        assert_eq!(ibv_dereg_mr(b), 0);
        assert_eq!(snapshot().wrappers_live, s0.wrappers_live);
        libc::munmap(buf as *mut c_void, 65536);
    }
}

#[test]
fn read_only_registration_does_not_serve_remote_write() {
    let _s = serial();
    let mut f = fake_pd(0xC1);
    let buf = anon(8192);
    // SAFETY: as above.
    unsafe {
        let ro = ibv_reg_mr(f.ptr(), buf as *mut c_void, 8192, 1);
        let rw = ibv_reg_mr(f.ptr(), buf as *mut c_void, 8192, RW);
        assert!(!ro.is_null() && !rw.is_null());
        assert_eq!(
            f.pinner.pins(),
            2,
            "remote write needs its own registration"
        );
        ibv_dereg_mr(ro);
        ibv_dereg_mr(rw);
        libc::munmap(buf as *mut c_void, 8192);
    }
}

#[test]
fn remote_rights_are_never_widened_but_local_write_may_be() {
    let _s = serial();
    let mut f = fake_pd(0xC6);
    let buf = anon(8192);
    // SAFETY: as above.
    unsafe {
        let rw = ibv_reg_mr(f.ptr(), buf as *mut c_void, 8192, RW);
        let rr = ibv_reg_mr(f.ptr(), buf as *mut c_void, 8192, 1 | 4);
        assert_eq!(
            f.pinner.pins(),
            2,
            "remote read alone must not get the remote-write rkey"
        );
        assert_ne!((*rr).rkey, (*rw).rkey);
        let lw = ibv_reg_mr(f.ptr(), buf as *mut c_void, 4096, 1);
        let none = ibv_reg_mr(f.ptr(), buf as *mut c_void, 4096, 0);
        assert_eq!(
            f.pinner.pins(),
            3,
            "no remote rights: one class, local write may serve"
        );
        assert_eq!((*none).lkey, (*lw).lkey);
        for m in [rw, rr, lw, none] {
            assert_eq!(ibv_dereg_mr(m), 0);
        }
        pd_cache::drop_pd(f.ptr());
        assert_eq!(
            f.pinner.live_count(),
            0,
            "every class of the domain is dropped"
        );
        libc::munmap(buf as *mut c_void, 8192);
    }
}

#[test]
fn munmap_through_the_exported_hook_invalidates_the_idle_registration() {
    let _s = serial();
    let mut f = fake_pd(0xC2);
    let len = 1 << 20;
    let buf = anon(len);
    // SAFETY: as above; the address is remapped with MAP_FIXED_NOREPLACE semantics checked.
    unsafe {
        let a = ibv_reg_mr(f.ptr(), buf as *mut c_void, len, RW);
        assert_eq!(ibv_dereg_mr(a), 0);
        let inv0 = snapshot().invalidations;
        assert_eq!(crate::unmap_hooks::munmap(buf as *mut c_void, len), 0);
        let again = libc::mmap(
            buf as *mut c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        );
        assert_eq!(again as usize, buf as usize, "address reused");
        let b = ibv_reg_mr(f.ptr(), buf as *mut c_void, len, RW);
        assert!(!b.is_null());
        assert_eq!(
            f.pinner.pins(),
            2,
            "the stale registration must not be reused"
        );
        assert!(snapshot().invalidations > inv0);
        ibv_dereg_mr(b);
        libc::munmap(buf as *mut c_void, len);
    }
}

#[test]
fn rereg_moves_the_same_wrapper_and_bad_flags_leave_it_alone() {
    let _s = serial();
    let mut f = fake_pd(0xC3);
    let buf = anon(65536);
    // SAFETY: as above.
    unsafe {
        let m = ibv_reg_mr(f.ptr(), buf as *mut c_void, 4096, RW);
        let before = *m;
        let bad = ibv_rereg_mr(m, 1 << 5, std::ptr::null_mut(), std::ptr::null_mut(), 0, 0);
        assert_eq!(bad, IBV_REREG_MR_ERR_INPUT);
        assert_eq!((*m).addr, before.addr);
        let no_len = ibv_rereg_mr(
            m,
            IBV_REREG_MR_CHANGE_TRANSLATION,
            std::ptr::null_mut(),
            buf as *mut c_void,
            0,
            0,
        );
        assert_eq!(
            no_len, IBV_REREG_MR_ERR_INPUT,
            "translation without a length"
        );
        let access_unasked = ibv_rereg_mr(
            m,
            IBV_REREG_MR_CHANGE_TRANSLATION,
            std::ptr::null_mut(),
            buf as *mut c_void,
            4096,
            1,
        );
        assert_eq!(
            access_unasked, IBV_REREG_MR_ERR_INPUT,
            "access rights without CHANGE_ACCESS (rdma-core: EINVAL)"
        );
        assert_eq!(((*m).addr, (*m).length), (before.addr, before.length));
        let r = ibv_rereg_mr(
            m,
            IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS,
            std::ptr::null_mut(),
            buf.add(32768 + 8) as *mut c_void,
            1000,
            1,
        );
        assert_eq!(r, 0);
        assert_eq!((*m).addr as usize, buf as usize + 32768 + 8);
        assert_eq!((*m).length, 1000);
        assert_eq!((*m).pd, f.ptr());
        assert_eq!(f.pinner.pins(), 2);
        assert_eq!(
            f.pinner.live_count(),
            2,
            "old one idle in the cache, new one in use"
        );
        assert_eq!(ibv_dereg_mr(m), 0, "the moved wrapper is still ours");
        libc::munmap(buf as *mut c_void, 65536);
    }
}

/// Pinnable memory is the process's (RLIMIT_MEMLOCK), caches are per domain and rights class:
/// a registration that finds the limit taken by another cache's idle regions gets them released
/// and succeeds, instead of failing with ENOMEM although the application holds nothing (found by
/// review with a fake libibverbs enforcing a memlock budget).
#[test]
fn out_of_memory_releases_the_idle_regions_of_every_cache() {
    let _s = serial();
    let shared = Arc::new(CountingPinner::new());
    let mut pd1 = Box::new(IbvPd {
        context: 0xC7 as *mut c_void,
        handle: 7,
    });
    let mut pd2 = Box::new(IbvPd {
        context: 0xC7 as *mut c_void,
        handle: 8,
    });
    PdCache::install_for_test(&mut *pd1, shared.clone());
    PdCache::install_for_test(&mut *pd2, shared.clone());
    shared.set_budget(Some(8 << 20));
    let buf = anon(16 << 20);
    // SAFETY: fake pds whose caches never call libibverbs; `buf` is mapped.
    unsafe {
        let a = ibv_reg_mr(&mut *pd1, buf as *mut c_void, 6 << 20, RW);
        assert!(!a.is_null());
        assert_eq!(ibv_dereg_mr(a), 0);
        assert_eq!(shared.live_bytes(), 6 << 20, "kept idle by pd1's cache");
        let passed = std::cell::Cell::new(0);
        let b = crate::verbs_hooks::register_for_test(
            &mut *pd2,
            buf.add(8 << 20) as *mut c_void,
            4 << 20,
            buf as u64 + (8 << 20),
            RW as u32,
            || {
                passed.set(passed.get() + 1);
                std::ptr::null_mut()
            },
        );
        assert!(!b.is_null(), "served after pd1's idle region was released");
        assert_eq!(passed.get(), 0, "from the cache, not passed through");
        assert_eq!(shared.live_bytes(), 4 << 20);
        assert_eq!(ibv_dereg_mr(b), 0);
        shared.set_budget(None);
        pd_cache::drop_pd(&mut *pd1);
        pd_cache::drop_pd(&mut *pd2);
        libc::munmap(buf as *mut c_void, 16 << 20);
    }
}

#[test]
fn dropping_a_domain_releases_what_only_the_cache_held() {
    let _s = serial();
    let mut f = fake_pd(0xC4);
    let buf = anon(16384);
    // SAFETY: as above.
    unsafe {
        let a = ibv_reg_mr(f.ptr(), buf as *mut c_void, 16384, RW);
        ibv_dereg_mr(a);
        assert_eq!(f.pinner.live_count(), 1);
        pd_cache::drop_pd(f.ptr());
        assert_eq!(
            f.pinner.live_count(),
            0,
            "idle registrations flushed before dealloc"
        );
        libc::munmap(buf as *mut c_void, 16384);
    }
}

#[test]
fn uncacheable_and_nested_calls_pass_through_counted_once() {
    let _s = serial();
    let mut f = fake_pd(0xC5);
    let buf = anon(8192);
    let fake_mr = 0x1234usize as *mut IbvMr;
    let s0 = snapshot();
    // SAFETY: the pass-through closure returns a dummy without touching libibverbs.
    unsafe {
        let on_demand = 1 | 0x40;
        let p = register_for_test(
            f.ptr(),
            buf as *mut c_void,
            8192,
            buf as u64,
            on_demand,
            || fake_mr,
        );
        assert_eq!(p, fake_mr, "ODP goes to the real function");
        let iova = register_for_test(f.ptr(), buf as *mut c_void, 8192, 0x9000, RW as u32, || {
            fake_mr
        });
        assert_eq!(iova, fake_mr, "iova != addr goes to the real function");
        // An application call whose real function re-enters the hook (as libibverbs'
        // ibv_reg_mr does through the PLT): one app call, one nested call.
        let pd = f.ptr();
        let outer = register_for_test(pd, buf as *mut c_void, 8192, buf as u64, 0x10, || {
            register_for_test(pd, buf as *mut c_void, 8192, buf as u64, 0x10, || fake_mr)
        });
        assert_eq!(outer, fake_mr);
        let s1 = snapshot();
        assert_eq!(s1.app_reg_calls - s0.app_reg_calls, 3);
        assert_eq!(s1.nested_calls - s0.nested_calls, 1);
        assert_eq!(s1.passthrough_reg - s0.passthrough_reg, 3);
        assert_eq!(f.pinner.pins(), 0, "nothing was cached");
        libc::munmap(buf as *mut c_void, 8192);
    }
}

/// The benchmark's loop (register + deregister the same cached buffer) stays on the hit path:
/// one real pin for all of it, every wrapper freed, each hit counted. Also the loop profiled with
/// `valgrind --tool=callgrind` to count instructions per shim hit.
#[test]
fn repeated_reg_dereg_of_a_cached_buffer_is_all_hits() {
    let _s = serial();
    let mut f = fake_pd(0xC3);
    let buf = anon(65536);
    const N: u64 = 2000;
    // SAFETY: a valid (fake) pd whose cache never calls libibverbs; `buf` is mapped.
    unsafe {
        let s0 = snapshot();
        for _ in 0..N {
            let mr = ibv_reg_mr(f.ptr(), buf as *mut c_void, 65536, RW);
            assert!(!mr.is_null());
            assert_eq!((*mr).length, 65536);
            assert_eq!(ibv_dereg_mr(mr), 0);
        }
        let s1 = snapshot();
        assert_eq!(f.pinner.pins(), 1, "only the first registration pins");
        assert_eq!(s1.hits - s0.hits, N - 1);
        assert_eq!(s1.app_reg_calls - s0.app_reg_calls, N);
        assert_eq!(s1.hit_bytes - s0.hit_bytes, (N - 1) * 65536);
        assert_eq!(s1.wrappers_live, s0.wrappers_live, "every wrapper freed");
        libc::munmap(buf as *mut c_void, 65536);
    }
}

/// Threads registering and deregistering at once (wrappers taken from per-thread spares and the
/// shared pool, handed between threads): every wrapper is the caller's own, none lost.
#[test]
fn concurrent_threads_get_their_own_wrappers() {
    let _s = serial();
    let mut f = fake_pd(0xC4);
    let pd = f.ptr() as usize;
    let buf = anon(1 << 20) as usize;
    let s0 = snapshot();
    let threads: Vec<_> = (0..4usize)
        .map(|t| {
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                for i in 0..300usize {
                    let addr = buf + (t * 256 + i % 200) * 1024;
                    // SAFETY: fake pd; `addr` is inside the mapped buffer.
                    let mr = unsafe { ibv_reg_mr(pd as *mut IbvPd, addr as *mut c_void, 512, RW) };
                    assert!(!mr.is_null());
                    // SAFETY: a live wrapper.
                    assert_eq!(unsafe { (*mr).addr } as usize, addr);
                    mine.push(mr as usize);
                    if i % 3 == 2 {
                        // Release out of order, including wrappers made earlier.
                        let m = mine.swap_remove(i % mine.len());
                        // SAFETY: a live wrapper of ours.
                        assert_eq!(unsafe { ibv_dereg_mr(m as *mut IbvMr) }, 0);
                    }
                }
                mine
            })
        })
        .collect();
    let left: Vec<usize> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let distinct: std::collections::HashSet<&usize> = left.iter().collect();
    assert_eq!(distinct.len(), left.len(), "no wrapper handed out twice");
    assert_eq!(
        snapshot().app_reg_calls - s0.app_reg_calls,
        4 * 300,
        "per-thread counts of exited threads still summed"
    );
    assert_eq!(
        snapshot().wrappers_live - s0.wrappers_live,
        left.len() as u64
    );
    for m in left {
        // SAFETY: live wrappers, released once each (from another thread than their maker's).
        assert_eq!(unsafe { ibv_dereg_mr(m as *mut IbvMr) }, 0);
    }
    assert_eq!(snapshot().wrappers_live, s0.wrappers_live);
    assert_eq!(
        f.pinner.live_count(),
        f.pinner.pins() as usize - f.pinner.unpins() as usize
    );
    // SAFETY: unmapping our own buffer.
    unsafe { libc::munmap(buf as *mut c_void, 1 << 20) };
}

/// A wrapper inherited across `fork`: its cache is the parent's, quarantined in the child
/// (`FH_ERR_FORKED`). The child's `ibv_dereg_mr` of it succeeds and frees the child's copy of the
/// wrapper, and leaves the registration behind it to the parent (nothing unpinned in the child;
/// the parent's own dereg still works). Before, it returned EINVAL and kept the wrapper.
#[test]
fn a_child_deregisters_an_inherited_wrapper_without_touching_the_parent() {
    let _s = serial();
    let mut f = fake_pd(0xC7);
    let buf = anon(8192);
    // SAFETY: a valid (fake) pd whose cache never calls libibverbs; `buf` is mapped.
    let mr = unsafe { ibv_reg_mr(f.ptr(), buf as *mut c_void, 8192, RW) };
    assert!(!mr.is_null());
    let live0 = snapshot().wrappers_live;
    let (pins0, unpins0) = (f.pinner.pins(), f.pinner.unpins());
    // SAFETY: the child uses the shim's own paths (allocation is fork-safe in glibc) and leaves
    // with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = (|| {
            // SAFETY: the wrapper the parent handed out, inherited.
            let rc = unsafe { ibv_dereg_mr(mr) };
            if rc != 0 {
                return 10 + rc.clamp(0, 100);
            }
            if snapshot().wrappers_live != live0 - 1 {
                return 2; // the wrapper was kept
            }
            if (f.pinner.pins(), f.pinner.unpins()) != (pins0, unpins0) {
                return 3; // the parent's registration was released
            }
            0
        })();
        // SAFETY: leave without running the test harness in the child.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    // SAFETY: the parent's own wrapper, still live here.
    assert_eq!(unsafe { ibv_dereg_mr(mr) }, 0);
    pd_cache::drop_pd(f.ptr());
    // SAFETY: our mapping.
    unsafe { libc::munmap(buf as *mut c_void, 8192) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child exit code {} (10+errno: dereg failed, 2: wrapper kept, 3: parent's released)",
        libc::WEXITSTATUS(status)
    );
}

/// One cache per domain, far more domains than the registry's old 32 slots.
/// Every domain's cache must be invalidated by `munmap` (before the fix, the caches past the
/// 32nd were never subscribed and served the stale registration).
#[test]
fn a_hundred_domains_are_each_invalidated() {
    let _s = serial();
    let n = 100;
    let mut pds: Vec<Box<IbvPd>> = (0..n)
        .map(|i| {
            Box::new(IbvPd {
                context: (0xD000 + i) as *mut c_void,
                handle: 9,
            })
        })
        .collect();
    let pinners: Vec<Arc<CountingPinner>> = pds
        .iter_mut()
        .map(|pd| {
            let p = Arc::new(CountingPinner::new());
            PdCache::install_for_test(&mut **pd, p.clone());
            p
        })
        .collect();
    let len = 8192;
    let map = |at: *mut c_void, flags: i32| {
        // SAFETY: a fresh private anonymous mapping (never over an existing one).
        unsafe {
            libc::mmap(
                at,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
                -1,
                0,
            )
        }
    };
    let buf = map(std::ptr::null_mut(), 0);
    assert_ne!(buf, libc::MAP_FAILED);
    let reg_dereg = |pds: &mut Vec<Box<IbvPd>>| {
        for pd in pds.iter_mut() {
            // SAFETY: a (fake) pd whose cache never calls libibverbs; `buf` is mapped.
            unsafe {
                let mr = ibv_reg_mr(&mut **pd, buf, len, RW);
                assert!(!mr.is_null());
                assert_eq!(ibv_dereg_mr(mr), 0);
            }
        }
    };
    reg_dereg(&mut pds);
    // SAFETY: our mapping, through the shim's exported munmap (tells every cache first).
    assert_eq!(unsafe { crate::unmap_hooks::munmap(buf, len) }, 0);
    assert_eq!(map(buf, libc::MAP_FIXED_NOREPLACE), buf, "address reused");
    reg_dereg(&mut pds);
    let stale: Vec<usize> = (0..n).filter(|&i| pinners[i].pins() != 2).collect();
    for pd in pds.iter_mut() {
        pd_cache::drop_pd(&mut **pd);
    }
    // SAFETY: our mapping.
    unsafe { libc::munmap(buf, len) };
    assert!(
        stale.is_empty(),
        "{} of {n} domains served a stale registration: {stale:?}",
        stale.len()
    );
}

/// Fork, the shim's side: a child never uses a cache of its parent (they are the
/// parent's, quarantined by the library); its first registration in a domain builds a new
/// cache, in which register, munmap, register misses twice.
#[test]
fn a_child_builds_its_own_caches() {
    let _s = serial();
    let mut pd = Box::new(IbvPd {
        context: 0xE000 as *mut c_void,
        handle: 9,
    });
    let pinner = Arc::new(CountingPinner::new());
    PdCache::install_for_test(&mut *pd, pinner.clone());
    let len = 8192;
    let map = |at: *mut c_void, flags: i32| {
        // SAFETY: a fresh private anonymous mapping (never over an existing one).
        unsafe {
            libc::mmap(
                at,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
                -1,
                0,
            )
        }
    };
    let buf = map(std::ptr::null_mut(), 0);
    assert_ne!(buf, libc::MAP_FAILED);
    // SAFETY: a (fake) pd whose cache never calls libibverbs; `buf` is mapped.
    let mr = unsafe { ibv_reg_mr(&mut *pd, buf, len, RW) };
    assert!(!mr.is_null());
    // The parent's cache, remembered by this thread and in the map.
    let parent = pd_cache::for_pd(&mut *pd, Access(RW as u32)).unwrap();
    // SAFETY: the child uses the shim's own paths (allocation is fork-safe in glibc) and
    // leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = (|| {
            if !parent.is_forked() {
                return 1; // the library did not quarantine it
            }
            let Ok(c) = pd_cache::for_pd(&mut *pd, Access(RW as u32)) else {
                return 2;
            };
            if Arc::ptr_eq(&c, &parent) {
                return 3; // the parent's cache handed out in the child
            }
            let pins0 = pinner.pins();
            // SAFETY: as in the parent; `buf` is mapped in the child too.
            unsafe {
                let a = ibv_reg_mr(&mut *pd, buf, len, RW);
                if a.is_null() || ibv_dereg_mr(a) != 0 {
                    return 4;
                }
                if crate::unmap_hooks::munmap(buf, len) != 0
                    || map(buf, libc::MAP_FIXED_NOREPLACE) != buf
                {
                    return 5;
                }
                let b = ibv_reg_mr(&mut *pd, buf, len, RW);
                if b.is_null() || ibv_dereg_mr(b) != 0 {
                    return 6;
                }
            }
            if pinner.pins() - pins0 != 2 {
                return 7; // a hit on memory unmapped in between
            }
            0
        })();
        // SAFETY: leave without running the test harness in the child.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(!parent.is_forked(), "the parent's cache stays in service");
    drop(parent);
    // SAFETY: the wrapper from above.
    assert_eq!(unsafe { ibv_dereg_mr(mr) }, 0);
    pd_cache::drop_pd(&mut *pd);
    // SAFETY: our mapping.
    unsafe { libc::munmap(buf, len) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child exit code {} (1: not quarantined, 3: parent's cache reused, 7: stale hit)",
        libc::WEXITSTATUS(status)
    );
}

/// `ibv_close_device`'s first step, `drop_context`: the caches of every domain of that context
/// release what they keep and are forgotten; another context's cache keeps its registration.
/// Afterwards an unmap of the range reaches none of the dropped caches' backends. (The exported
/// hook itself then calls the real `ibv_close_device`, which a fake context cannot take: the VM
/// suite runs it, `56-preload-close-device.sh`.)
#[test]
fn closing_a_device_drops_the_caches_of_its_domains_only() {
    let _s = serial();
    let (mut a1, mut a2, mut b) = (fake_pd(0xCA), fake_pd(0xCA), fake_pd(0xCB));
    let len = 65536;
    let buf = anon(len);
    let caches0 = snapshot().caches;
    for f in [&mut a1, &mut a2, &mut b] {
        // SAFETY: a valid (fake) pd whose cache never calls libibverbs; `buf` is mapped.
        unsafe {
            let mr = ibv_reg_mr(f.ptr(), buf as *mut c_void, len, RW);
            assert!(!mr.is_null());
            assert_eq!(ibv_dereg_mr(mr), 0);
        }
        assert_eq!(f.pinner.live_count(), 1, "kept after the release (lazy)");
    }
    assert_eq!(snapshot().caches, caches0 + 3);
    pd_cache::drop_context(0xCA as *mut c_void);
    assert_eq!((a1.pinner.live_count(), a2.pinner.live_count()), (0, 0));
    assert_eq!(
        b.pinner.live_count(),
        1,
        "another device's cache is left alone"
    );
    assert_eq!(snapshot().caches, caches0 + 1);
    let unpins = (a1.pinner.unpins(), a2.pinner.unpins());
    // SAFETY: our mapping, unmapped through the shim's exported hook.
    assert_eq!(
        unsafe { crate::unmap_hooks::munmap(buf as *mut c_void, len) },
        0
    );
    assert_eq!((a1.pinner.unpins(), a2.pinner.unpins()), unpins);
    pd_cache::drop_pd(b.ptr());
    assert_eq!(b.pinner.live_count(), 0);
}

/// Registrations from a new address every time (every one a miss) go straight to libibverbs
/// after the first window (`bypass.rs`): the real MR, never a wrapper, nothing cached. A range
/// registered again goes through the cache, and the bypassed MR is never what it hands out.
#[test]
fn fresh_addresses_are_bypassed_and_never_served_from_the_cache() {
    let _s = serial();
    crate::bypass::reset();
    crate::bypass::set_enabled(true);
    let mut f = fake_pd(0xC7);
    let n = crate::bypass::FIRST_WINDOW as usize + 8;
    let len = 8192;
    let buf = anon(n * 2 * len);
    let real_mr = 0x4321usize as *mut IbvMr;
    let s0 = snapshot();
    // SAFETY: a fake pd whose cache never calls libibverbs; the pass-through closure returns a
    // dummy; `buf` is mapped.
    unsafe {
        let at = |i: usize| buf.add(i * 2 * len) as *mut c_void;
        let mut wrappers = 0;
        for i in 0..n {
            let p = register_for_test(f.ptr(), at(i), len, at(i) as u64, RW as u32, || real_mr);
            if p == real_mr {
                continue;
            }
            // The window's registrations only: after it, the probes (`bypass::PROBE`) look in
            // the cache, which does not hold these new ranges.
            assert!(
                i < crate::bypass::FIRST_WINDOW as usize,
                "cached after the window"
            );
            wrappers += 1;
            assert_eq!(ibv_dereg_mr(p), 0);
        }
        let s1 = snapshot();
        let bypassed = s1.bypassed_reg - s0.bypassed_reg;
        assert_eq!(wrappers, crate::bypass::FIRST_WINDOW as usize);
        assert_eq!(
            bypassed as usize,
            n - wrappers,
            "all after the window, the probe too"
        );
        assert_eq!(
            s1.passthrough_reg - s0.passthrough_reg,
            bypassed,
            "a bypass is a pass-through"
        );
        assert_eq!(
            s1.app_reg_calls - s0.app_reg_calls,
            (s1.hits + s1.misses + s1.passthrough_reg) - (s0.hits + s0.misses + s0.passthrough_reg),
            "app calls = hits + misses + pass-throughs"
        );
        let pins = f.pinner.pins();
        assert_eq!(
            pins as usize, wrappers,
            "bypassed ones were never pinned by the cache"
        );
        // The last address again: a repeat goes to the cache (a wrapper, a fresh pin there).
        let again = register_for_test(f.ptr(), at(n - 1), len, at(n - 1) as u64, RW as u32, || {
            real_mr
        });
        assert!(!again.is_null() && again != real_mr, "a repeat is cached");
        assert_eq!(f.pinner.pins(), pins + 1);
        assert_eq!(ibv_dereg_mr(again), 0);
        libc::munmap(buf as *mut c_void, n * 2 * len);
    }
    crate::bypass::reset();
}

/// While bypassing, a probe looks in the cache without pinning (`bypass::Route::Peek`): a
/// sub-range of a region cached earlier is served from it (a hit: no new pin), a range the cache
/// does not hold passes straight through with nothing pinned, and once the region's memory is
/// unmapped the probe no longer finds it.
#[test]
fn bypassed_probes_hit_cached_regions_and_pin_nothing() {
    let _s = serial();
    crate::bypass::reset();
    crate::bypass::set_enabled(true);
    let mut f = fake_pd(0xC9);
    let len = 8192;
    let pool_len = 64 * 4096;
    let window = crate::bypass::FIRST_WINDOW as usize;
    let probe = crate::bypass::PROBE as usize;
    let pool = anon(pool_len);
    let fresh = anon(window * 2 * len);
    let real_mr = 0x5432usize as *mut IbvMr;
    // SAFETY: a fake pd whose cache never calls libibverbs; the pass-through closure returns a
    // dummy; both mappings are ours.
    unsafe {
        // The pool: cached (first window), deregistered, idle in the cache.
        let p = register_for_test(
            f.ptr(),
            pool as *mut c_void,
            pool_len,
            pool as u64,
            RW as u32,
            || real_mr,
        );
        assert!(!p.is_null() && p != real_mr, "cached in the first window");
        assert_eq!(ibv_dereg_mr(p), 0);
        // The rest of the window from new addresses: bypassing after it.
        for i in 1..window {
            let a = fresh.add(i * 2 * len) as *mut c_void;
            let m = register_for_test(f.ptr(), a, len, a as u64, RW as u32, || real_mr);
            if m != real_mr {
                assert_eq!(ibv_dereg_mr(m), 0);
            }
        }
        assert!(crate::bypass::bypassing(), "a window of misses: bypassing");
        let pins = f.pinner.pins();
        let s0 = snapshot();
        // Sub-ranges of the pool, each a new key: one in `probe` looks in the cache and hits.
        let mut served = 0;
        for i in 0..2 * probe {
            let a = pool.add((i % 60) * 4096) as *mut c_void;
            let l = 4096 + (i / 60) * 4096 + 1; // never the same (address, length) twice
            let m = register_for_test(f.ptr(), a, l, a as u64, RW as u32, || real_mr);
            if m != real_mr {
                served += 1;
                assert_eq!((*m).addr, a);
                assert_eq!(ibv_dereg_mr(m), 0);
            }
        }
        assert_eq!(served, 2, "each probe hit the cached pool");
        assert_eq!(f.pinner.pins(), pins, "a probe pins nothing");
        let s1 = snapshot();
        assert_eq!(s1.hits - s0.hits, 2);
        assert_eq!(s1.misses, s0.misses, "a probe is never a miss");
        // A probe of a range the cache does not hold: passed through, nothing pinned.
        let mut through = 0;
        for i in 0..probe {
            // In the gap after a window registration (those are cached, idle).
            let a = fresh.add(((i % (window - 1)) + 1) * 2 * len + len + 16) as *mut c_void;
            let m = register_for_test(f.ptr(), a, 100 + i, a as u64, RW as u32, || real_mr);
            assert_eq!(m, real_mr, "nothing cached holds it");
            through += 1;
        }
        assert_eq!(through, probe);
        assert_eq!(f.pinner.pins(), pins);
        // The pool's memory goes: a probe must not find its registration any more.
        assert_eq!(crate::unmap_hooks::munmap(pool as *mut c_void, pool_len), 0);
        let mut stale = 0;
        for i in 0..2 * probe {
            let a = pool.add((i % 60) * 4096) as *mut c_void;
            // New keys (lengths the loops above never used): only the probes look in the cache.
            let m = register_for_test(f.ptr(), a, 3 * 4096 + 100 + i, a as u64, RW as u32, || {
                real_mr
            });
            if m != real_mr {
                stale += 1;
                assert_eq!(ibv_dereg_mr(m), 0);
            }
        }
        assert_eq!(stale, 0, "a probe served an unmapped region");
        libc::munmap(fresh as *mut c_void, window * 2 * len);
    }
    pd_cache::drop_pd(f.ptr());
    crate::bypass::reset();
}
