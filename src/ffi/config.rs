//! `fh_config`: defaults + `FH_*` environment, reading a caller's struct safely across ABI versions.

use crate::config::{Backend, Config};
use crate::ffi::status::{fh_status, FhResult};

use super::guard::{ffi_guard, status_of};
use super::handle::write_out;
use super::types::*;

/// Defaults plus `FH_*` environment variables, as an `fh_config`.
pub(crate) fn from_env() -> FhResult<fh_config> {
    Ok(from_config(&Config::from_env()?))
}

/// Settings as an `fh_config` (without the ones it has no field for: fork mode, helper clock).
pub(crate) fn from_config(c: &Config) -> fh_config {
    let mut monitor = 0;
    if c.monitor.patch_libc {
        monitor |= FH_MONITOR_PATCH_LIBC;
    }
    if c.monitor.userfaultfd {
        monitor |= FH_MONITOR_USERFAULTFD;
    }
    fh_config {
        struct_size: std::mem::size_of::<fh_config>() as u32,
        backend: match c.backend {
            Backend::Auto => FH_BACKEND_AUTO,
            Backend::Verbs => FH_BACKEND_VERBS,
            Backend::Mlock => FH_BACKEND_MLOCK,
        },
        max_pinned: c.max_pinned,
        max_regions: c.max_regions,
        ibv_pd: std::ptr::null_mut(),
        monitor,
        reserved: 0,
        helper: if c.helper.enabled {
            FH_HELPER_ON
        } else {
            FH_HELPER_OFF
        },
        helper_cpu: c.helper.cpu.map_or(FH_HELPER_CPU_AUTO, |n| n as u32),
        helper_min_bytes: c.helper.min_bytes,
    }
}

/// Copies a caller's config, honouring `struct_size`, and checks every field.
///
/// # Safety
/// `cfg` is non-NULL and valid for reads of `cfg->struct_size` bytes (at least the `struct_size`
/// field itself).
pub(crate) unsafe fn read(cfg: *const fh_config) -> FhResult<fh_config> {
    // SAFETY: the first field is readable per the contract; read it alone before trusting it.
    let size = unsafe { std::ptr::addr_of!((*cfg).struct_size).read_unaligned() } as usize;
    // Exactly one of the published layouts (a size between them cuts a field in two).
    if size != FH_CONFIG_MIN_SIZE && size != std::mem::size_of::<fh_config>() {
        return Err(fh_status::FH_ERR_BAD_CONFIG);
    }
    let c = if size == std::mem::size_of::<fh_config>() {
        // SAFETY: `size == size_of::<fh_config>()` bytes are readable per the contract.
        unsafe { cfg.read_unaligned() }
    } else {
        // An older layout: the fields it has are the caller's, the newer ones the environment's
        // (fields are only ever appended, and the struct is `repr(C)`).
        let mut c = from_env()?;
        // SAFETY: `size` bytes are readable per the contract and fit in `c` (checked above);
        // every byte pattern the prefix can hold is checked by `validate` before use (the
        // pointer field is only ever passed back to verbs, as the caller's own value).
        unsafe {
            std::ptr::copy_nonoverlapping(
                cfg.cast::<u8>(),
                std::ptr::addr_of_mut!(c).cast::<u8>(),
                size,
            )
        };
        c.struct_size = std::mem::size_of::<fh_config>() as u32;
        c
    };
    validate(&c)?;
    Ok(c)
}

/// Field checks shared by every path that accepts a config.
pub(crate) fn validate(c: &fh_config) -> FhResult<()> {
    let backend_ok = matches!(
        c.backend,
        FH_BACKEND_AUTO | FH_BACKEND_VERBS | FH_BACKEND_MLOCK
    );
    let pd_ok = c.backend != FH_BACKEND_MLOCK || c.ibv_pd.is_null();
    if !backend_ok
        || !pd_ok
        || c.max_pinned == 0
        || c.monitor & !FH_MONITOR_ALL != 0
        || c.reserved != 0
        || !matches!(c.helper, FH_HELPER_OFF | FH_HELPER_ON)
        || (c.helper_cpu != FH_HELPER_CPU_AUTO && c.helper_cpu as usize >= crate::config::MAX_CPU)
        || c.helper_min_bytes == 0
    {
        return Err(fh_status::FH_ERR_BAD_CONFIG);
    }
    Ok(())
}

/// Fills `*cfg` with the defaults overridden by the `FH_*` environment variables
/// (`FH_BACKEND`, `FH_MAX_PINNED`, `FH_MAX_REGIONS`, `FH_MONITOR`, `FH_HELPER`,
/// `FH_HELPER_CPU`, `FH_HELPER_MIN`) and sets `struct_size`.
///
/// Returns `FH_ERR_NULL` if `cfg` is NULL, `FH_ERR_BAD_CONFIG` if an environment variable is
/// invalid (a message naming it goes to stderr); `*cfg` is written only on `FH_OK`.
///
/// # Safety
/// `cfg` is NULL or valid for writing one `fh_config`.
#[no_mangle]
pub unsafe extern "C" fn fh_config_init(cfg: *mut fh_config) -> fh_status {
    ffi_guard! {{
        if cfg.is_null() {
            return fh_status::FH_ERR_NULL;
        }
        status_of(from_env().map(|c| {
            // SAFETY: non-NULL checked above; valid for writes per the contract.
            unsafe { write_out(cfg, c) }
        }))
    }}
}
