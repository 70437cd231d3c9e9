//! Memory region: an owned `ibv_reg_mr` registration, deregistered on drop.
//!
//! Registering is a safe call: the kernel validates the range (EFAULT for unmapped memory) and
//! registration neither reads nor writes the bytes. The danger is in *using* the keys while the
//! memory is owned by someone else, which is why posting work requests (`Qp::post_*`) is unsafe.

use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys::ibv_mr;

use super::direct::{dereg_mr, reg_mr};

use super::error::{VerbsError, VerbsResult};
use super::pd::Pd;
use crate::pin::Access;

/// An owned registration. Holds an `Arc` of its PD so the PD is freed after it.
pub struct Mr {
    raw: NonNull<ibv_mr>,
    _pd: Arc<Pd>,
}

// SAFETY: the MR's fields are written once by ibv_reg_mr and only read afterwards; ibv_dereg_mr
// is thread-safe and runs once, in drop.
unsafe impl Send for Mr {}
// SAFETY: as above, shared access only reads immutable fields.
unsafe impl Sync for Mr {}

impl Mr {
    /// Register `[addr, addr + len)` on `pd` with `access` (passed to verbs unchanged).
    pub fn register(pd: &Arc<Pd>, addr: usize, len: usize, access: Access) -> VerbsResult<Self> {
        // SAFETY: the PD is alive (we hold an Arc); the kernel checks the range itself and the
        // call does not dereference `addr` in this process.
        let raw = unsafe { reg_mr(pd.as_raw(), addr as *mut _, len, access.0 as i32) };
        let raw = NonNull::new(raw).ok_or_else(|| VerbsError::last("ibv_reg_mr"))?;
        Ok(Mr {
            raw,
            _pd: Arc::clone(pd),
        })
    }

    pub fn lkey(&self) -> u32 {
        // SAFETY: `raw` points to a live MR until drop.
        unsafe { (*self.raw.as_ptr()).lkey }
    }

    pub fn rkey(&self) -> u32 {
        // SAFETY: `raw` points to a live MR until drop.
        unsafe { (*self.raw.as_ptr()).rkey }
    }

    /// Start address of the registered range.
    pub fn addr(&self) -> usize {
        // SAFETY: `raw` points to a live MR until drop.
        unsafe { (*self.raw.as_ptr()).addr as usize }
    }

    /// Length of the registered range.
    pub fn len(&self) -> usize {
        // SAFETY: `raw` points to a live MR until drop.
        unsafe { (*self.raw.as_ptr()).length }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn as_raw(&self) -> *mut ibv_mr {
        self.raw.as_ptr()
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: `raw` came from ibv_reg_mr and is deregistered exactly once, here.
        unsafe { dereg_mr(self.raw.as_ptr()) };
    }
}
