//! Creating and destroying caches: `fh_cache_new`, `fh_cache_finalize`, `fh_cache_free`.

use std::sync::Arc;

use crate::cache::{Cache, Limits, RangeWatcher};
use crate::helper::{self, Helper, HelperConfig, Placement};
use crate::monitor::{self, MemoryListener, MonitorOptions, UffdWatcher};
use crate::pin::fork_mode;
use crate::status::{fh_status, FhResult};

use super::cache_object::fh_cache;
use super::guard::ffi_guard;
use super::handle::{borrow, into_raw, take_back, write_out};
use super::types::*;
use super::{backend, config};

/// Builds the cache object from a validated config.
///
/// # Safety
/// `cfg.ibv_pd` is NULL or a live `struct ibv_pd *` that outlives the cache.
pub(crate) unsafe fn build(cfg: fh_config) -> FhResult<Arc<fh_cache>> {
    let fork = crate::config::fork_setting_from_env()?;
    let clock = crate::config::helper_clock_from_env()?;
    // SAFETY: forwarded contract on `cfg.ibv_pd`.
    let backend = unsafe { backend::build(cfg.backend, cfg.ibv_pd) }?;
    let fork = fork_mode::resolve(fork, backend.verbs);
    let opts = MonitorOptions {
        patch_libc: cfg.monitor & FH_MONITOR_PATCH_LIBC != 0,
        userfaultfd: cfg.monitor & FH_MONITOR_USERFAULTFD != 0,
    };
    // The monitor is process-wide and idempotent; with no bits set only `fh_notify_unmapped`
    // invalidates. What is really active shows in `fh_info`.
    if opts.patch_libc || opts.userfaultfd {
        monitor::install(opts);
    }
    let watcher: Option<Arc<dyn RangeWatcher>> = if opts.userfaultfd {
        Some(Arc::new(UffdWatcher))
    } else {
        None
    };
    let limits = Limits {
        max_pinned: cfg.max_pinned,
        max_regions: cfg.max_regions,
    };
    let helped = cfg.helper == FH_HELPER_ON;
    let pinner = if helped {
        helper::wrap_backend(backend.pinner)
    } else {
        backend.pinner
    };
    let cache = Cache::new(pinner, limits, watcher);
    cache.set_fork_mode(fork);
    // Always subscribed, so `fh_notify_unmapped` reaches every cache even with no monitor path.
    let subscription = monitor::subscribe(cache.clone() as Arc<dyn MemoryListener>);
    if !subscription.is_active() {
        // No slot left: a cache that is never invalidated would serve stale registrations. It
        // pinned nothing yet, so dropping it releases nothing.
        return Err(fh_status::FH_ERR_TOO_MANY_CACHES);
    }
    let helper = if helped {
        Helper::start(
            &cache,
            HelperConfig {
                placement: if cfg.helper_cpu == FH_HELPER_CPU_AUTO {
                    Placement::Auto
                } else {
                    Placement::Cpu(cfg.helper_cpu as usize)
                },
                min_bytes: cfg.helper_min_bytes,
                clock,
                ..HelperConfig::default()
            },
        )
    } else {
        Helper::off("not asked for (FH_HELPER=0)")
    };
    Ok(Arc::new(fh_cache {
        _subscription: subscription,
        helper,
        cache,
        monitor_requested: cfg.monitor,
        backend_detail: backend.detail,
    }))
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
        let cfg = if cfg.is_null() {
            config::from_env()
        } else {
            // SAFETY: non-NULL, and readable per the contract.
            unsafe { config::read(cfg) }
        };
        // SAFETY: `ibv_pd` contract forwarded from the caller (NULL from the env path).
        match cfg.and_then(|c| unsafe { build(c) }) {
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
