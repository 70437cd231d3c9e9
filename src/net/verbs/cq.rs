//! Completion queue: batched non-blocking polls, polling with a deadline (so a lost completion is
//! an error, never a hang), and arming for a completion channel.

use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_sys::{
    ibv_cq, ibv_create_cq, ibv_destroy_cq, ibv_poll_cq, ibv_req_notify_cq, ibv_wc, ibv_wc_status,
    ibv_wc_status_str,
};

use super::comp_channel::CompChannel;
use crate::pin::verbs::{Context, VerbsError, VerbsResult};

/// How many work completions one `ibv_poll_cq` call asks for.
pub(crate) const POLL_BATCH: usize = 16;

/// An owned `ibv_cq`. QPs that use it hold an `Arc` of it; it holds its completion channel (if
/// any), which is therefore destroyed after it.
pub struct Cq {
    raw: NonNull<ibv_cq>,
    _channel: Option<Arc<CompChannel>>,
    _ctx: Arc<Context>,
}

// SAFETY: providers serialise ibv_poll_cq internally; the CQ is a kernel/provider handle with no
// Rust-side state.
unsafe impl Send for Cq {}
// SAFETY: as above.
unsafe impl Sync for Cq {}

/// The fields of `struct ibv_wc` callers look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Completion {
    pub wr_id: u64,
    /// `ibv_wc_status` value (0 = success).
    pub status: u32,
    /// `ibv_wc_opcode` value (valid only on success).
    pub opcode: u32,
    pub byte_len: u32,
    pub qp_num: u32,
    pub vendor_err: u32,
}

impl Completion {
    pub(crate) fn is_success(&self) -> bool {
        self.status == ibv_wc_status::IBV_WC_SUCCESS
    }

    /// libibverbs' text for the status ("transport retry counter exceeded", ...).
    pub fn status_text(&self) -> String {
        status_text(self.status)
    }

    /// `Ok(self)` on success, else a `VerbsError::Completion` naming the status.
    pub fn into_result(self) -> VerbsResult<Self> {
        if self.is_success() {
            Ok(self)
        } else {
            Err(VerbsError::Completion {
                wr_id: self.wr_id,
                status: self.status,
                text: format!("{} (vendor_err {:#x})", self.status_text(), self.vendor_err),
            })
        }
    }
}

fn status_text(status: u32) -> String {
    // SAFETY: ibv_wc_status_str returns a static string for any value ("unknown" if out of range).
    unsafe {
        let p = ibv_wc_status_str(status);
        if p.is_null() {
            return format!("status {status}");
        }
        std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

// See pd.rs: the constructor lives with the child.
impl Context {
    /// Create a completion queue with room for at least `cqe` entries.
    pub fn create_cq(self: &Arc<Self>, cqe: i32) -> VerbsResult<Arc<Cq>> {
        Cq::create(self, cqe, None)
    }
}

impl Cq {
    /// Create a CQ on `ctx`; with `channel`, `req_notify` makes it report to that channel.
    pub fn create(
        ctx: &Arc<Context>,
        cqe: i32,
        channel: Option<&Arc<CompChannel>>,
    ) -> VerbsResult<Arc<Self>> {
        let ch = channel.map_or(std::ptr::null_mut(), |c| c.as_raw());
        // SAFETY: the context is open; `ch` is null or a live channel of the same context (the
        // CQ keeps an Arc of it); no cq_context, completion vector 0.
        let raw = unsafe { ibv_create_cq(ctx.as_raw(), cqe, std::ptr::null_mut(), ch, 0) };
        let raw = NonNull::new(raw).ok_or_else(|| VerbsError::last("ibv_create_cq"))?;
        Ok(Arc::new(Cq {
            raw,
            _channel: channel.cloned(),
            _ctx: Arc::clone(ctx),
        }))
    }

    /// Ask for one event on the CQ's channel at the next completion (any completion, not only
    /// solicited ones). Completions already queued do not trigger it: re-poll after arming.
    pub(crate) fn req_notify(&self) -> VerbsResult<()> {
        // SAFETY: the CQ is alive; `ibv_req_notify_cq` is a verbs.h inline that calls the
        // provider's op (rdma-sys reimplements it the same way).
        let ret = unsafe { ibv_req_notify_cq(self.as_raw(), 0) };
        if ret != 0 {
            return Err(VerbsError::from_ret("ibv_req_notify_cq", ret));
        }
        Ok(())
    }

    /// Poll once (at most `max`, and at most `POLL_BATCH`, entries) and hand each completion to
    /// `f`, oldest first; returns how many there were. No allocation and no array of
    /// `Completion`s to fill: this is on every op's completion path (an array of 16 cost its
    /// zeroing on each poll, though the usual poll finds none or one).
    #[inline]
    pub(crate) fn poll_each(
        &self,
        max: usize,
        mut f: impl FnMut(&Completion),
    ) -> VerbsResult<usize> {
        let mut wcs: [MaybeUninit<ibv_wc>; POLL_BATCH] =
            [const { MaybeUninit::uninit() }; POLL_BATCH];
        let want = max.min(POLL_BATCH) as i32;
        // SAFETY: the CQ is alive; `wcs` has room for `want` entries which the provider writes.
        // (`ibv_poll_cq` is a verbs.h inline; rdma-sys calls the context's ops table the same way.)
        let n = unsafe { ibv_poll_cq(self.as_raw(), want, wcs.as_mut_ptr().cast()) };
        if n < 0 {
            return Err(VerbsError::from_ret("ibv_poll_cq", -n));
        }
        for wc in &wcs[..n as usize] {
            // SAFETY: the provider initialised the first `n` entries.
            let wc = unsafe { wc.assume_init_ref() };
            f(&Completion {
                wr_id: wc.wr_id,
                status: wc.status,
                opcode: wc.opcode,
                byte_len: wc.byte_len,
                qp_num: wc.qp_num,
                vendor_err: wc.vendor_err,
            });
        }
        Ok(n as usize)
    }

    pub fn as_raw(&self) -> *mut ibv_cq {
        self.raw.as_ptr()
    }

    /// Poll once, appending at most `max` completions to `out`; returns how many were appended.
    pub fn poll(&self, max: usize, out: &mut Vec<Completion>) -> VerbsResult<usize> {
        self.poll_each(max, |c| out.push(*c))
    }

    /// Poll until `count` completions arrived or `timeout` passed. Completions with an error
    /// status are returned too (the caller decides); only running out of time is an error.
    pub fn wait(&self, count: usize, timeout: Duration) -> VerbsResult<Vec<Completion>> {
        let start = Instant::now();
        let mut out = Vec::with_capacity(count);
        while out.len() < count {
            if self.poll(count - out.len(), &mut out)? == 0 {
                if start.elapsed() > timeout {
                    return Err(VerbsError::Timeout {
                        what: "completions",
                        after: timeout,
                    });
                }
                // Soft-RoCE completes from kernel work; yielding lets it run on small VMs.
                std::thread::yield_now();
            }
        }
        Ok(out)
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: every QP using this CQ holds an Arc of it, so none is alive; destroyed once.
        // Events from its channel are acknowledged as soon as they are read (comp_channel.rs), so
        // this does not wait forever for an acknowledgement.
        unsafe { ibv_destroy_cq(self.raw.as_ptr()) };
    }
}
