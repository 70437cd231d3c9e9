//! `VerbsPinner`: the cache's pinning backend on a real RDMA device (`ibv_reg_mr`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rdma_sys::{ibv_mr, ibv_pd};

use super::direct::{dereg_mr, reg_mr};

#[cfg(test)]
use super::device::DeviceList;
use super::pd::Pd;
use crate::pin::{Access, PinError, Pinned, Pinner};

/// Registers ranges with `ibv_reg_mr` on one protection domain. The token is the `struct ibv_mr *`.
pub struct VerbsPinner {
    pd: *mut ibv_pd,
    /// Keeps an owned PD (and through it the context) alive; `None` when a C caller lent its PD.
    _owned: Option<Arc<Pd>>,
    dereg_failures: AtomicU64,
}

// SAFETY: `pd` is only passed to ibv_reg_mr, which is thread-safe; the PD is kept alive either by
// `_owned` or by the `from_raw_pd` caller's contract.
unsafe impl Send for VerbsPinner {}
// SAFETY: as above; the counter is atomic.
unsafe impl Sync for VerbsPinner {}

impl VerbsPinner {
    /// A pinner over a PD this process owns.
    pub fn new(pd: Arc<Pd>) -> Self {
        VerbsPinner {
            pd: pd.as_raw(),
            _owned: Some(pd),
            dereg_failures: AtomicU64::new(0),
        }
    }

    /// A pinner over a PD supplied by a C caller and not owned by us. `None` for NULL.
    ///
    /// # Safety
    /// `pd` must be a valid `struct ibv_pd *` that stays allocated for as long as this pinner and
    /// every registration it returned are alive (the caller deallocates it only afterwards).
    pub(crate) unsafe fn from_raw_pd(pd: *mut ibv_pd) -> Option<Self> {
        if pd.is_null() {
            return None;
        }
        Some(VerbsPinner {
            pd,
            _owned: None,
            dereg_failures: AtomicU64::new(0),
        })
    }

    /// How many `ibv_dereg_mr` calls failed (`unpin` cannot return an error, so it counts them).
    pub fn dereg_failures(&self) -> u64 {
        self.dereg_failures.load(Ordering::Relaxed)
    }
}

/// Access flags as verbs wants them: remote write and remote atomic require local write
/// (`ibv_reg_mr` fails with EINVAL otherwise), so it is added rather than failing the pin.
pub(crate) fn verbs_access(access: Access) -> u32 {
    let needs_local_write = Access::REMOTE_WRITE.union(Access::REMOTE_ATOMIC).0;
    if access.0 & needs_local_write != 0 {
        access.union(Access::LOCAL_WRITE).0
    } else {
        access.0
    }
}

/// ENOMEM/EAGAIN are the retryable kind (out of lockable memory or MR keys): the cache evicts and
/// retries. A provider that fails without setting errno is reported as EIO rather than "0".
pub(crate) fn map_reg_errno(errno: i32) -> PinError {
    match errno {
        libc::ENOMEM | libc::EAGAIN => PinError::NoMemory(errno),
        0 => PinError::Failed(libc::EIO),
        e => PinError::Failed(e),
    }
}

impl Pinner for VerbsPinner {
    fn pin(&self, addr: usize, len: usize, access: Access) -> Result<Pinned, PinError> {
        // SAFETY: `pd` is alive (owned Arc or the from_raw_pd contract); the kernel validates the
        // range and registration does not touch the bytes from this process.
        let mr: *mut ibv_mr =
            unsafe { reg_mr(self.pd, addr as *mut _, len, verbs_access(access) as i32) };
        if mr.is_null() {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            return Err(map_reg_errno(errno));
        }
        // SAFETY: `mr` is the live MR just returned; lkey/rkey are plain fields.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        Ok(Pinned {
            token: mr as usize,
            lkey,
            rkey,
        })
    }

    fn unpin(&self, pinned: Pinned, _addr: usize, _len: usize) {
        // Deregistering never touches the (possibly already unmapped) memory: the kernel only
        // drops its page references, so this is safe after invalidation.
        // SAFETY: the token is an `ibv_mr *` returned by `pin` and, per the trait contract,
        // unpinned exactly once.
        let ret = unsafe { dereg_mr(pinned.token as *mut ibv_mr) };
        if ret != 0 {
            self.dereg_failures.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn name(&self) -> &'static str {
        "verbs"
    }
}

/// True when at least one RDMA device is listed (false on hosts whose kernel has no RDMA).
#[cfg(test)]
fn device_available() -> bool {
    DeviceList::get().map(|l| !l.is_empty()).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_errnos_map_to_no_memory() {
        assert_eq!(
            map_reg_errno(libc::ENOMEM),
            PinError::NoMemory(libc::ENOMEM)
        );
        assert_eq!(
            map_reg_errno(libc::EAGAIN),
            PinError::NoMemory(libc::EAGAIN)
        );
        assert_eq!(map_reg_errno(libc::EFAULT), PinError::Failed(libc::EFAULT));
        assert_eq!(map_reg_errno(libc::EINVAL), PinError::Failed(libc::EINVAL));
        assert_eq!(map_reg_errno(0), PinError::Failed(libc::EIO));
    }

    #[test]
    fn remote_write_implies_local_write() {
        assert_eq!(verbs_access(Access::REMOTE_WRITE), 3);
        assert_eq!(verbs_access(Access::REMOTE_ATOMIC), 9);
        assert_eq!(verbs_access(Access::REMOTE_READ), 4);
        assert_eq!(verbs_access(Access::default()), 0);
        assert_eq!(verbs_access(Access::ALL), Access::ALL.0);
    }

    #[test]
    fn null_pd_is_refused() {
        // SAFETY: NULL is explicitly handled and never dereferenced.
        assert!(unsafe { VerbsPinner::from_raw_pd(std::ptr::null_mut()) }.is_none());
    }

    #[test]
    fn device_queries_never_panic() {
        // On a host without RDMA this is false and DeviceList::get is a clean Err or empty list;
        // inside the Soft-RoCE VM it is true. Either way the answers must agree.
        let available = device_available();
        match DeviceList::get() {
            Ok(list) => assert_eq!(available, !list.is_empty()),
            Err(e) => {
                assert!(!available);
                assert!(e.to_string().contains("no RDMA device"), "{e}");
            }
        }
        if !available {
            let err = super::super::open_device(None).unwrap_err();
            assert!(
                matches!(err, super::super::VerbsError::NoDevice(_)),
                "{err}"
            );
        }
    }
}
