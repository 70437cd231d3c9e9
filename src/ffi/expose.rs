//! Exposure: `fh_expose`, `fh_unexpose`, `fh_library_ranges`. Thin: the policy is
//! `rma::expose`.

use std::ffi::c_void;

use crate::ffi::status::fh_status;
use firehose_proto::Rights;

use super::ctx::{fh_ctx, here};
use super::guard::{ffi_guard, status_of};
use super::types::{FH_ACCESS_REMOTE_READ, FH_ACCESS_REMOTE_WRITE};

/// The rights of `access` (`FH_ACCESS_REMOTE_READ` and/or `FH_ACCESS_REMOTE_WRITE`, nothing
/// else), or `None`.
fn rights_of(access: u32) -> Option<Rights> {
    let known = FH_ACCESS_REMOTE_READ | FH_ACCESS_REMOTE_WRITE;
    if access == 0 || access & !known != 0 {
        return None;
    }
    let mut r = Rights::NONE;
    if access & FH_ACCESS_REMOTE_READ != 0 {
        r = r.union(Rights::READ);
    }
    if access & FH_ACCESS_REMOTE_WRITE != 0 {
        r = r.union(Rights::WRITE);
    }
    Some(r)
}

/// Lets peers reach `[addr, addr + len)` of this process: `fh_get` from it with
/// `FH_ACCESS_REMOTE_READ`, `fh_put` to it with `FH_ACCESS_REMOTE_WRITE` (or both). Only
/// consulted with `FH_EXPOSE=declared`: then a peer's put or get that is not entirely inside
/// ranges exposed with its access fails at the peer with `FH_ERR_REMOTE_DENIED` and changes
/// nothing here. (With `FH_EXPOSE=all`, the default, every mapped address but the library's own
/// buffers is reachable, and this call is recorded without effect.) A byte's access is the union
/// of the exposures covering it. Peers pin whole pages (`FH_BUCKET_SIZE`): expose page-aligned
/// ranges, or the edge pages of a range can only take small puts. Exposures are not
/// reference-counted: each call adds one, `fh_unexpose` withdraws one.
/// Errors: `FH_ERR_NULL`, `FH_ERR_ZERO_LENGTH`, `FH_ERR_OVERFLOW`, `FH_ERR_BAD_ACCESS` (no or
/// unknown access bits), `FH_ERR_FORKED`.
///
/// # Safety
/// `ctx` is NULL or live. `addr` is not dereferenced.
#[no_mangle]
pub unsafe extern "C" fn fh_expose(
    ctx: *mut fh_ctx,
    addr: *const c_void,
    len: usize,
    access: u32,
) -> fh_status {
    ffi_guard! {{
        // SAFETY: per the contract.
        let c = match unsafe { here(ctx) } {
            Ok(c) => c,
            Err(e) => return e,
        };
        if addr.is_null() {
            return fh_status::FH_ERR_NULL;
        }
        let Some(r) = rights_of(access) else {
            return fh_status::FH_ERR_BAD_ACCESS;
        };
        status_of(c.rma.expose(addr as u64, len, r))
    }}
}

/// Withdraws one `fh_expose` of exactly `[addr, addr + len)`; then revokes what peers hold
/// pinned over the range and waits until they let go (bounded by `FH_AM_TIMEOUT_MS`: a peer
/// that does not answer is given up on, `FH_ERR_TIMEOUT`), so that once it returns no peer can
/// reach the range through it (unless another exposure covers it). Errors: `FH_ERR_NULL`,
/// `FH_ERR_UNKNOWN_HANDLE` (no such exposure), `FH_ERR_TIMEOUT`, `FH_ERR_FORKED`.
///
/// # Safety
/// `ctx` is NULL or live. `addr` is not dereferenced.
#[no_mangle]
pub unsafe extern "C" fn fh_unexpose(
    ctx: *mut fh_ctx,
    addr: *const c_void,
    len: usize,
) -> fh_status {
    ffi_guard! {{
        // SAFETY: per the contract.
        let c = match unsafe { here(ctx) } {
            Ok(c) => c,
            Err(e) => return e,
        };
        if addr.is_null() {
            return fh_status::FH_ERR_NULL;
        }
        status_of(c.rma.unexpose(addr as u64, len))
    }}
}

/// The library's own registered memory in this process (the link's receive and send rings and
/// its probe words): never reachable by peers, whatever `FH_EXPOSE` says. Writes up to `max`
/// ranges into `addrs[i]`, `lens[i]` (either may be NULL when `max` is 0) and their total number
/// into `*count`. For diagnostics and tests (a put aimed there must fail with
/// `FH_ERR_REMOTE_DENIED`). Errors: `FH_ERR_NULL`, `FH_ERR_FORKED`.
///
/// # Safety
/// `ctx` is NULL or live; `addrs` and `lens` writable for `max` elements; `count` writable.
#[no_mangle]
pub unsafe extern "C" fn fh_library_ranges(
    ctx: *mut fh_ctx,
    addrs: *mut u64,
    lens: *mut usize,
    max: usize,
    count: *mut usize,
) -> fh_status {
    ffi_guard! {{
        // SAFETY: per the contract.
        let c = match unsafe { here(ctx) } {
            Ok(c) => c,
            Err(e) => return e,
        };
        if count.is_null() || (max > 0 && (addrs.is_null() || lens.is_null())) {
            return fh_status::FH_ERR_NULL;
        }
        let lib = c.rma.exposure().library();
        for (i, &(a, l)) in lib.iter().take(max).enumerate() {
            // SAFETY: i < max, writable per the contract.
            unsafe {
                *addrs.add(i) = a;
                *lens.add(i) = l;
            }
        }
        // SAFETY: non-NULL, writable per the contract.
        unsafe { *count = lib.len() };
        fh_status::FH_OK
    }}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_bits() {
        assert_eq!(rights_of(FH_ACCESS_REMOTE_READ), Some(Rights::READ));
        assert_eq!(rights_of(FH_ACCESS_REMOTE_WRITE), Some(Rights::WRITE));
        assert_eq!(rights_of(6), Some(Rights::BOTH));
        assert_eq!(rights_of(0), None);
        assert_eq!(rights_of(1), None, "local write is not an exposure");
        assert_eq!(rights_of(8), None);
    }

    #[test]
    fn null_context() {
        let mut x = 0u8;
        let p = (&mut x as *mut u8).cast::<c_void>();
        // SAFETY: NULL context.
        unsafe {
            assert_eq!(
                fh_expose(std::ptr::null_mut(), p, 1, 4),
                fh_status::FH_ERR_NULL
            );
            assert_eq!(
                fh_unexpose(std::ptr::null_mut(), p, 1),
                fh_status::FH_ERR_NULL
            );
        }
    }
}
