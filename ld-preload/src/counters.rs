//! The shim's process-wide counters (a leaf: the hooks and the backend bump them; `stats.rs`
//! reads them for `fh_preload_stats` and the `FH_STATS` summary).

use std::sync::atomic::{AtomicU64, Ordering};

/// Process-wide counters (relaxed atomics: they are statistics, not synchronisation).
pub(crate) struct Counters {
    /// Outermost application calls to any `ibv_reg_mr*` hook.
    pub app_reg_calls: AtomicU64,
    /// Calls that found this thread already inside a hook and went straight through.
    pub nested_calls: AtomicU64,
    /// Application registrations handed to libibverbs uncached (flags, iova, disabled, errors).
    pub passthrough_reg: AtomicU64,
    /// `ibv_dereg_mr` / `ibv_rereg_mr` of MRs the shim did not create.
    pub passthrough_dereg: AtomicU64,
    /// `ibv_dereg_mr` / `ibv_rereg_mr` of a wrapper already deregistered (or being deregistered
    /// by another thread): refused with EINVAL.
    pub stale_dereg: AtomicU64,
    /// Real registrations the caches made (misses), their total time, and the same for unpins.
    pub real_regs: AtomicU64,
    pub real_reg_ns: AtomicU64,
    pub real_deregs: AtomicU64,
    pub real_dereg_ns: AtomicU64,
    /// Bytes the caches hold pinned now, and the high mark (across every protection domain).
    pub pinned_now: AtomicU64,
    pub pinned_peak: AtomicU64,
    /// Bytes of application registrations served without a real registration.
    pub hit_bytes: AtomicU64,
}

pub(crate) static COUNTERS: Counters = Counters {
    app_reg_calls: AtomicU64::new(0),
    nested_calls: AtomicU64::new(0),
    passthrough_reg: AtomicU64::new(0),
    passthrough_dereg: AtomicU64::new(0),
    stale_dereg: AtomicU64::new(0),
    real_regs: AtomicU64::new(0),
    real_reg_ns: AtomicU64::new(0),
    real_deregs: AtomicU64::new(0),
    real_dereg_ns: AtomicU64::new(0),
    pinned_now: AtomicU64::new(0),
    pinned_peak: AtomicU64::new(0),
    hit_bytes: AtomicU64::new(0),
};

#[inline]
pub(crate) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Account `len` newly pinned bytes and keep the high mark.
pub(crate) fn pinned_add(len: u64) {
    let now = COUNTERS.pinned_now.fetch_add(len, Ordering::Relaxed) + len;
    COUNTERS.pinned_peak.fetch_max(now, Ordering::Relaxed);
}

pub(crate) fn pinned_sub(len: u64) {
    COUNTERS.pinned_now.fetch_sub(len, Ordering::Relaxed);
}
