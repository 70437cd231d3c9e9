//! Memory window (type 2): a key over part of a memory region, bound through one queue pair by
//! a work request, so it works on that QP's connection only, and dead at once when deallocated
//! (without deregistering the region). Allocated here, bound by `net::verbs` (a bind is a send
//! queue work request), freed on drop.
//!
//! The region a window is bound to cannot be deregistered while the window is bound (the
//! device refuses), so every window over a region is dropped before the region.

use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys::{ibv_alloc_mw, ibv_dealloc_mw, ibv_mw, ibv_mw_type};

use super::error::{VerbsError, VerbsResult};
use super::pd::Pd;

/// An owned type 2 `ibv_mw`. Holds an `Arc` of its PD so the PD is freed after it.
pub struct Mw {
    raw: NonNull<ibv_mw>,
    _pd: Arc<Pd>,
}

// SAFETY: the window's fields are read and written only through `&mut self` (`set_rkey`) or
// read through `&self`; ibv_dealloc_mw is thread-safe and runs once, in drop.
unsafe impl Send for Mw {}
// SAFETY: as above, shared access only reads.
unsafe impl Sync for Mw {}

impl Mw {
    /// Allocate a type 2 window on `pd` (unbound: its key grants nothing yet).
    pub fn alloc(pd: &Arc<Pd>) -> VerbsResult<Self> {
        // SAFETY: the PD is alive (we hold an Arc). rdma-sys returns None when the provider has
        // no alloc_mw at all.
        let raw = unsafe { ibv_alloc_mw(pd.as_raw(), ibv_mw_type::IBV_MW_TYPE_2) };
        let raw = raw
            .and_then(NonNull::new)
            .ok_or_else(|| VerbsError::last("ibv_alloc_mw"))?;
        Ok(Mw {
            raw,
            _pd: Arc::clone(pd),
        })
    }

    /// The key the next bind must carry: the index part stays, the low 8 bits (the key part the
    /// consumer owns) move on, so a key of an earlier binding never works again.
    pub(crate) fn next_rkey(&self) -> u32 {
        let k = self.rkey();
        (k & !0xff) | (k.wrapping_add(1) & 0xff)
    }

    /// The window's current key (the last one bound, or the initial one).
    pub fn rkey(&self) -> u32 {
        // SAFETY: `raw` points to a live window until drop.
        unsafe { (*self.raw.as_ptr()).rkey }
    }

    /// Record the key of a bind just posted. Libibverbs updates it only for type 1 binds; a
    /// provider checks the window's current key in the next bind request (rxe does), so it must
    /// follow every type 2 bind.
    pub(crate) fn set_rkey(&mut self, rkey: u32) {
        // SAFETY: `raw` points to a live window; we have it exclusively.
        unsafe { (*self.raw.as_ptr()).rkey = rkey }
    }

    pub fn as_raw(&self) -> *mut ibv_mw {
        self.raw.as_ptr()
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        // SAFETY: `raw` came from ibv_alloc_mw and is deallocated exactly once, here. A bound
        // window is invalidated by this call (its key stops working before it returns).
        unsafe { ibv_dealloc_mw(self.raw.as_ptr()) };
    }
}
