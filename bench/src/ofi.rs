//! libfabric's MR cache on the verbs provider (`fi_mr_reg` / `fi_close` on one domain), through
//! `csrc/ofi_shim.c`. Only with `--backend verbs` (it needs a device: the Soft-RoCE VM). It
//! registers with its own PD, so the bench cannot count its backend calls; its rows rely on
//! libfabric's cache being on (FI_MR_CACHE_MAX_COUNT is raised above the region count).

use std::ffi::{c_void, CString};

use crate::impls::RegCache;

extern "C" {
    fn fhb_ofi_open(prov: *const libc::c_char, out: *mut *mut c_void) -> libc::c_int;
    fn fhb_ofi_close(h: *mut c_void);
    fn fhb_ofi_get(h: *mut c_void, addr: usize, len: usize) -> *mut c_void;
    fn fhb_ofi_put(h: *mut c_void, mr: *mut c_void);
}

pub struct Ofi {
    h: *mut c_void,
}

// SAFETY: libfabric domains opened with the default threading model (FI_THREAD_SAFE for verbs)
// take concurrent fi_mr_reg/fi_close; the handle is only used through those calls.
unsafe impl Send for Ofi {}
// SAFETY: as above.
unsafe impl Sync for Ofi {}

impl Ofi {
    /// Open a domain of `prov`; Err with the fi_errno when there is no such provider/device.
    pub fn open(prov: &str) -> Result<Ofi, String> {
        let name = CString::new(prov).map_err(|e| e.to_string())?;
        let mut h = std::ptr::null_mut();
        // SAFETY: `name` is a valid C string for the call; the shim fills `h` on success.
        let rc = unsafe { fhb_ofi_open(name.as_ptr(), &mut h) };
        if rc != 0 || h.is_null() {
            return Err(format!("libfabric {prov} domain: fi_errno {rc}"));
        }
        Ok(Ofi { h })
    }

    /// Environment libfabric reads at initialisation: must run before the first `open`, while
    /// the process has a single thread. Existing values win.
    pub fn configure_env(max_regions: usize) {
        let defaults = [
            (
                "FI_MR_CACHE_MAX_COUNT",
                (2 * max_regions).max(1024).to_string(),
            ),
            // rxe's max_cqe is smaller than libfabric's default CQ size (see SOFTROCE.md).
            ("FI_UNIVERSE_SIZE", "16".to_string()),
        ];
        for (k, v) in defaults {
            if std::env::var_os(k).is_none() {
                std::env::set_var(k, v);
            }
        }
    }
}

impl RegCache for Ofi {
    fn name(&self) -> &'static str {
        "ofi"
    }
    #[inline]
    fn get(&self, addr: usize, len: usize) -> Option<u64> {
        // SAFETY: valid domain; libfabric only registers the range (it must be mapped: it is).
        let mr = unsafe { fhb_ofi_get(self.h, addr, len) };
        (!mr.is_null()).then_some(mr as u64)
    }
    #[inline]
    fn put(&self, handle: u64) {
        // SAFETY: `handle` is an MR from a successful `get`, closed exactly once.
        unsafe { fhb_ofi_put(self.h, handle as *mut c_void) }
    }
}

impl Drop for Ofi {
    fn drop(&mut self) {
        // SAFETY: every MR was closed; closes domain, fabric and info once.
        unsafe { fhb_ofi_close(self.h) }
    }
}
