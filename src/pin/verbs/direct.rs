//! `ibv_reg_mr` / `ibv_dereg_mr` taken from libibverbs itself, not from whatever a global symbol
//! lookup finds first.
//!
//! Why: this library is a registration cache. When an application that links it also preloads a
//! registration interposer (our own `libfirehose_preload.so`, which caches every `ibv_reg_mr` of
//! the process), the library's own registrations (Firehose's remote pins, the active-message
//! buffers, the pin-down cache's misses) would be cached a second time there: a deregistration
//! we make to honour `FH_M + FH_MAXVICTIM` or a cache limit would leave the pages pinned. The
//! lookup goes through libibverbs' own handle (`dlopen(RTLD_NOLOAD)`: its scope is libibverbs and
//! its dependencies, never a preloaded object). If that fails (not expected: the library links
//! libibverbs), the linked symbols are used as before.
//!
//! Registration calls `ibv_reg_mr_iova2` (iova = the address, what `ibv_reg_mr` means), not
//! `ibv_reg_mr`: libibverbs' `ibv_reg_mr` calls its exported `ibv_reg_mr_iova2` through the PLT,
//! so an interposer of that one would still catch the call (and hand back its own object, which
//! libibverbs' `ibv_dereg_mr` then frees: `free(): invalid pointer`, seen in
//! tests/verbs-suite.d/55-preload-rma.sh). `ibv_reg_mr_iova2` and `ibv_dereg_mr` call no exported
//! verbs function.

use std::ffi::{c_int, c_void};

use rdma_sys::{ibv_mr, ibv_pd};

type RegMrIova2Fn =
    unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, u64, std::ffi::c_uint) -> *mut ibv_mr;
type DeregMrFn = unsafe extern "C" fn(*mut ibv_mr) -> c_int;

struct Direct {
    /// `ibv_reg_mr_iova2` from libibverbs' handle; `None`: the linked `ibv_reg_mr`.
    reg_mr_iova2: Option<RegMrIova2Fn>,
    dereg_mr: DeregMrFn,
    /// Whether both came from libibverbs' handle (not the linked fallback).
    #[cfg_attr(not(test), allow(dead_code))]
    from_handle: bool,
}

/// Not a `OnceLock`: a child forked while another thread resolved it would wait for that thread
/// forever (see `race_once.rs`).
static DIRECT: crate::rt::race_once::RaceOnce<Direct> = crate::rt::race_once::RaceOnce::new();

fn lookup(handle: *mut c_void, name: &std::ffi::CStr, version: &std::ffi::CStr) -> *mut c_void {
    if handle.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `handle` came from dlopen; the strings are NUL-terminated. The version that
    // introduced the function; unversioned as a fallback.
    let p = unsafe { libc::dlvsym(handle, name.as_ptr(), version.as_ptr()) };
    if !p.is_null() {
        return p;
    }
    // SAFETY: as above.
    unsafe { libc::dlsym(handle, name.as_ptr()) }
}

fn resolve() -> Direct {
    // SAFETY: NUL-terminated name; RTLD_NOLOAD only returns an object already loaded (this
    // library links libibverbs, so it is) and runs no constructors. The handle is never closed:
    // the library stays loaded as long as we do.
    let h = unsafe {
        libc::dlopen(
            c"libibverbs.so.1".as_ptr(),
            libc::RTLD_NOLOAD | libc::RTLD_LAZY,
        )
    };
    let r = lookup(h, c"ibv_reg_mr_iova2", c"IBVERBS_1.8");
    let d = lookup(h, c"ibv_dereg_mr", c"IBVERBS_1.1");
    if r.is_null() || d.is_null() {
        return Direct {
            reg_mr_iova2: None,
            dereg_mr: rdma_sys::ibv_dereg_mr,
            from_handle: false,
        };
    }
    // SAFETY: libibverbs exports both with exactly these C signatures (verbs.h), and it is never
    // unloaded while this library is loaded (it is our dependency).
    unsafe {
        Direct {
            reg_mr_iova2: Some(std::mem::transmute::<*mut c_void, RegMrIova2Fn>(r)),
            dereg_mr: std::mem::transmute::<*mut c_void, DeregMrFn>(d),
            from_handle: true,
        }
    }
}

fn get() -> &'static Direct {
    DIRECT.get_or_init(resolve)
}

/// `ibv_reg_mr` of libibverbs (as `ibv_reg_mr_iova2` with iova = addr).
///
/// # Safety
/// As `ibv_reg_mr`: `pd` is a live protection domain.
pub(crate) unsafe fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut ibv_mr {
    match get().reg_mr_iova2 {
        // SAFETY: the caller's contract is libibverbs' own; the access flags are the same bits.
        Some(f) => unsafe { f(pd, addr, len, addr as u64, access as std::ffi::c_uint) },
        // SAFETY: as above.
        None => unsafe { rdma_sys::ibv_reg_mr(pd, addr, len, access) },
    }
}

/// `ibv_dereg_mr` of libibverbs.
///
/// # Safety
/// As `ibv_dereg_mr`: `mr` came from [`reg_mr`] and is deregistered once.
pub(crate) unsafe fn dereg_mr(mr: *mut ibv_mr) -> c_int {
    // SAFETY: the caller's contract is libibverbs' own.
    unsafe { (get().dereg_mr)(mr) }
}

/// Whether registrations bypass interposers (both functions came from libibverbs' handle).
#[cfg(test)]
pub(crate) fn bypasses_interposers() -> bool {
    get().from_handle
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object_of(f: *const c_void) -> String {
        // SAFETY: Dl_info is plain data; all zeroes is valid.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: dladdr only reads loader tables; `info` is a valid out-pointer.
        assert_ne!(unsafe { libc::dladdr(f, &mut info) }, 0);
        // SAFETY: dli_fname is a NUL-terminated path owned by the loader.
        unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn both_functions_come_from_libibverbs() {
        assert!(bypasses_interposers());
        let reg = get().reg_mr_iova2.expect("ibv_reg_mr_iova2 found") as *const c_void;
        let dereg = get().dereg_mr as *const c_void;
        for (what, f) in [("ibv_reg_mr_iova2", reg), ("ibv_dereg_mr", dereg)] {
            let file = object_of(f);
            assert!(file.contains("libibverbs"), "{what} resolved into {file}");
        }
    }
}
