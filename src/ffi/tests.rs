//! Unit tests of the exports, called the way C calls them (raw pointers, status codes).
//! The C programs in `c-tests/` cover the same ground from C; these run under `cargo test`.

use std::ffi::c_void;
use std::ptr::{null, null_mut};

use super::*;
use crate::status::fh_status::{self, *};

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
    for size in [0, 4, good.struct_size - 1, good.struct_size + 8] {
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
