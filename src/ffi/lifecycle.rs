//! Creating and destroying caches: `fh_cache_new`, `fh_cache_finalize`, `fh_cache_free`.

use std::sync::Arc;

use crate::assembly::{self, Parts};
use crate::cache::Limits;
use crate::config::HelperSettings;
use crate::ffi::status::{fh_status, FhResult};
use crate::helper::clock::ClockChoice;
use crate::monitor::{self, MonitorOptions};
use crate::pin::fork_mode;
use crate::pin::fork_mode::ForkSetting;

use super::cache_object::fh_cache;
use super::guard::ffi_guard;
use super::handle::{borrow, into_raw, take_back, write_out};
use super::types::*;
use super::{backend, config};

/// Builds the cache object from a validated config, with the two settings the C struct has no
/// field for (`FH_FORK_MODE`, `FH_HELPER_CLOCK`), through the one assembly the shim uses too.
///
/// # Safety
/// `cfg.ibv_pd` is NULL or a live `struct ibv_pd *` that outlives the cache.
pub(crate) unsafe fn build(
    cfg: fh_config,
    fork: ForkSetting,
    clock: ClockChoice,
) -> FhResult<Arc<fh_cache>> {
    // SAFETY: forwarded contract on `cfg.ibv_pd`.
    let backend = unsafe { backend::build(cfg.backend, cfg.ibv_pd) }?;
    let opts = MonitorOptions {
        patch_libc: cfg.monitor & FH_MONITOR_PATCH_LIBC != 0,
        userfaultfd: cfg.monitor & FH_MONITOR_USERFAULTFD != 0,
    };
    // The monitor is process-wide and idempotent; with no bits set only `fh_notify_unmapped`
    // invalidates. What is really active shows in `fh_info`.
    if opts.patch_libc || opts.userfaultfd {
        // Before the hooks go live: every patched unmap is logged for the helper threads.
        crate::helper::install_unmap_windows();
        monitor::install(opts);
    }
    let helper = HelperSettings {
        enabled: cfg.helper == FH_HELPER_ON,
        cpu: (cfg.helper_cpu != FH_HELPER_CPU_AUTO).then_some(cfg.helper_cpu as usize),
        min_bytes: cfg.helper_min_bytes,
        clock,
    };
    let a = assembly::assemble(Parts {
        fork: fork_mode::resolve(fork, backend.verbs),
        pinner: backend.pinner,
        limits: Limits {
            max_pinned: cfg.max_pinned,
            max_regions: cfg.max_regions,
        },
        uffd_watch: opts.userfaultfd,
        // Always subscribed, so `fh_notify_unmapped` reaches every cache even with no monitor path.
        events: true,
        helper: assembly::helper_config(&helper),
    })?;
    Ok(Arc::new(fh_cache {
        _subscription: a.subscription,
        helper: a.helper,
        cache: a.cache,
        monitor_requested: cfg.monitor,
        backend_detail: backend.detail,
    }))
}

/// The settings of `fh_cache_new(cfg)`: `cfg` NULL: defaults and the environment, read once;
/// else the caller's struct, and the environment for what it has no field for.
///
/// # Safety
/// `cfg` is NULL or readable per `fh_cache_new`'s contract.
pub(crate) unsafe fn settings(
    cfg: *const fh_config,
) -> FhResult<(fh_config, ForkSetting, ClockChoice)> {
    if cfg.is_null() {
        let c = crate::config::Config::from_env()?;
        Ok((config::from_config(&c), c.fork, c.helper.clock))
    } else {
        // SAFETY: non-NULL, and readable per the contract.
        let c = unsafe { config::read(cfg) }?;
        Ok((
            c,
            crate::config::fork_setting_from_env()?,
            crate::config::helper_clock_from_env()?,
        ))
    }
}

/// Creates a cache. `cfg` may be NULL: defaults plus the `FH_*` environment (as `fh_config_init`).
///
/// Returns `FH_ERR_NULL` (`out` NULL), `FH_ERR_BAD_CONFIG` (bad field, bad `struct_size`, bad
/// environment, `ibv_pd` with the mlock backend), `FH_ERR_NO_DEVICE` (verbs backend without a
/// device), `FH_ERR_TOO_MANY_CACHES` (65536 caches live at once in the process: every cache is
/// subscribed to memory events, and one that cannot be is never handed out). `*out` is written
/// only on `FH_OK`; free the cache with `fh_cache_free` or `fh_cache_finalize`.
///
/// After `fork`, a cache of the parent is quarantined in the child (every call on it returns
/// `FH_ERR_FORKED`; freeing it releases nothing of the parent's): create new caches in the
/// child.
///
/// # Safety
/// `cfg` is NULL or points to an `fh_config` prepared by `fh_config_init`; `cfg->ibv_pd` is NULL or
/// a live `struct ibv_pd *` that outlives the cache. `out` is NULL or valid for one pointer write.
#[no_mangle]
pub unsafe extern "C" fn fh_cache_new(cfg: *const fh_config, out: *mut *mut fh_cache) -> fh_status {
    ffi_guard! {{
        if out.is_null() {
            return fh_status::FH_ERR_NULL;
        }
        // SAFETY: `cfg` and its `ibv_pd` per the contract (NULL from the env path).
        match unsafe { settings(cfg) }.and_then(|(c, fork, clock)| unsafe { build(c, fork, clock) }) {
            Ok(cache) => {
                // SAFETY: non-NULL checked above; writable per the contract.
                unsafe { write_out(out, into_raw(cache)) };
                fh_status::FH_OK
            }
            Err(e) => e,
        }
    }}
}

/// Frees a cache and unpins everything it holds. NULL is fine (no-op).
///
/// Registrations still in use are unpinned too: their keys stop working and their handles become
/// invalid. Use `fh_cache_finalize` to be told instead. The cache must not be used concurrently
/// with or after this call.
///
/// # Safety
/// `cache` is NULL or a pointer from `fh_cache_new` not yet freed.
#[no_mangle]
pub unsafe extern "C" fn fh_cache_free(cache: *mut fh_cache) {
    ffi_guard!(fallback = (); {
        if !cache.is_null() {
            // SAFETY: a live pointer from `fh_cache_new`, never used again by C per the contract.
            drop(unsafe { take_back(cache) });
        }
    })
}

/// Frees a cache only if no registration is in use, else returns `FH_ERR_BUSY` and changes
/// nothing (the cache stays valid). NULL is fine (returns `FH_OK`). Idle cached registrations
/// are unpinned.
///
/// # Safety
/// As `fh_cache_free`.
#[no_mangle]
pub unsafe extern "C" fn fh_cache_finalize(cache: *mut fh_cache) -> fh_status {
    ffi_guard! {{
        // SAFETY: NULL or live per the contract.
        let Some(c) = (unsafe { borrow(cache) }) else {
            return fh_status::FH_OK;
        };
        if c.cache.stats().in_use != 0 {
            return fh_status::FH_ERR_BUSY;
        }
        // SAFETY: live, and C gives up the pointer with this call when it succeeds.
        drop(unsafe { take_back(cache) });
        fh_status::FH_OK
    }}
}
