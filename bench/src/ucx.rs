//! UCX's standalone registration cache (libucs `ucs_rcache_*`, UCX 1.13 on Debian), through the
//! C adapter in `csrc/ucx_shim.c`. Its mem_reg/mem_dereg callbacks come back here and pin through
//! the same firehose `Pinner` our cache uses, so the backend cost is identical on both sides.

use std::ffi::c_void;
use std::sync::Arc;

use firehose::internals::pin::{Pinned, Pinner};

use crate::backend::CountingBackend;
use crate::impls::{RegCache, ACCESS};

extern "C" {
    fn fhb_ucx_create(
        ctx: *mut c_void,
        max_regions: libc::c_ulong,
        max_size: usize,
        with_events: libc::c_int,
        out: *mut *mut c_void,
    ) -> libc::c_int;
    fn fhb_ucx_destroy(rcache: *mut c_void);
    fn fhb_ucx_get(rcache: *mut c_void, addr: usize, len: usize) -> *mut c_void;
    fn fhb_ucx_put(rcache: *mut c_void, region: *mut c_void);
    fn fhb_ucx_invalidate(rcache: *mut c_void, region: *mut c_void);
    fn fhb_ucx_region_struct_size() -> usize;
    fn fhb_ucx_base_region_size() -> usize;
}

/// Called by UCX (through the shim) to register a region. `ctx` is the `CountingBackend`.
#[no_mangle]
extern "C" fn fhb_backend_pin(
    ctx: *mut c_void,
    addr: usize,
    len: usize,
    token: *mut usize,
    lkey: *mut u32,
    rkey: *mut u32,
) -> libc::c_int {
    // SAFETY: `ctx` is the `CountingBackend` that `Ucx` keeps alive (an `Arc` it owns) for as
    // long as the rcache exists, and the rcache is destroyed before that Arc is dropped.
    let backend = unsafe { &*(ctx as *const CountingBackend) };
    match backend.pin(addr, len, ACCESS) {
        Ok(p) => {
            // SAFETY: the three out-pointers are fields of the region UCX just allocated for us.
            unsafe {
                *token = p.token;
                *lkey = p.lkey;
                *rkey = p.rkey;
            }
            0
        }
        Err(_) => -1,
    }
}

/// Called by UCX (through the shim) when it drops a region.
#[no_mangle]
extern "C" fn fhb_backend_unpin(
    ctx: *mut c_void,
    addr: usize,
    len: usize,
    token: usize,
    lkey: u32,
    rkey: u32,
) {
    // SAFETY: see `fhb_backend_pin`.
    let backend = unsafe { &*(ctx as *const CountingBackend) };
    backend.unpin(Pinned { token, lkey, rkey }, addr, len);
}

pub struct Ucx {
    rcache: *mut c_void,
    // Kept alive for the callbacks; declared after `rcache` is destroyed in Drop.
    _backend: Arc<CountingBackend>,
}

// SAFETY: UCX documents ucs_rcache as thread safe (its own rwlock + spinlocks); the pointer is
// only used through ucs_rcache_* calls, and the backend it calls back into is Send + Sync.
unsafe impl Send for Ucx {}
// SAFETY: as above.
unsafe impl Sync for Ucx {}

impl Ucx {
    /// `max_regions == 0` means unbounded. Subscribes to UCM unmap events like UCX's IB transport
    /// does (falls back to no events if UCM cannot install its hooks, and says so).
    pub fn new(backend: Arc<CountingBackend>, max_regions: u64) -> Result<Ucx, String> {
        let ctx = Arc::as_ptr(&backend) as *mut c_void;
        let mut rcache = std::ptr::null_mut();
        // SAFETY: the shim fills `rcache` on success; ctx outlives the rcache (see field order).
        let st = unsafe { fhb_ucx_create(ctx, max_regions as libc::c_ulong, 0, 1, &mut rcache) };
        if st != 0 || rcache.is_null() {
            return Err(format!("ucs_rcache_create failed: ucs_status {st}"));
        }
        Ok(Ucx {
            rcache,
            _backend: backend,
        })
    }

    /// Force the next `get` of this region's range to miss: what an unmap event would do.
    pub fn invalidate(&self, handle: u64) {
        // SAFETY: `handle` is a region returned by `get` and still held by the caller.
        unsafe { fhb_ucx_invalidate(self.rcache, handle as *mut c_void) }
    }

    /// Size of the region struct UCX allocates per region (its own part, ours on top).
    pub fn region_struct_size() -> (usize, usize) {
        // SAFETY: pure functions returning sizeof values.
        unsafe { (fhb_ucx_base_region_size(), fhb_ucx_region_struct_size()) }
    }
}

impl RegCache for Ucx {
    fn name(&self) -> &'static str {
        "ucx"
    }
    #[inline]
    fn get(&self, addr: usize, len: usize) -> Option<u64> {
        // SAFETY: valid rcache; UCX only reads the range through our mem_reg callback.
        let r = unsafe { fhb_ucx_get(self.rcache, addr, len) };
        (!r.is_null()).then_some(r as u64)
    }
    #[inline]
    fn put(&self, handle: u64) {
        // SAFETY: `handle` came from a successful `get` on this rcache and is released once.
        unsafe { fhb_ucx_put(self.rcache, handle as *mut c_void) }
    }
}

impl Drop for Ucx {
    fn drop(&mut self) {
        // SAFETY: destroyed once, after every handle was put; the backend Arc is still alive.
        unsafe { fhb_ucx_destroy(self.rcache) }
    }
}
