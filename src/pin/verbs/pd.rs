//! Protection domain: the parent of memory regions and queue pairs.

use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys::{ibv_alloc_pd, ibv_dealloc_pd, ibv_pd};

use super::context::Context;
use super::error::{VerbsError, VerbsResult};

/// An owned `ibv_pd`. MRs and QPs hold an `Arc` of it, so it is freed after them.
pub struct Pd {
    raw: NonNull<ibv_pd>,
    ctx: Arc<Context>,
}

// SAFETY: a PD is an immutable kernel handle; verbs that take it (reg_mr, create_qp) are
// thread-safe.
unsafe impl Send for Pd {}
// SAFETY: as above.
unsafe impl Sync for Pd {}

// Children hang off their parent here, not in context.rs: the parent file knows nothing of them,
// so the verbs files import one way only (child -> parent).
impl Context {
    /// Allocate a protection domain on this context.
    pub fn alloc_pd(self: &Arc<Self>) -> VerbsResult<Arc<Pd>> {
        Pd::alloc(Arc::clone(self))
    }
}

impl Pd {
    pub(super) fn alloc(ctx: Arc<Context>) -> VerbsResult<Arc<Self>> {
        // SAFETY: the context is open (we hold an Arc of it).
        let raw = unsafe { ibv_alloc_pd(ctx.as_raw()) };
        let raw = NonNull::new(raw).ok_or_else(|| VerbsError::last("ibv_alloc_pd"))?;
        Ok(Arc::new(Pd { raw, ctx }))
    }

    /// The raw PD, e.g. to hand to `VerbsPinner::from_raw_pd`. Valid while `self` lives.
    pub fn as_raw(&self) -> *mut ibv_pd {
        self.raw.as_ptr()
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: every MR/QP made from this PD holds an Arc of it, so none is alive; freed once.
        // (A raw-pointer user such as VerbsPinner::from_raw_pd must keep its own guarantee.)
        unsafe { ibv_dealloc_pd(self.raw.as_ptr()) };
    }
}
