//! Ownership of opaque handles (`fh_cache *`, `fh_ctx *`): the ONLY place that converts between
//! `Arc` and raw pointers.
//!
//! A handle handed to C is one strong count of an `Arc<T>` leaked with `Arc::into_raw`. Calls
//! borrow it for their duration; `fh_cache_free` / `fh_finalize` give the count back.

use std::sync::Arc;

/// Leaks one strong count to C.
pub(crate) fn into_raw<T>(obj: Arc<T>) -> *mut T {
    Arc::into_raw(obj) as *mut T
}

/// Borrows the cache behind a C pointer for the duration of one call; `None` for NULL.
///
/// # Safety
/// `ptr` is NULL or came from [`into_raw`] and has not been passed to [`release`] yet (the C
/// contract of every `fh_*` function taking a cache).
pub(crate) unsafe fn borrow<'a, T>(ptr: *const T) -> Option<&'a T> {
    // SAFETY: per the contract above, a non-NULL `ptr` points to a live `T` kept alive by
    // the count leaked in `into_raw`, which outlives this call.
    unsafe { ptr.as_ref() }
}

/// Takes back the count leaked by [`into_raw`] and returns it, so the caller decides when it drops.
///
/// # Safety
/// `ptr` is non-NULL, came from [`into_raw`] and is not used by C after this call.
pub(crate) unsafe fn take_back<T>(ptr: *mut T) -> Arc<T> {
    // SAFETY: `ptr` came from `Arc::into_raw` on an `Arc<T>` (only `into_raw` makes them)
    // and ownership of that one count moves back here exactly once, per the contract.
    unsafe { Arc::from_raw(ptr as *const T) }
}

/// Writes an output parameter. Callers check for NULL first (and return `FH_ERR_NULL`) so that
/// outputs are written only on success.
///
/// # Safety
/// `out` is non-NULL, aligned and valid for a write of `T`.
pub(crate) unsafe fn write_out<T>(out: *mut T, value: T) {
    // SAFETY: per the contract; `write` does not drop the (possibly uninitialised) old value.
    unsafe { out.write(value) }
}
