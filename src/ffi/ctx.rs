//! The peers context: `fh_init`, `fh_rank`, `fh_size`, `fh_barrier`, `fh_progress`,
//! `fh_finalize`, `fh_get_net_stats`. Thin: everything happens in `net::Peers`.

use std::ffi::{c_char, CStr};
use std::sync::Arc;

use crate::ffi::status::fh_status;
use crate::net::bootstrap::CallbackBootstrap;
use crate::net::{Peers, PeersConfig};
use crate::rma::Rma;

use super::bootstrap_ops::fh_bootstrap_ops;
use super::cache_object::fh_cache;
use super::guard::{ffi_guard, status_of};
use super::handle::{borrow, into_raw, take_back, write_out};
use super::types::FH_BACKEND_VERBS;
use super::{config, lifecycle};

/// A job's peers and puts/gets to them (Firehose). Opaque: create with `fh_init`, free with
/// `fh_finalize`. Every call may come from any thread concurrently, except `fh_finalize`.
// Field order is drop order: the local cache's monitor subscription goes first (no hook may
// reach the cache while it unpins), then the puts/gets (their registrations), then the peers.
pub struct fh_ctx {
    /// The pin-down cache for the caller's buffers (`None` in a job of one).
    pub(crate) _local: Option<Arc<fh_cache>>,
    pub(crate) rma: Arc<Rma>,
    pub(crate) peers: Arc<Peers>,
    /// `fork::generation()` at `fh_init`: another value means this is a forked child's copy.
    fork_gen: u64,
}

/// `ctx` as a context this process may use: `FH_ERR_NULL` for NULL; `FH_ERR_FORKED` in a child
/// forked after `fh_init`, where the context's connections, threads and locks are the parent's
/// (a parent thread may have held one of its locks at the fork, and a message sent from here
/// would go out on the parent's queue pairs).
///
/// # Safety
/// `ctx` is NULL or a live context from `fh_init`.
pub(crate) unsafe fn here<'a>(ctx: *const fh_ctx) -> Result<&'a fh_ctx, fh_status> {
    // SAFETY: per the contract.
    let c = unsafe { borrow(ctx) }.ok_or(fh_status::FH_ERR_NULL)?;
    if c.fork_gen != crate::rt::fork::generation() {
        return Err(fh_status::FH_ERR_FORKED);
    }
    Ok(c)
}

/// How `fh_init` bootstraps. Zero-initialise it, then set what you need; passing NULL to
/// `fh_init` is the same as all zeros.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fh_init_config {
    /// NULL: from the environment (`FH_BOOTSTRAP`; PMIx when started by `mpirun`, else a job of
    /// one process). Non-NULL: the host runtime's own collectives (read during `fh_init`; the
    /// callbacks must stay callable until `fh_finalize`).
    pub bootstrap: *const fh_bootstrap_ops,
    /// RDMA device name, NULL: `FH_DEVICE`, else the first device. Unused for a job of one.
    pub device: *const c_char,
    /// HCA port, 0: `FH_IB_PORT`, else 1.
    pub port: u8,
}

/// Active-message counters of a context since `fh_init`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct fh_net_stats {
    /// Messages sent / received (requests, replies, one-way, credit-only and bye together).
    pub msgs_sent: u64,
    pub msgs_received: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Sends queued because the peer had no free receive slot for us (no credit).
    pub credit_stalls: u64,
    /// Credit-only messages sent (credits returned without a payload to ride on).
    pub credit_messages: u64,
    /// Times the progress thread woke up.
    pub progress_wakeups: u64,
    /// Messages from peers rejected as malformed, unknown, stale or after finalize.
    pub rejected: u64,
    /// Peers whose connection was lost.
    pub peers_lost: u64,
    /// Of those, live peers this rank gave up on: silent past `FH_AM_TIMEOUT_MS` in a wait or
    /// a revocation, or over `FH_AM_MAX_QUEUED`.
    pub peers_given_up: u64,
    /// Of those, peers given up on because the messages queued for them (waiting for credits
    /// they did not give back) passed `FH_AM_MAX_QUEUED`.
    pub queue_overflows: u64,
    /// Events (messages, completions) the progress thread handled itself. An application
    /// thread waiting on its own puts and gets handles their completions; this counts what it
    /// left to the thread (requests from peers, and completions while nobody waited).
    pub progress_thread_events: u64,
}

impl From<&crate::net::stats::StatsSnapshot> for fh_net_stats {
    fn from(s: &crate::net::stats::StatsSnapshot) -> Self {
        fh_net_stats {
            msgs_sent: s.sent_msgs.iter().sum(),
            msgs_received: s.recv_msgs.iter().sum(),
            bytes_sent: s.sent_bytes.iter().sum(),
            bytes_received: s.recv_bytes.iter().sum(),
            credit_stalls: s.credit_stalls,
            credit_messages: s.credit_only_sent(),
            progress_wakeups: s.progress_wakeups,
            rejected: s.rejected_total(),
            peers_lost: s.peers_lost,
            peers_given_up: s.peers_given_up,
            queue_overflows: s.queue_overflows,
            progress_thread_events: s.progress_thread_events,
        }
    }
}

/// Builds the context.
///
/// # Safety
/// `cfg` is NULL or readable; its pointers are NULL or valid as documented on `fh_init_config`.
unsafe fn build(cfg: Option<&fh_init_config>) -> Result<fh_ctx, fh_status> {
    // The fork handlers count forks from here on (see `here`).
    crate::rt::fork::ensure_handlers();
    let fork_gen = crate::rt::fork::generation();
    let mut pc = PeersConfig::from_env()?;
    pc.defer_progress = true;
    if let Some(cfg) = cfg {
        // SAFETY: per the contract, `bootstrap` is NULL or points to a readable ops struct.
        if let Some(ops) = unsafe { cfg.bootstrap.as_ref() } {
            // SAFETY: the callbacks and ctx are valid until fh_finalize (documented contract).
            let b = unsafe { CallbackBootstrap::new((*ops).into()) }.map_err(fh_status::from)?;
            pc.bootstrap = Some(Box::new(b));
        }
        if !cfg.device.is_null() {
            // SAFETY: non-NULL, a NUL-terminated string per the contract.
            let name = unsafe { CStr::from_ptr(cfg.device) };
            let name = name.to_str().map_err(|_| fh_status::FH_ERR_BAD_CONFIG)?;
            pc.device = Some(name.to_owned());
        }
        if cfg.port != 0 {
            pc.port = cfg.port;
        }
    }
    let peers = Arc::new(Peers::new(pc)?);
    // The caller's buffers are registered on the link's protection domain, through a pin-down
    // cache with the usual FH_* settings (its monitor keeps freed buffers from staying cached).
    let local = match peers.pd() {
        Some(pd) => {
            let c = crate::config::Config::from_env()?;
            let mut cc = config::from_config(&c);
            cc.backend = FH_BACKEND_VERBS;
            cc.ibv_pd = pd.as_raw().cast();
            // SAFETY: the PD outlives the cache: `fh_ctx` drops the cache before the peers.
            Some(unsafe { lifecycle::build(cc, c.fork, c.helper.clock) }?)
        }
        None => None,
    };
    let rma = Rma::new(peers.clone(), local.as_ref().map(|c| c.cache.clone()))?;
    // Only now: the Firehose handlers exist, so nothing the thread delivers is lost.
    peers.start_progress()?;
    Ok(fh_ctx {
        _local: local,
        rma,
        peers,
        fork_gen,
    })
}

/// Joins the job: bootstraps (PMIx under `mpirun`, the host's collectives from `cfg`, or a job of
/// one), connects to every peer and returns the context in `*out`. Collective: every rank calls
/// it. `cfg` may be NULL. Errors: `FH_ERR_NULL` (`out`), `FH_ERR_BAD_CONFIG`,
/// `FH_ERR_BOOTSTRAP`, `FH_ERR_NO_DEVICE` (some rank could not open its device: every rank gets
/// it); `*out` is written only on success.
///
/// # Safety
/// `cfg` is NULL or points to a readable `fh_init_config`; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn fh_init(cfg: *const fh_init_config, out: *mut *mut fh_ctx) -> fh_status {
    ffi_guard! {{
        if out.is_null() {
            return fh_status::FH_ERR_NULL;
        }
        // SAFETY: NULL or readable, per the contract.
        match unsafe { build(cfg.as_ref()) } {
            Ok(ctx) => {
                // SAFETY: non-NULL checked above; writable per the contract.
                unsafe { write_out(out, into_raw(Arc::new(ctx))) };
                fh_status::FH_OK
            }
            Err(e) => e,
        }
    }}
}

/// This process's rank, `0..fh_size(ctx)`; `UINT32_MAX` for a NULL context.
///
/// # Safety
/// `ctx` is NULL or a live context from `fh_init`.
#[no_mangle]
pub unsafe extern "C" fn fh_rank(ctx: *const fh_ctx) -> u32 {
    ffi_guard!(fallback = u32::MAX; {
        // SAFETY: per the contract.
        unsafe { borrow(ctx) }.map_or(u32::MAX, |c| c.peers.rank())
    })
}

/// Number of ranks in the job; 0 for a NULL context.
///
/// # Safety
/// `ctx` is NULL or a live context from `fh_init`.
#[no_mangle]
pub unsafe extern "C" fn fh_size(ctx: *const fh_ctx) -> u32 {
    ffi_guard!(fallback = 0; {
        // SAFETY: per the contract.
        unsafe { borrow(ctx) }.map_or(0, |c| c.peers.size())
    })
}

/// Returns once every rank has entered the barrier; answers peers' requests while waiting.
/// `FH_ERR_PEER_LOST` if a rank died, `FH_ERR_TIMEOUT` after `FH_AM_TIMEOUT_MS`,
/// `FH_ERR_FINALIZED` after `fh_finalize` began.
///
/// # Safety
/// `ctx` is NULL or a live context from `fh_init`.
#[no_mangle]
pub unsafe extern "C" fn fh_barrier(ctx: *mut fh_ctx) -> fh_status {
    ffi_guard! {{
        // SAFETY: per the contract.
        match unsafe { here(ctx) } {
            Err(e) => e,
            Ok(c) => status_of(c.peers.barrier()),
        }
    }}
}

/// Runs the handlers of whatever arrived and sends what credits allow. Never blocks. Call it
/// from compute loops when `FH_PROGRESS_THREAD` is off.
///
/// # Safety
/// `ctx` is NULL or a live context from `fh_init`.
#[no_mangle]
pub unsafe extern "C" fn fh_progress(ctx: *mut fh_ctx) -> fh_status {
    ffi_guard! {{
        // SAFETY: per the contract.
        match unsafe { here(ctx) } {
            Err(e) => e,
            Ok(c) => status_of(c.peers.progress().map(drop)),
        }
    }}
}

/// Copies the context's message counters into `*out` (written only on success).
///
/// # Safety
/// `ctx` is NULL or a live context; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn fh_get_net_stats(ctx: *const fh_ctx, out: *mut fh_net_stats) -> fh_status {
    ffi_guard! {{
        // SAFETY: per the contract.
        let c = match unsafe { here(ctx) } {
            Ok(c) => c,
            Err(e) => return e,
        };
        if out.is_null() {
            return fh_status::FH_ERR_NULL;
        }
        let v = fh_net_stats::from(&c.peers.am().stats());
        // SAFETY: non-NULL checked; writable per the contract.
        unsafe { write_out(out, v) };
        fh_status::FH_OK
    }}
}

/// Leaves the job: says goodbye to every peer (best effort, bounded by `FH_AM_PROBE_MS`), stops
/// the progress thread, disconnects and frees the context. Not collective: a rank may leave
/// while others still run (they see `FH_ERR_PEER_LOST` for it). NULL is fine (nothing happens).
/// The context must not be used by any thread after this call. In a child forked after
/// `fh_init` the context is the parent's: this touches nothing of it and returns `FH_OK` (every
/// other call on it there returns `FH_ERR_FORKED`).
///
/// # Safety
/// `ctx` is NULL or a live context from `fh_init`, not used after this call.
#[no_mangle]
pub unsafe extern "C" fn fh_finalize(ctx: *mut fh_ctx) -> fh_status {
    ffi_guard! {{
        if ctx.is_null() {
            return fh_status::FH_OK;
        }
        // SAFETY: non-NULL, from fh_init, not used again per the contract.
        let c = unsafe { take_back(ctx) };
        if c.fork_gen != crate::rt::fork::generation() {
            // A forked child's copy: its connections and threads are the parent's (a goodbye
            // from here would go out on the parent's queue pairs, and its threads are not here
            // to join). Nothing of it is touched; its memory stays.
            std::mem::forget(c);
            return fh_status::FH_OK;
        }
        let r = c.peers.finalize();
        drop(c);
        status_of(r)
    }}
}
