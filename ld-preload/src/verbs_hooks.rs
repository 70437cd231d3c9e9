//! The exported libibverbs entry points: depth guard -> dispatch (cache or pass through) -> real.
//!
//! Every export catches panics: a panic becomes a pass-through (or an error return), never an
//! unwind into C. Pass-through cases: nested calls, `FH_DISABLE`, NULL pd, zero length,
//! `iova != addr`, and access flags beyond local/remote read/write/atomic (ODP, MW bind, relaxed
//! ordering, zero-based, hugetlb...), which the cache cannot serve. `ibv_reg_dmabuf_mr` is not
//! exported at all.

use std::ffi::{c_int, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use firehose::internals::cache::CacheError;
use firehose::internals::pin::Access;

use crate::counters::{bump, COUNTERS};
use crate::ffi_types::*;
use crate::guard::Outermost;
use crate::wrapper::{self, Backing, Taken, WrapperMr};
use crate::{bypass, cost_model, pd_cache, real_verbs, settings};

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// True for access flags the cache can serve exactly as libibverbs would.
pub(crate) fn cacheable(access: u32) -> bool {
    const LOCAL_WRITE: u32 = Access::LOCAL_WRITE.0;
    const NEEDS_LOCAL_WRITE: u32 = Access::REMOTE_WRITE.0 | Access::REMOTE_ATOMIC.0;
    // Remote write/atomic without local write is EINVAL in libibverbs: let it say so.
    Access(access).is_valid() && (access & NEEDS_LOCAL_WRITE == 0 || access & LOCAL_WRITE != 0)
}

/// Serve a registration from the cache of `pd`; `None` means "pass it through".
///
/// # Safety
/// `pd` is a live protection domain of the caller.
unsafe fn cached_reg(
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    access: u32,
    repeat: bool,
) -> *mut IbvMr {
    let Ok(cache) = pd_cache::for_pd(pd, Access(access)) else {
        return std::ptr::null_mut();
    };
    let (reg, hit) = match cache.register(addr as usize, len, Access(access)) {
        Ok(r) => r,
        // Out of pinnable memory after this cache evicted its own idle regions: other domains'
        // and rights classes' caches may hold the rest of the process's limit idle.
        Err(CacheError::NoMemory) if pd_cache::flush_all_idle() > 1 => {
            match cache.register(addr as usize, len, Access(access)) {
                Ok(r) => r,
                Err(_) => return std::ptr::null_mut(),
            }
        }
        Err(_) => return std::ptr::null_mut(),
    };
    bypass::cached(repeat, hit);
    if hit {
        COUNTERS
            .hit_bytes
            .fetch_add(len as u64, std::sync::atomic::Ordering::Relaxed);
        // What this hit avoided, measured now and then (`cost_model.rs`); the caller gets the
        // cached registration either way.
        if cost_model::should_sample() {
            cache.sample_resident(addr as usize, len, Access(access));
        }
    }
    // SAFETY: forwarded per the contract.
    unsafe { wrap(pd, addr, len, access, cache, reg) }
}

/// The application's view of a hit of a bypassed registration's look-up (`bypass::Route::Peek`),
/// or null: the cache of `pd` does not hold the range, and nothing was pinned.
///
/// # Safety
/// `pd` is a live protection domain of the caller.
unsafe fn peek_reg(pd: *mut IbvPd, addr: *mut c_void, len: usize, access: u32) -> *mut IbvMr {
    let Some(cache) = pd_cache::existing(pd, Access(access)) else {
        return std::ptr::null_mut();
    };
    let Some(reg) = cache.register_if_cached(addr as usize, len, Access(access)) else {
        return std::ptr::null_mut();
    };
    COUNTERS
        .hit_bytes
        .fetch_add(len as u64, std::sync::atomic::Ordering::Relaxed);
    // SAFETY: forwarded per the contract.
    unsafe { wrap(pd, addr, len, access, cache, reg) }
}

/// Hand out a cached registration as an MR of the application's (a wrapper); null if no wrapper
/// slot could be had (the reference is given back).
///
/// # Safety
/// `pd` is a live protection domain of the caller; `reg` is a registration of `cache`.
unsafe fn wrap(
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    access: u32,
    cache: std::sync::Arc<pd_cache::PdCache>,
    reg: firehose::internals::cache::Registration,
) -> *mut IbvMr {
    let mr = IbvMr {
        // SAFETY: `pd` is live per the contract; `context` is its public first field.
        context: unsafe { (*pd).context },
        pd,
        addr,
        length: len,
        handle: cache.mr_handle(reg.lkey),
        lkey: reg.lkey,
        rkey: reg.rkey,
    };
    let w = WrapperMr {
        mr,
        backing: Backing::Cached {
            cache,
            handle: reg.handle,
        },
        access,
    };
    match wrapper::publish_new(w) {
        Ok(p) => p,
        Err(w) => {
            // No slot for a wrapper (out of memory): give the reference back, pass through.
            if let Backing::Cached { cache, handle } = w.backing {
                let _ = cache.deregister(handle);
            }
            std::ptr::null_mut()
        }
    }
}

/// The common body of the three registration hooks. `pass` performs the real call.
///
/// # Safety
/// Arguments as for `ibv_reg_mr_iova2`.
unsafe fn register(
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
    pass: impl Fn() -> *mut IbvMr,
) -> *mut IbvMr {
    let Some(_outer) = Outermost::enter() else {
        bump(&COUNTERS.nested_calls);
        return pass();
    };
    bump(&COUNTERS.app_reg_calls);
    let try_cache = !settings::disabled()
        && !pd.is_null()
        && !addr.is_null()
        && len != 0
        && iova == addr as u64
        && cacheable(access);
    // Registrations that almost never come back go straight through (`bypass.rs`).
    let route = if try_cache {
        bypass::route(
            pd as usize,
            addr as usize,
            len,
            access & pd_cache::REMOTE_RIGHTS,
        )
    } else {
        bypass::Route::Direct
    };
    match route {
        bypass::Route::Cache { repeat } => {
            // SAFETY: `pd` is the caller's live protection domain (non-NULL, checked above).
            let r = catch_unwind(AssertUnwindSafe(|| unsafe {
                cached_reg(pd, addr, len, access, repeat)
            }));
            if let Ok(mr) = r {
                if !mr.is_null() {
                    return mr;
                }
            }
        }
        bypass::Route::Peek => {
            // SAFETY: as above.
            let r = catch_unwind(AssertUnwindSafe(|| unsafe {
                peek_reg(pd, addr, len, access)
            }));
            let mr = r.unwrap_or(std::ptr::null_mut());
            bypass::peeked(!mr.is_null());
            if !mr.is_null() {
                return mr;
            }
        }
        bypass::Route::Direct => {}
    }
    // Uncacheable, or the cache failed: the real call gives the application the real errno.
    bump(&COUNTERS.passthrough_reg);
    let mr = pass();
    // SAFETY: this thread's errno slot.
    if mr.is_null() && unsafe { *libc::__errno_location() } == libc::ENOMEM && try_cache {
        // Idle cached registrations count against the same limit: give them back, try again.
        if pd_cache::flush_all_idle() > 0 {
            return pass();
        }
    }
    mr
}

/// `register` for the host tests (a fake `pass`).
///
/// # Safety
/// As `register`.
#[cfg(test)]
pub(crate) unsafe fn register_for_test(
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
    pass: impl Fn() -> *mut IbvMr,
) -> *mut IbvMr {
    // SAFETY: forwarded per the contract.
    unsafe { register(pd, addr, len, iova, access, pass) }
}

fn missing_ptr() -> *mut IbvMr {
    set_errno(libc::ENOSYS);
    std::ptr::null_mut()
}

/// # Safety
/// Same contract as libibverbs `ibv_reg_mr`.
#[no_mangle]
pub(crate) unsafe extern "C" fn ibv_reg_mr(
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut IbvMr {
    // SAFETY: forwarded unchanged to the real function of the same signature.
    unsafe {
        register(
            pd,
            addr,
            length,
            addr as u64,
            access as u32,
            || match real_verbs::get().reg_mr {
                Some(f) => f(pd, addr, length, access),
                None => missing_ptr(),
            },
        )
    }
}

/// # Safety
/// Same contract as libibverbs `ibv_reg_mr_iova`.
#[no_mangle]
pub(crate) unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut IbvMr {
    // SAFETY: forwarded unchanged to the real function of the same signature.
    unsafe {
        register(
            pd,
            addr,
            length,
            iova,
            access as u32,
            || match real_verbs::get().reg_mr_iova {
                Some(f) => f(pd, addr, length, iova, access),
                None => missing_ptr(),
            },
        )
    }
}

/// # Safety
/// Same contract as libibverbs `ibv_reg_mr_iova2`.
#[no_mangle]
pub(crate) unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut IbvMr {
    // SAFETY: forwarded unchanged to the real function of the same signature.
    unsafe {
        register(pd, addr, length, iova, access, || {
            match real_verbs::get().reg_mr_iova2 {
                Some(f) => f(pd, addr, length, iova, access),
                None => missing_ptr(),
            }
        })
    }
}

/// Real `ibv_dereg_mr`, or ENOSYS.
///
/// # Safety
/// `mr` is an MR libibverbs created.
unsafe fn real_dereg(mr: *mut IbvMr) -> c_int {
    match real_verbs::get().dereg_mr {
        // SAFETY: per the contract, `mr` is a real MR.
        Some(f) => unsafe { f(mr) },
        None => libc::ENOSYS,
    }
}

/// Release what stands behind a wrapper. On failure the backing is handed back.
///
/// A cached wrapper inherited across `fork` is released without touching its registration: its
/// cache is the parent's, quarantined in the child (`CacheError::Forked`), and the registration behind
/// it lives in the verbs context the child shares with the parent, where the parent still uses
/// it (never the real `ibv_dereg_mr` here). The child only lets go of its copy of the wrapper.
///
/// # Safety
/// A `Real` backing is a live MR that only this wrapper refers to.
unsafe fn release(backing: Backing) -> Result<(), (Backing, c_int)> {
    match backing {
        Backing::Cached { cache, handle } => match cache.deregister(handle) {
            Ok(()) | Err(CacheError::Forked) => Ok(()),
            Err(_) => Err((Backing::Cached { cache, handle }, libc::EINVAL)),
        },
        Backing::Real(mr) => {
            // SAFETY: per the contract.
            let rc = unsafe { real_dereg(mr) };
            if rc == 0 {
                Ok(())
            } else {
                Err((Backing::Real(mr), rc))
            }
        }
    }
}

/// # Safety
/// Same contract as libibverbs `ibv_dereg_mr`.
#[no_mangle]
pub(crate) unsafe extern "C" fn ibv_dereg_mr(mr: *mut IbvMr) -> c_int {
    let Some(_outer) = Outermost::enter() else {
        // SAFETY: a nested call comes from libibverbs or our backend: a real MR.
        return unsafe { real_dereg(mr) };
    };
    let mut w = match wrapper::take(mr) {
        Taken::Wrapper(w) => w,
        Taken::Stale => {
            bump(&COUNTERS.stale_dereg);
            return libc::EINVAL;
        }
        Taken::NotOurs => {
            bump(&COUNTERS.passthrough_dereg);
            // SAFETY: not a wrapper, so it is whatever libibverbs gave the application.
            return unsafe { real_dereg(mr) };
        }
    };
    let backing = std::mem::replace(&mut w.backing, Backing::Real(std::ptr::null_mut()));
    // SAFETY: the wrapper was in the registry, so its backing is live and only it refers to it.
    let r = catch_unwind(AssertUnwindSafe(|| unsafe { release(backing) }));
    match r {
        Ok(Ok(())) => 0, // dropping `w` frees the wrapper
        Ok(Err((backing, rc))) => {
            // Still registered (e.g. a memory window is bound): the MR stays valid, as in verbs.
            w.backing = backing;
            w.publish();
            rc
        }
        Err(_) => libc::EINVAL, // the backing is lost with the panic; the wrapper is freed
    }
}

/// Build a backing for a (re)registration: the cache when possible, else a real MR we own.
///
/// # Safety
/// `pd` is a live protection domain.
unsafe fn new_backing(
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    access: u32,
) -> Option<(Backing, u32, u32, u32)> {
    if cacheable(access) && !settings::disabled() {
        if let Ok(cache) = pd_cache::for_pd(pd, Access(access)) {
            if let Ok((reg, _)) = cache.register(addr as usize, len, Access(access)) {
                let handle = cache.mr_handle(reg.lkey);
                let b = Backing::Cached {
                    cache,
                    handle: reg.handle,
                };
                return Some((b, reg.lkey, reg.rkey, handle));
            }
        }
    }
    let f = real_verbs::get().reg_mr_iova2?;
    // SAFETY: `pd` is live per the contract; this is a plain registration of the caller's range.
    let m = unsafe { f(pd, addr, len, addr as u64, access) };
    if m.is_null() {
        return None;
    }
    // SAFETY: libibverbs returned a valid MR.
    let r = unsafe { *m };
    Some((Backing::Real(m), r.lkey, r.rkey, r.handle))
}

/// `ibv_rereg_mr` on a wrapper: register the new range first, then release the old one, and
/// update the same wrapper in place. If the new registration fails the old one is untouched and
/// the call returns `IBV_REREG_MR_ERR_INPUT` ("old MR is valid") with errno set.
///
/// # Safety
/// `w` was taken from the registry; `pd` is NULL or live.
unsafe fn rereg_wrapper(
    w: &mut WrapperMr,
    flags: c_int,
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> c_int {
    if flags & !IBV_REREG_MR_FLAGS_SUPPORTED != 0 {
        set_errno(libc::EINVAL);
        return IBV_REREG_MR_ERR_INPUT;
    }
    let translation = flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0;
    // As rdma-core: access rights without CHANGE_ACCESS are an input error, not ignored.
    if (translation && (addr.is_null() || len == 0))
        || (flags & IBV_REREG_MR_CHANGE_PD != 0 && pd.is_null())
        || (access != 0 && flags & IBV_REREG_MR_CHANGE_ACCESS == 0)
    {
        set_errno(libc::EINVAL);
        return IBV_REREG_MR_ERR_INPUT;
    }
    if flags == 0 {
        return 0; // nothing to change
    }
    let new_pd = if flags & IBV_REREG_MR_CHANGE_PD != 0 {
        pd
    } else {
        w.mr.pd
    };
    let (new_addr, new_len) = if translation {
        (addr, len)
    } else {
        (w.mr.addr, w.mr.length)
    };
    let new_access = if flags & IBV_REREG_MR_CHANGE_ACCESS != 0 {
        access as u32
    } else {
        w.access
    };
    // SAFETY: `new_pd` is the wrapper's own live pd or the caller's non-NULL one.
    let Some((backing, lkey, rkey, handle)) =
        (unsafe { new_backing(new_pd, new_addr, new_len, new_access) })
    else {
        return IBV_REREG_MR_ERR_INPUT; // errno from the failed registration
    };
    let old = std::mem::replace(&mut w.backing, backing);
    // SAFETY: `old` was this wrapper's live backing. If releasing it fails the registration
    // leaks until exit, but the wrapper is consistent and usable.
    let _ = unsafe { release(old) };
    w.mr = IbvMr {
        // SAFETY: `new_pd` is live.
        context: unsafe { (*new_pd).context },
        pd: new_pd,
        addr: new_addr,
        length: new_len,
        handle,
        lkey,
        rkey,
    };
    w.access = new_access;
    0
}

/// # Safety
/// Same contract as libibverbs `ibv_rereg_mr`.
#[no_mangle]
pub(crate) unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut IbvMr,
    flags: c_int,
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    let real = || match real_verbs::get().rereg_mr {
        // SAFETY: forwarded unchanged; `mr` is not a wrapper on this path.
        Some(f) => unsafe { f(mr, flags, pd, addr, length, access) },
        None => {
            set_errno(libc::ENOSYS);
            IBV_REREG_MR_ERR_INPUT
        }
    };
    let Some(_outer) = Outermost::enter() else {
        return real();
    };
    let mut w = match wrapper::take(mr) {
        Taken::Wrapper(w) => w,
        Taken::Stale => {
            bump(&COUNTERS.stale_dereg);
            set_errno(libc::EINVAL);
            return IBV_REREG_MR_ERR_INPUT;
        }
        Taken::NotOurs => {
            bump(&COUNTERS.passthrough_dereg);
            return real();
        }
    };
    // SAFETY: `w` came out of the registry; `pd` is the caller's.
    let r = catch_unwind(AssertUnwindSafe(|| unsafe {
        rereg_wrapper(&mut w, flags, pd, addr, length, access)
    }));
    w.publish();
    r.unwrap_or(IBV_REREG_MR_ERR_CMD)
}

/// The real call, then, once it succeeded, the monitor is installed and userfaultfd's reader
/// started (`pd_cache::warm_up`): a program that allocates a protection domain is about to
/// register memory, and its first registration should not pay for those one-time starts.
///
/// # Safety
/// Same contract as libibverbs `ibv_alloc_pd`.
#[no_mangle]
pub(crate) unsafe extern "C" fn ibv_alloc_pd(ctx: *mut c_void) -> *mut IbvPd {
    let pd = match real_verbs::get().alloc_pd {
        // SAFETY: forwarded unchanged.
        Some(f) => unsafe { f(ctx) },
        None => missing_ptr().cast(),
    };
    if !pd.is_null() {
        if let Some(_outer) = Outermost::enter() {
            let _ = catch_unwind(pd_cache::warm_up);
        }
    }
    pd
}

/// Drop the domain's cache (releasing the registrations only the cache still holds) before the
/// real call, or it would fail with EBUSY.
///
/// # Safety
/// Same contract as libibverbs `ibv_dealloc_pd`.
#[no_mangle]
pub(crate) unsafe extern "C" fn ibv_dealloc_pd(pd: *mut IbvPd) -> c_int {
    let outer = Outermost::enter();
    if outer.is_some() && !pd.is_null() {
        let _ = catch_unwind(|| pd_cache::drop_pd(pd));
    }
    match real_verbs::get().dealloc_pd {
        // SAFETY: forwarded unchanged.
        Some(f) => unsafe { f(pd) },
        None => libc::ENOSYS,
    }
}

/// Drop the caches of the context's domains (releasing the registrations only they still hold)
/// before the real call: after it, those MRs could only be deregistered through a freed context.
///
/// # Safety
/// Same contract as libibverbs `ibv_close_device`.
#[no_mangle]
pub(crate) unsafe extern "C" fn ibv_close_device(ctx: *mut c_void) -> c_int {
    let outer = Outermost::enter();
    if outer.is_some() && !ctx.is_null() {
        let _ = catch_unwind(|| pd_cache::drop_context(ctx));
    }
    match real_verbs::get().close_device {
        // SAFETY: forwarded unchanged.
        Some(f) => unsafe { f(ctx) },
        None => libc::ENOSYS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cacheable_flags_are_exactly_the_plain_access_rights() {
        assert!(cacheable(0));
        assert!(cacheable(1 | 2 | 4 | 8));
        assert!(cacheable(4), "remote read alone");
        assert!(
            !cacheable(2),
            "remote write without local write: libibverbs says EINVAL"
        );
        assert!(!cacheable(8), "remote atomic without local write");
        assert!(!cacheable(1 | 0x10), "MW_BIND");
        assert!(!cacheable(1 | 0x20), "ZERO_BASED");
        assert!(!cacheable(1 | 0x40), "ON_DEMAND");
        assert!(!cacheable(1 | 0x80), "HUGETLB");
        assert!(!cacheable(1 | 0x100000), "RELAXED_ORDERING");
    }
}
