//! Ownership of `fh_cache` pointers: the ONLY place that converts between `Arc` and raw pointers.
//!
//! A `fh_cache *` handed to C is one strong count of an `Arc<fh_cache>` leaked with
//! `Arc::into_raw`. Calls borrow it for their duration; `fh_cache_free` gives the count back.

use std::sync::Arc;

use super::cache_object::fh_cache;

/// Leaks one strong count to C.
pub(crate) fn into_raw(cache: Arc<fh_cache>) -> *mut fh_cache {
    Arc::into_raw(cache) as *mut fh_cache
}

/// Borrows the cache behind a C pointer for the duration of one call; `None` for NULL.
///
/// # Safety
/// `ptr` is NULL or came from [`into_raw`] and has not been passed to [`release`] yet (the C
/// contract of every `fh_*` function taking a cache).
pub(crate) unsafe fn borrow<'a>(ptr: *const fh_cache) -> Option<&'a fh_cache> {
    // SAFETY: per the contract above, a non-NULL `ptr` points to a live `fh_cache` kept alive by
    // the count leaked in `into_raw`, which outlives this call.
    unsafe { ptr.as_ref() }
}

/// Takes back the count leaked by [`into_raw`] and returns it, so the caller decides when it drops.
///
/// # Safety
/// `ptr` is non-NULL, came from [`into_raw`] and is not used by C after this call.
pub(crate) unsafe fn take_back(ptr: *mut fh_cache) -> Arc<fh_cache> {
    // SAFETY: `ptr` came from `Arc::into_raw` on an `Arc<fh_cache>` (only `into_raw` makes them)
    // and ownership of that one count moves back here exactly once, per the contract.
    unsafe { Arc::from_raw(ptr as *const fh_cache) }
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
