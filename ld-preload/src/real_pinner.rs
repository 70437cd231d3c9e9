//! The cache's pinning backend inside the shim: `ibv_reg_mr_iova2` / `ibv_dereg_mr` of the
//! *real* libibverbs, called through the resolved pointers.
//!
//! Not `firehose::pin::verbs::VerbsPinner`: that one calls `ibv_reg_mr` by symbol, which inside a
//! preloaded process is our own hook, and it would make every process that inherits LD_PRELOAD
//! link libibverbs. Calling the resolved targets directly needs neither, and lets us time each
//! real call for the `FH_STATS` cost model. It also remembers each MR's kernel `handle` by lkey,
//! because a wrapper MR must carry it and the cache's `Registration` has no room for it.

use std::ffi::c_void;
use std::sync::Mutex;
use std::time::Instant;

use firehose::pin::{Access, PinError, Pinned, Pinner};

use crate::fasthash::{new_map, FastMap};
use crate::ffi_types::{IbvMr, IbvPd};
use crate::real_verbs::RealVerbs;
use crate::stats::{self, COUNTERS};

pub struct RealPinner {
    pd: *mut IbvPd,
    real: &'static RealVerbs,
    handles: Mutex<FastMap<u32, u32>>,
}

// SAFETY: `pd` is an opaque handle that libibverbs allows to be used from any thread; the only
// shared mutable state is behind a Mutex.
unsafe impl Send for RealPinner {}
// SAFETY: as above.
unsafe impl Sync for RealPinner {}

impl RealPinner {
    pub fn new(pd: *mut IbvPd, real: &'static RealVerbs) -> RealPinner {
        RealPinner {
            pd,
            real,
            handles: Mutex::new(new_map()),
        }
    }

    /// Kernel handle of the live MR with this lkey (0 if unknown).
    pub fn handle_of(&self, lkey: u32) -> u32 {
        let map = self.handles.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&lkey).copied().unwrap_or(0)
    }
}

/// ENOMEM/EAGAIN are "out of pinnable memory or keys": the cache evicts and retries.
pub fn classify(errno: i32) -> PinError {
    if errno == libc::ENOMEM || errno == libc::EAGAIN {
        PinError::NoMemory(errno)
    } else {
        PinError::Failed(errno)
    }
}

fn elapsed_ns(t0: Instant) -> u64 {
    u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl Pinner for RealPinner {
    fn pin(&self, addr: usize, len: usize, access: Access) -> Result<Pinned, PinError> {
        let t0 = Instant::now();
        // SAFETY: `pd` is the caller's live protection domain (the cache for it is dropped in our
        // ibv_dealloc_pd hook before the real call); the range is what the cache asked for.
        let mr: *mut IbvMr = unsafe {
            if let Some(f) = self.real.reg_mr_iova2 {
                f(self.pd, addr as *mut c_void, len, addr as u64, access.0)
            } else if let Some(f) = self.real.reg_mr {
                f(self.pd, addr as *mut c_void, len, access.0 as i32)
            } else {
                return Err(PinError::Failed(libc::ENOSYS));
            }
        };
        if mr.is_null() {
            return Err(classify(
                std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
            ));
        }
        let ns = elapsed_ns(t0);
        crate::cost_model::record(&crate::cost_model::REG, len, ns);
        COUNTERS
            .real_reg_ns
            .fetch_add(ns, std::sync::atomic::Ordering::Relaxed);
        stats::bump(&COUNTERS.real_regs);
        stats::pinned_add(len as u64);
        // SAFETY: libibverbs returned a valid MR.
        let m = unsafe { *mr };
        self.handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(m.lkey, m.handle);
        Ok(Pinned {
            token: mr as usize,
            lkey: m.lkey,
            rkey: m.rkey,
        })
    }

    fn unpin(&self, pinned: Pinned, _addr: usize, len: usize) {
        self.handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&pinned.lkey);
        let Some(f) = self.real.dereg_mr else { return };
        let t0 = Instant::now();
        // SAFETY: `token` is the MR our `pin` returned, released exactly once (the cache's
        // contract); deregistering memory that was unmapped meanwhile is fine for the kernel.
        unsafe { f(pinned.token as *mut IbvMr) };
        let ns = elapsed_ns(t0);
        crate::cost_model::record(&crate::cost_model::DEREG, len, ns);
        COUNTERS
            .real_dereg_ns
            .fetch_add(ns, std::sync::atomic::Ordering::Relaxed);
        stats::bump(&COUNTERS.real_deregs);
        stats::pinned_sub(len as u64);
    }

    fn name(&self) -> &'static str {
        "verbs-preload"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_memory_exhaustion_is_retryable() {
        assert_eq!(classify(libc::ENOMEM), PinError::NoMemory(libc::ENOMEM));
        assert_eq!(classify(libc::EAGAIN), PinError::NoMemory(libc::EAGAIN));
        assert_eq!(classify(libc::EFAULT), PinError::Failed(libc::EFAULT));
        assert_eq!(classify(libc::EINVAL), PinError::Failed(libc::EINVAL));
    }
}
