//! The real libibverbs functions, resolved once, lazily, by symbol version.
//!
//! `dlsym(RTLD_NEXT, ..)` is not enough: UCX loads libibverbs with `dlopen(RTLD_LOCAL)`, so under
//! mpirun the library is loaded but invisible to a global lookup (NULL -> SIGSEGV at address 0).
//! `dlopen("libibverbs.so.1", RTLD_NOLOAD)` finds it whichever way it was loaded; if it is not loaded
//! at all (a caller reached us through some other path) we load it ourselves, locally. Our exports
//! are unversioned and interpose every version, so each target is named with `dlvsym` and its
//! version; a target that turns out to live in this shim is rejected (no self-recursion).

use std::ffi::{c_void, CStr};

use crate::ffi_types::{
    AllocPdFn, CloseDeviceFn, DeallocPdFn, DeregMrFn, RegMrFn, RegMrIova2Fn, RegMrIovaFn, ReregMrFn,
};

/// Every target we may call. `None` when libibverbs lacks it (an older library).
#[derive(Clone, Copy)]
pub(crate) struct RealVerbs {
    pub reg_mr: Option<RegMrFn>,
    pub reg_mr_iova: Option<RegMrIovaFn>,
    pub reg_mr_iova2: Option<RegMrIova2Fn>,
    pub dereg_mr: Option<DeregMrFn>,
    pub rereg_mr: Option<ReregMrFn>,
    pub alloc_pd: Option<AllocPdFn>,
    pub dealloc_pd: Option<DeallocPdFn>,
    pub close_device: Option<CloseDeviceFn>,
}

/// Not a `OnceLock`: a child forked while another thread resolved it would wait for that thread
/// forever in its first verbs call (see the library's `race_once.rs`).
static REAL: firehose::internals::RaceOnce<RealVerbs> = firehose::internals::RaceOnce::new();

/// The real functions (resolved on first use; later calls are one atomic load).
pub(crate) fn get() -> &'static RealVerbs {
    REAL.get_or_init(resolve)
}

fn libibverbs_handle() -> *mut c_void {
    let name = c"libibverbs.so.1";
    // SAFETY: `name` is NUL-terminated; RTLD_NOLOAD only returns an already loaded object and
    // runs no constructors.
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
    if !h.is_null() {
        return h;
    }
    // SAFETY: as above; a plain local load (the application did not load it, or loaded another
    // soname): loading it cannot change the application's own symbol resolution (RTLD_LOCAL).
    unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) }
}

/// Base address of the object that contains `p` (0 if unknown).
fn object_base(p: *const c_void) -> usize {
    // SAFETY: dladdr only reads loader tables; `info` is a valid out-pointer.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(p, &mut info) == 0 {
            return 0;
        }
        info.dli_fbase as usize
    }
}

/// Look `name@version` up in libibverbs, then unversioned; never a symbol of this shim.
fn lookup(handle: *mut c_void, name: &CStr, version: &CStr) -> *mut c_void {
    if handle.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `handle` came from dlopen; both strings are NUL-terminated.
    let mut p = unsafe { libc::dlvsym(handle, name.as_ptr(), version.as_ptr()) };
    if p.is_null() {
        // SAFETY: as above.
        p = unsafe { libc::dlsym(handle, name.as_ptr()) };
    }
    let ours = object_base(get as *const c_void);
    if !p.is_null() && ours != 0 && object_base(p) == ours {
        return std::ptr::null_mut();
    }
    p
}

macro_rules! resolve_fn {
    ($h:expr, $name:literal, $ver:literal, $ty:ty) => {{
        let p = lookup($h, $name, $ver);
        if p.is_null() {
            None
        } else {
            // SAFETY: libibverbs exports `$name@$ver` with exactly the C signature `$ty` mirrors
            // (verbs.h); the pointer is a function of that library, which is never unloaded
            // while we hold its handle.
            Some(unsafe { std::mem::transmute::<*mut c_void, $ty>(p) })
        }
    }};
}

fn resolve() -> RealVerbs {
    let h = libibverbs_handle();
    RealVerbs {
        reg_mr: resolve_fn!(h, c"ibv_reg_mr", c"IBVERBS_1.1", RegMrFn),
        reg_mr_iova: resolve_fn!(h, c"ibv_reg_mr_iova", c"IBVERBS_1.7", RegMrIovaFn),
        reg_mr_iova2: resolve_fn!(h, c"ibv_reg_mr_iova2", c"IBVERBS_1.8", RegMrIova2Fn),
        dereg_mr: resolve_fn!(h, c"ibv_dereg_mr", c"IBVERBS_1.1", DeregMrFn),
        rereg_mr: resolve_fn!(h, c"ibv_rereg_mr", c"IBVERBS_1.1", ReregMrFn),
        alloc_pd: resolve_fn!(h, c"ibv_alloc_pd", c"IBVERBS_1.1", AllocPdFn),
        dealloc_pd: resolve_fn!(h, c"ibv_dealloc_pd", c"IBVERBS_1.1", DeallocPdFn),
        close_device: resolve_fn!(h, c"ibv_close_device", c"IBVERBS_1.1", CloseDeviceFn),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_every_target_from_the_installed_libibverbs() {
        let r = get();
        assert!(r.reg_mr.is_some());
        assert!(r.reg_mr_iova.is_some());
        assert!(r.reg_mr_iova2.is_some());
        assert!(r.dereg_mr.is_some());
        assert!(r.rereg_mr.is_some());
        assert!(r.alloc_pd.is_some());
        assert!(r.dealloc_pd.is_some());
        assert!(r.close_device.is_some());
        // The targets live in libibverbs, not in this test binary.
        let ours = object_base(get as *const c_void);
        assert_ne!(object_base(r.reg_mr.unwrap() as *const c_void), ours);
    }

    #[test]
    fn unknown_names_and_missing_library_give_none() {
        let h = libibverbs_handle();
        assert!(
            !h.is_null(),
            "libibverbs.so.1 is installed on every build machine"
        );
        assert!(lookup(h, c"ibv_no_such_function", c"IBVERBS_1.1").is_null());
        assert!(lookup(std::ptr::null_mut(), c"ibv_reg_mr", c"IBVERBS_1.1").is_null());
    }
}
