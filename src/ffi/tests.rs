//! Unit tests of the exports, called the way C calls them (raw pointers, status codes).
//! The C programs in `c-tests/` cover the same ground from C; these run under `cargo test`.

use std::ffi::c_void;
use std::ptr::{null, null_mut};

use super::types::FH_CONFIG_MIN_SIZE;
use super::*;
use crate::ffi::status::fh_status::{self, *};

fn config() -> fh_config {
    let mut cfg = std::mem::MaybeUninit::<fh_config>::uninit();
    // SAFETY: valid output pointer.
    assert_eq!(unsafe { fh_config_init(cfg.as_mut_ptr()) }, FH_OK);
    // SAFETY: initialised by the successful call.
    let mut cfg = unsafe { cfg.assume_init() };
    cfg.backend = FH_BACKEND_MLOCK;
    cfg.monitor = 0;
    cfg.max_pinned = 1 << 24;
    cfg.max_regions = 8;
    cfg
}

fn new_cache(cfg: &fh_config) -> Result<*mut fh_cache, fh_status> {
    let mut c = null_mut();
    // SAFETY: valid pointers.
    match unsafe { fh_cache_new(cfg, &mut c) } {
        FH_OK => Ok(c),
        e => {
            assert!(c.is_null(), "output written on failure");
            Err(e)
        }
    }
}

#[test]
fn struct_size_is_checked() {
    let good = config();
    let first = FH_CONFIG_MIN_SIZE as u32;
    for size in [
        0,
        4,
        first - 1,
        first + 4,
        good.struct_size - 1,
        good.struct_size + 8,
    ] {
        let cfg = fh_config {
            struct_size: size,
            ..good
        };
        assert_eq!(
            new_cache(&cfg),
            Err(FH_ERR_BAD_CONFIG),
            "struct_size {size}"
        );
    }
    let c = new_cache(&good).expect("the size fh_config_init sets is accepted");
    // SAFETY: live cache, freed once.
    unsafe { fh_cache_free(c) };
    // A caller built against the first layout: its fields are read, the newer ones come from
    // the environment (FH_HELPER is not set in the test environment: off). Garbage past the
    // first layout is never read.
    let old = fh_config {
        struct_size: first,
        helper: 77,
        helper_cpu: 12345,
        helper_min_bytes: 0,
        ..good
    };
    let c = new_cache(&old).expect("the first layout is accepted");
    // SAFETY: live cache.
    let c_ref = unsafe { &*c };
    assert!(matches!(
        c_ref.helper.state(),
        crate::helper::HelperState::Off { .. }
    ));
    // SAFETY: live cache, freed once.
    unsafe { fh_cache_free(c) };
    for bad in [
        fh_config { helper: 2, ..good },
        fh_config {
            helper_cpu: 1024,
            ..good
        },
        fh_config {
            helper_min_bytes: 0,
            ..good
        },
    ] {
        assert_eq!(new_cache(&bad), Err(FH_ERR_BAD_CONFIG));
    }
}

/// The helper through the C API, forced on with an explicit core (`FH_HELPER_CPU`): its
/// counters and `fh_info` lines; off, `fh_info` says why.
#[test]
fn helper_through_the_c_api() {
    let cpu = crate::helper::placement::allowed_cpus()[0];
    let cfg = fh_config {
        helper: FH_HELPER_ON,
        helper_cpu: cpu as u32,
        helper_min_bytes: 4096,
        max_regions: 64,
        ..config()
    };
    let c = new_cache(&cfg).unwrap();
    let len = 64 << 10;
    // SAFETY: a fresh anonymous mapping, unmapped at the end.
    let addr = unsafe {
        libc::mmap(
            null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(addr, libc::MAP_FAILED);
    for _ in 0..5 {
        let mut mr = std::mem::MaybeUninit::<fh_mr>::uninit();
        // SAFETY: live cache, valid output, mapped memory.
        unsafe {
            assert_eq!(
                fh_register(c, addr, len, FH_ACCESS_LOCAL_WRITE, mr.as_mut_ptr()),
                FH_OK
            );
            assert_eq!(fh_deregister(c, mr.assume_init().handle), FH_OK);
        }
    }
    // The helper publishes on every loop (at least every 0.5 ms).
    let mut hs = fh_helper_stats::default();
    for _ in 0..2000 {
        // SAFETY: live cache, valid output.
        assert_eq!(unsafe { fh_get_helper_stats(c, &mut hs) }, FH_OK);
        if hs.tracked_registrations == 5 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!((hs.state, hs.cpu), (1, cpu as i32));
    assert_eq!(hs.tracked_registrations, 5);
    // SAFETY: NULL output.
    assert_eq!(unsafe { fh_get_helper_stats(c, null_mut()) }, FH_ERR_NULL);
    // SAFETY: NULL cache.
    assert_eq!(unsafe { fh_get_helper_stats(null(), &mut hs) }, FH_ERR_NULL);
    let info = info_text(c);
    assert!(
        info.contains(&format!("helper:        on (core {cpu})")),
        "{info}"
    );
    assert!(info.contains("predictions:"), "{info}");
    // SAFETY: live cache, freed once; the mapping is ours.
    unsafe {
        fh_cache_free(c);
        libc::munmap(addr, len);
    }
    let off = new_cache(&config()).unwrap();
    let info = info_text(off);
    assert!(info.contains("helper:        off: not asked for"), "{info}");
    let mut hs = fh_helper_stats {
        state: 9,
        ..Default::default()
    };
    // SAFETY: live cache, valid output.
    assert_eq!(unsafe { fh_get_helper_stats(off, &mut hs) }, FH_OK);
    assert_eq!(hs, fh_helper_stats::default());
    // SAFETY: live cache, freed once.
    unsafe { fh_cache_free(off) };
}

fn info_text(c: *const fh_cache) -> String {
    let mut buf = vec![0u8; 8192];
    // SAFETY: live cache, `buf` valid for its length.
    assert_eq!(
        unsafe { fh_info(c, buf.as_mut_ptr().cast(), buf.len(), null_mut()) },
        FH_OK
    );
    let n = buf.iter().position(|&b| b == 0).unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn register_hit_release_notify() {
    let c = new_cache(&config()).unwrap();
    // A private mapping, so the process-wide notification below cannot touch a page that another
    // test's heap data shares.
    // SAFETY: a fresh anonymous mapping, unmapped at the end of the test.
    let addr = unsafe {
        libc::mmap(
            null_mut(),
            3 * 4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    } as *const c_void;
    assert_ne!(addr, libc::MAP_FAILED as *const c_void);
    let mut a = std::mem::MaybeUninit::<fh_mr>::uninit();
    // SAFETY: live cache, valid output; the mapping outlives the registrations.
    unsafe {
        assert_eq!(
            fh_register(c, addr, 4096, FH_ACCESS_LOCAL_WRITE, a.as_mut_ptr()),
            FH_OK
        );
        let a = a.assume_init();
        assert_eq!((a.addr as *const c_void, a.length), (addr, 4096));
        let mut b = a;
        assert_eq!(fh_register(c, addr, 4096, 0, &mut b), FH_OK);
        assert_eq!((b.lkey, b.rkey), (a.lkey, a.rkey));
        assert_ne!(b.handle, a.handle);
        let mut s = fh_stats::default();
        assert_eq!(fh_get_stats(c, &mut s), FH_OK);
        assert_eq!((s.hits, s.misses, s.in_use), (1, 1, 1));
        assert_eq!(fh_deregister(c, a.handle), FH_OK);
        assert_eq!(fh_deregister(c, a.handle), FH_ERR_UNKNOWN_HANDLE);
        assert_eq!(fh_cache_finalize(c), FH_ERR_BUSY);
        assert_eq!(fh_deregister(c, b.handle), FH_OK);

        // Invalidated: the same range is a miss again.
        assert_eq!(fh_notify_unmapped(addr, 1), FH_OK);
        assert_eq!(fh_register(c, addr, 4096, 0, &mut b), FH_OK);
        assert_eq!(fh_get_stats(c, &mut s), FH_OK);
        assert_eq!((s.hits, s.misses, s.invalidations), (1, 2, 1));
        assert_eq!(fh_deregister(c, b.handle), FH_OK);
        assert_eq!(fh_cache_finalize(c), FH_OK);
        libc::munmap(addr as *mut c_void, 3 * 4096);
    }
}

#[test]
fn info_truncates_like_snprintf() {
    let c = new_cache(&config()).unwrap();
    let mut full = 0usize;
    let mut one = [0x7fu8 as std::ffi::c_char; 1];
    let mut n = 0usize;
    // SAFETY: live cache; buffers valid for the lengths passed.
    unsafe {
        assert_eq!(fh_info(c, null_mut(), 0, &mut full), FH_OK);
        assert!(full > 0);
        assert_eq!(fh_info(c, one.as_mut_ptr(), 1, &mut n), FH_OK);
        assert_eq!((one[0], n), (0, full));
        let mut buf = vec![0 as std::ffi::c_char; full + 1];
        assert_eq!(fh_info(c, buf.as_mut_ptr(), buf.len(), null_mut()), FH_OK);
        let text = std::ffi::CStr::from_ptr(buf.as_ptr()).to_str().unwrap();
        assert_eq!(text.len(), full);
        assert!(
            text.contains("mlock") && text.contains("max_regions 8"),
            "{text}"
        );
        fh_cache_free(c);
    }
}

#[test]
fn null_everywhere() {
    // SAFETY: every pointer is NULL, which each function documents as accepted.
    unsafe {
        assert_eq!(fh_cache_new(null(), null_mut()), FH_ERR_NULL);
        assert_eq!(
            fh_register(null_mut(), null(), 1, 0, null_mut()),
            FH_ERR_NULL
        );
        assert_eq!(fh_deregister(null_mut(), 1), FH_ERR_NULL);
        assert_eq!(fh_get_stats(null(), null_mut()), FH_ERR_NULL);
        assert_eq!(fh_flush(null_mut(), null_mut()), FH_ERR_NULL);
        assert_eq!(fh_set_limits(null_mut(), 1, 1), FH_ERR_NULL);
        assert_eq!(fh_get_limits(null(), null_mut(), null_mut()), FH_ERR_NULL);
        assert_eq!(fh_info(null(), null_mut(), 0, null_mut()), FH_ERR_NULL);
        assert_eq!(fh_print_info(null(), 1), FH_ERR_NULL);
        assert_eq!(fh_notify_unmapped(null(), 1), FH_ERR_NULL);
        assert_eq!(fh_config_init(null_mut()), FH_ERR_NULL);
        assert_eq!(fh_cache_finalize(null_mut()), FH_OK);
        fh_cache_free(null_mut());
    }
}

/// `fh_register` hands its caller's return address to the helper: the same call site gives the
/// same value every time, two call sites give two values (0 only without naked functions). The
/// two call sites are functions of their own, so that an optimised build cannot unroll the loop
/// into more call sites than the source has.
#[test]
#[cfg(fh_naked)]
fn register_reports_its_call_site() {
    #[inline(never)]
    fn site_a(c: *mut fh_cache, mr: *mut fh_mr) -> (fh_status, usize) {
        // SAFETY: live cache; the NULL address is refused before anything is read.
        let rc = unsafe { fh_register(c, null(), 4096, 0, mr) };
        (rc, super::ops::LAST_SITE.with(|s| s.get()))
    }
    #[inline(never)]
    fn site_b(c: *mut fh_cache, mr: *mut fh_mr) -> (fh_status, usize) {
        // SAFETY: as in site_a.
        let rc = unsafe { fh_register(c, null(), 8192, 0, mr) };
        (rc, super::ops::LAST_SITE.with(|s| s.get()))
    }
    let c = new_cache(&config()).unwrap();
    let mut mr = std::mem::MaybeUninit::<fh_mr>::uninit();
    let mut sites = Vec::new();
    for i in 0..4 {
        // Bad input (NULL address) still goes through the trampoline and changes nothing.
        let f = if i % 2 == 0 { site_a } else { site_b };
        let (rc, site) = std::hint::black_box(f)(c, mr.as_mut_ptr());
        assert_eq!(rc, FH_ERR_NULL);
        sites.push(site);
    }
    let inside = |site: usize, f: usize| site > f && site < f + 4096;
    assert!(
        inside(sites[0], site_a as *const () as usize),
        "{sites:x?} vs {:x}",
        site_a as *const () as usize
    );
    assert!(
        inside(sites[1], site_b as *const () as usize),
        "{sites:x?} vs {:x}",
        site_b as *const () as usize
    );
    assert_eq!(sites[0], sites[2]);
    assert_eq!(sites[1], sites[3]);
    assert_ne!(sites[0], sites[1]);
    // SAFETY: live cache, freed once.
    unsafe { fh_cache_free(c) };
}
