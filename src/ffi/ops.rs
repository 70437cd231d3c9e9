//! The hot calls: `fh_register`, `fh_deregister`, plus `fh_flush` and `fh_set_limits`.

use crate::cache::Limits;
use crate::ffi::status::fh_status;
use crate::pin::Access;

use super::cache_object::fh_cache;
use super::guard::{ffi_guard, status_of};
use super::handle::{borrow, write_out};
use super::types::fh_mr;

/// Registers `[addr, addr + len)` with `access` (`FH_ACCESS_*` bits), from the cache if possible.
///
/// Returns `FH_ERR_NULL` (`cache`, `addr` or `out` NULL), `FH_ERR_ZERO_LENGTH`, `FH_ERR_OVERFLOW`
/// (`addr + len` wraps), `FH_ERR_BAD_ACCESS` (unknown bits), `FH_ERR_TOO_LARGE` (`len` over
/// `max_pinned`), `FH_ERR_NO_MEMORY`, `FH_ERR_PIN_FAILED`. On any error nothing changes and
/// `*out` is not written. Each `FH_OK` must be matched by one `fh_deregister(out->handle)`.
///
/// With a helper thread (`fh_config.helper`), the caller's return address identifies the call
/// site for the helper's predictor.
///
/// # Safety
/// `cache` is NULL or live; `out` is NULL or valid for one `fh_mr` write. `addr` is not
/// dereferenced by this library, only pinned.
#[cfg_attr(fh_naked, unsafe(naked))]
#[no_mangle]
pub unsafe extern "C" fn fh_register(
    cache: *mut fh_cache,
    addr: *const std::ffi::c_void,
    len: usize,
    access: u32,
    out: *mut fh_mr,
) -> fh_status {
    // The five arguments stay where they are; the return address (the call site) becomes a
    // sixth, and `register_at` returns straight to our caller.
    return_address_tail_call!(register_at, cache, addr, len, access, out)
}

/// In a naked function: move the return address of a function entered by a plain call into the
/// sixth integer argument register and jump to `$imp` (same stack, so `$imp` returns to the
/// original caller). Without naked functions (Rust < 1.88): call `$imp` with site 0.
#[cfg(all(fh_naked, target_arch = "x86_64"))]
macro_rules! return_address_tail_call {
    ($imp:path, $($arg:ident),*) => {
        core::arch::naked_asm!("mov r9, qword ptr [rsp]", "jmp {imp}", imp = sym $imp)
    };
}
#[cfg(all(fh_naked, target_arch = "aarch64"))]
macro_rules! return_address_tail_call {
    ($imp:path, $($arg:ident),*) => {
        core::arch::naked_asm!("mov x5, x30", "b {imp}", imp = sym $imp)
    };
}
#[cfg(not(fh_naked))]
macro_rules! return_address_tail_call {
    ($imp:path, $($arg:ident),*) => {
        // SAFETY: the caller's contract is `$imp`'s.
        unsafe { $imp($($arg),*, 0) }
    };
}
use return_address_tail_call;

#[cfg(test)]
thread_local! {
    /// The last `site` `register_at` saw on this thread (tests of the trampoline).
    pub(crate) static LAST_SITE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// `fh_register` proper, with the caller's return address as `site`.
///
/// # Safety
/// As `fh_register`.
unsafe extern "C" fn register_at(
    cache: *mut fh_cache,
    addr: *const std::ffi::c_void,
    len: usize,
    access: u32,
    out: *mut fh_mr,
    site: usize,
) -> fh_status {
    #[cfg(test)]
    LAST_SITE.with(|s| s.set(site));
    ffi_guard! {{
        // SAFETY: NULL or live per the contract.
        let Some(c) = (unsafe { borrow(cache) }) else {
            return fh_status::FH_ERR_NULL;
        };
        if addr.is_null() || out.is_null() {
            return fh_status::FH_ERR_NULL;
        }
        // Events the userfaultfd reader has read but not yet dispatched must reach the cache
        // before it is searched (see `monitor::quiesce`); one load when idle.
        crate::monitor::quiesce();
        match c.helper.register(&c.cache, site, addr as usize, len, Access(access)) {
            Ok(reg) => {
                // SAFETY: non-NULL checked above, writable per the contract.
                unsafe { write_out(out, fh_mr::from(reg)) };
                fh_status::FH_OK
            }
            Err(e) => e.into(),
        }
    }}
}

/// Releases one registration. The region stays cached (pinned) until evicted or invalidated
/// (or, with a helper thread, until the helper unpins it: then this call never unpins anything
/// itself).
///
/// Returns `FH_ERR_NULL` (`cache` NULL) or `FH_ERR_UNKNOWN_HANDLE` (never issued, or already
/// released — double release is detected and changes nothing).
///
/// # Safety
/// `cache` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn fh_deregister(cache: *mut fh_cache, handle: u64) -> fh_status {
    ffi_guard! {{
        // SAFETY: NULL or live per the contract.
        match unsafe { borrow(cache) } {
            Some(c) => status_of(c.helper.deregister(&c.cache, handle)),
            None => fh_status::FH_ERR_NULL,
        }
    }}
}

/// Unpins every idle registration (and processes pending invalidations). `unpinned` may be NULL;
/// otherwise it receives how many regions were unpinned. Returns `FH_ERR_NULL` if `cache` is NULL.
///
/// # Safety
/// `cache` is NULL or live; `unpinned` is NULL or valid for one `size_t` write.
#[no_mangle]
pub unsafe extern "C" fn fh_flush(cache: *mut fh_cache, unpinned: *mut usize) -> fh_status {
    ffi_guard! {{
        // SAFETY: NULL or live per the contract.
        let Some(c) = (unsafe { borrow(cache) }) else {
            return fh_status::FH_ERR_NULL;
        };
        let n = c.cache.flush();
        if !unpinned.is_null() {
            // SAFETY: non-NULL, writable per the contract.
            unsafe { write_out(unpinned, n) };
        }
        fh_status::FH_OK
    }}
}

/// Changes the bounds of lazy release; shrinking evicts idle regions (LRU first) right away.
/// Returns `FH_ERR_NULL` (`cache` NULL) or `FH_ERR_BAD_CONFIG` (`max_pinned` 0; nothing changes).
///
/// # Safety
/// `cache` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn fh_set_limits(
    cache: *mut fh_cache,
    max_pinned: usize,
    max_regions: usize,
) -> fh_status {
    ffi_guard! {{
        // SAFETY: NULL or live per the contract.
        let Some(c) = (unsafe { borrow(cache) }) else {
            return fh_status::FH_ERR_NULL;
        };
        if max_pinned == 0 {
            return fh_status::FH_ERR_BAD_CONFIG;
        }
        c.cache.set_limits(Limits { max_pinned, max_regions });
        fh_status::FH_OK
    }}
}

/// Current bounds. Either output may be NULL. Returns `FH_ERR_NULL` if `cache` is NULL.
///
/// # Safety
/// `cache` is NULL or live; each output is NULL or valid for one `size_t` write.
#[no_mangle]
pub unsafe extern "C" fn fh_get_limits(
    cache: *const fh_cache,
    max_pinned: *mut usize,
    max_regions: *mut usize,
) -> fh_status {
    ffi_guard! {{
        // SAFETY: NULL or live per the contract.
        let Some(c) = (unsafe { borrow(cache) }) else {
            return fh_status::FH_ERR_NULL;
        };
        let l = c.cache.limits();
        if !max_pinned.is_null() {
            // SAFETY: non-NULL, writable per the contract.
            unsafe { write_out(max_pinned, l.max_pinned) };
        }
        if !max_regions.is_null() {
            // SAFETY: non-NULL, writable per the contract.
            unsafe { write_out(max_regions, l.max_regions) };
        }
        fh_status::FH_OK
    }}
}
