//! Chooses and builds the pinning backend a new cache uses, from a validated `fh_config`.

use std::ffi::c_void;
use std::sync::Arc;

use crate::ffi::status::{fh_status, FhResult};
use crate::pin::mlock::MlockPinner;
use crate::pin::verbs::{open_device, VerbsPinner};
use crate::pin::Pinner;

use super::types::{FH_BACKEND_AUTO, FH_BACKEND_MLOCK, FH_BACKEND_VERBS};

/// The backend plus a one-line description for `fh_info`.
pub(crate) struct Backend {
    pub(crate) pinner: Arc<dyn Pinner>,
    pub(crate) detail: String,
    /// Registrations are shared with a NIC (what a `fork` can break: `pin/fork_mode.rs`).
    pub(crate) verbs: bool,
}

/// Builds the backend `backend` (an `FH_BACKEND_*` value, already range-checked).
///
/// With `FH_BACKEND_AUTO`, a caller PD means verbs; otherwise verbs when a device opens, else
/// mlock (the fallback is silent on purpose: that is what "auto" asks for; `fh_info` shows it).
///
/// # Safety
/// `pd` is NULL or a live `struct ibv_pd *` that outlives every cache built on it.
pub(crate) unsafe fn build(backend: u32, pd: *mut c_void) -> FhResult<Backend> {
    match backend {
        FH_BACKEND_MLOCK if !pd.is_null() => Err(fh_status::FH_ERR_BAD_CONFIG),
        FH_BACKEND_MLOCK => Ok(mlock()),
        // SAFETY: forwarded contract on `pd`.
        FH_BACKEND_VERBS => unsafe { verbs(pd) },
        FH_BACKEND_AUTO if !pd.is_null() => {
            // SAFETY: forwarded contract on `pd`.
            unsafe { verbs(pd) }
        }
        FH_BACKEND_AUTO => {
            // SAFETY: a NULL PD carries no contract.
            unsafe { verbs(pd) }.or_else(|_| Ok(mlock()))
        }
        _ => Err(fh_status::FH_ERR_BAD_CONFIG),
    }
}

fn mlock() -> Backend {
    Backend {
        pinner: Arc::new(MlockPinner::new()),
        detail: "mlock (keys are local cookies, no RDMA)".to_string(),
        verbs: false,
    }
}

/// # Safety
/// `pd` is NULL or a live `struct ibv_pd *` that outlives the pinner.
unsafe fn verbs(pd: *mut c_void) -> FhResult<Backend> {
    if pd.is_null() {
        // `FH_DEVICE` picks a device by name, as in the verbs test programs; default: the first.
        let name = std::env::var("FH_DEVICE").ok();
        let ctx = open_device(name.as_deref()).map_err(|_| fh_status::FH_ERR_NO_DEVICE)?;
        let own_pd = ctx.alloc_pd().map_err(|_| fh_status::FH_ERR_NO_DEVICE)?;
        Ok(Backend {
            pinner: Arc::new(VerbsPinner::new(own_pd)),
            detail: format!("verbs ({}, own PD)", ctx.name()),
            verbs: true,
        })
    } else {
        // SAFETY: per the contract, `pd` is a live PD that outlives the pinner (and the cache).
        let pinner =
            unsafe { VerbsPinner::from_raw_pd(pd.cast()) }.ok_or(fh_status::FH_ERR_NULL)?;
        Ok(Backend {
            pinner: Arc::new(pinner),
            detail: format!("verbs (caller PD {pd:p})"),
            verbs: true,
        })
    }
}
