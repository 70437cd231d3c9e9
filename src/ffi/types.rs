//! Plain C data types and constants of the ABI (everything here is `#[repr(C)]` or a `#define`).

use std::ffi::c_void;

use crate::cache::{Registration, Stats};

/// Access bit: the local HCA may write the memory (same value as `IBV_ACCESS_LOCAL_WRITE`).
pub const FH_ACCESS_LOCAL_WRITE: u32 = 1;
/// Access bit: peers may RDMA-write the memory (same value as `IBV_ACCESS_REMOTE_WRITE`).
pub const FH_ACCESS_REMOTE_WRITE: u32 = 2;
/// Access bit: peers may RDMA-read the memory (same value as `IBV_ACCESS_REMOTE_READ`).
pub const FH_ACCESS_REMOTE_READ: u32 = 4;
/// Access bit: peers may run atomics on the memory (same value as `IBV_ACCESS_REMOTE_ATOMIC`).
pub const FH_ACCESS_REMOTE_ATOMIC: u32 = 8;

/// `fh_config.backend`: verbs if an RDMA device can be opened (or `ibv_pd` is set), else mlock.
pub const FH_BACKEND_AUTO: u32 = 0;
/// `fh_config.backend`: `ibv_reg_mr` in `ibv_pd` (or in a PD of the first device).
pub const FH_BACKEND_VERBS: u32 = 1;
/// `fh_config.backend`: mlock(2) only; keys are local cookies (hosts with no RDMA device, tests).
pub const FH_BACKEND_MLOCK: u32 = 2;

/// `fh_config.monitor` bit: patch the entry of libc's munmap/mremap/madvise/mmap/shmdt/shmat so
/// that libc-internal releases (free, realloc, malloc_trim) invalidate synchronously.
pub const FH_MONITOR_PATCH_LIBC: u32 = 1;
/// `fh_config.monitor` bit: watch pinned mappings with userfaultfd (catches raw syscalls and brk
/// shrink; asynchronous).
pub const FH_MONITOR_USERFAULTFD: u32 = 2;
/// Every `fh_config.monitor` bit this version understands.
pub const FH_MONITOR_ALL: u32 = FH_MONITOR_PATCH_LIBC | FH_MONITOR_USERFAULTFD;

/// One registration as handed to the caller.
///
/// `addr`/`length` are exactly what was asked for (the pinned region may be larger, page-aligned).
/// `handle` is what `fh_deregister` takes back; it is generation-checked, so releasing it twice is
/// `FH_ERR_UNKNOWN_HANDLE`, never a corruption.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct fh_mr {
    pub handle: u64,
    pub addr: *mut c_void,
    pub length: usize,
    pub lkey: u32,
    pub rkey: u32,
}

impl From<Registration> for fh_mr {
    fn from(r: Registration) -> Self {
        fh_mr {
            handle: r.handle,
            addr: r.addr as *mut c_void,
            length: r.len,
            lkey: r.lkey,
            rkey: r.rkey,
        }
    }
}

/// Counters of one cache since it was created. `pinned_bytes`, `regions`, `in_use` are "now";
/// `pinned_peak` is the high-water mark of `pinned_bytes`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct fh_stats {
    /// Registrations served from the cache.
    pub hits: u64,
    /// Registrations that had to pin.
    pub misses: u64,
    /// Idle regions unpinned to respect the limits (or to retry after ENOMEM).
    pub evictions: u64,
    /// Regions dropped because the memory under them went away.
    pub invalidations: u64,
    pub pinned_bytes: u64,
    pub pinned_peak: u64,
    /// Regions pinned now (idle + in use).
    pub regions: u64,
    /// Regions with at least one holder.
    pub in_use: u64,
    /// Pins retried after evicting on ENOMEM.
    pub pin_retries: u64,
    /// Pins that failed for good.
    pub pin_failures: u64,
}

impl From<Stats> for fh_stats {
    fn from(s: Stats) -> Self {
        fh_stats {
            hits: s.hits,
            misses: s.misses,
            evictions: s.evictions,
            invalidations: s.invalidations,
            pinned_bytes: s.pinned_bytes,
            pinned_peak: s.pinned_peak,
            regions: s.regions,
            in_use: s.in_use,
            pin_retries: s.pin_retries,
            pin_failures: s.pin_failures,
        }
    }
}

/// How to build a cache. Always start from `fh_config_init`, then change fields.
///
/// ABI evolution: `struct_size` is set to `sizeof(fh_config)` by `fh_config_init`. Fields are only
/// ever appended. A library reads the prefix the caller's `struct_size` covers and takes defaults
/// for newer fields; a size smaller than the first layout, or larger than the library knows (a
/// newer caller), is `FH_ERR_BAD_CONFIG`, because silently ignoring a setting is worse than failing.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct fh_config {
    /// `sizeof(fh_config)` as the caller compiled it.
    pub struct_size: u32,
    /// `FH_BACKEND_AUTO`, `FH_BACKEND_VERBS` or `FH_BACKEND_MLOCK` (env `FH_BACKEND`).
    pub backend: u32,
    /// Bytes kept pinned at most by lazy release (env `FH_MAX_PINNED`, must be > 0). A single
    /// request larger than this is `FH_ERR_TOO_LARGE`.
    pub max_pinned: usize,
    /// Regions kept at most (env `FH_MAX_REGIONS`; 0 = keep nothing idle). When the bounds leave
    /// no room even after evicting every idle region (everything else is in use, or a bound is 0),
    /// a registration is still made, uncached: pinned for its caller only and unpinned at its
    /// release (counted by `fh_info`'s "uncached" line).
    pub max_regions: usize,
    /// Optional `struct ibv_pd *` of the caller: registrations are then made in that PD, so their
    /// keys work with the caller's QPs. NULL with the verbs backend = open the first device and
    /// use a private PD. Must be NULL with `FH_BACKEND_MLOCK`. Not owned: keep it alive until
    /// the cache is freed.
    pub ibv_pd: *mut c_void,
    /// `FH_MONITOR_*` bits (env `FH_MONITOR`): which memory-release paths invalidate the cache.
    pub monitor: u32,
    /// Reserved, must be 0.
    pub reserved: u32,
    /// `FH_HELPER_OFF` or `FH_HELPER_ON` (env `FH_HELPER`): a helper thread that unpins idle
    /// registrations and pins them again shortly before their predicted next use (Li et al.,
    /// "Scalable Memory Registration for High Performance Networks Using Helper Threads" (CF
    /// 2011)). Added after the first layout: a caller built against it gets the environment's
    /// value.
    pub helper: u32,
    /// Core the helper is bound to, or `FH_HELPER_CPU_AUTO` (env `FH_HELPER_CPU`): then it runs
    /// only when an idle core is there; otherwise it stays off and `fh_info` says why.
    pub helper_cpu: u32,
    /// Registrations shorter than this are not tracked by the helper (env `FH_HELPER_MIN`,
    /// default 16 KiB); must be > 0.
    pub helper_min_bytes: usize,
}

/// `fh_config.helper`: no helper thread (the lazy cache).
pub const FH_HELPER_OFF: u32 = 0;
/// `fh_config.helper`: a helper thread, placed as `helper_cpu` says.
pub const FH_HELPER_ON: u32 = 1;
/// `fh_config.helper_cpu`: run the helper only when an idle core is available (unbound).
pub const FH_HELPER_CPU_AUTO: u32 = u32::MAX;

/// Size of the first published `fh_config` layout (up to `reserved`); smaller `struct_size`
/// values are refused, and the fields after it take the environment's values when a caller's
/// `struct_size` stops there.
pub(crate) const FH_CONFIG_MIN_SIZE: usize = std::mem::offset_of!(fh_config, helper);

/// What the helper thread did (`fh_get_helper_stats`). Times in ns, sizes in bytes. All zero
/// except `state` when the helper is off.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct fh_helper_stats {
    /// 0: off (not asked for, or no idle core: `fh_info` says why), 1: running, 2: stopped.
    pub state: u32,
    /// Core it is bound to, or -1.
    pub cpu: i32,
    /// Predictions made (a use under a signature whose period is learned).
    pub predictions: u64,
    /// Predictions judged (their signature occurred again), and those within 5 % of the
    /// observed period.
    pub predictions_evaluated: u64,
    pub predictions_accurate: u64,
    /// Uses the helper's pin was ready for; uses that came before its planned pin; uses of
    /// regions it had unpinned without a prediction (learning).
    pub early_registrations: u64,
    pub late_registrations: u64,
    pub unpredicted_registrations: u64,
    /// Pins and unpins the helper made; pins that failed or raced with an unmap.
    pub helper_pins: u64,
    pub helper_unpins: u64,
    pub helper_pin_failures: u64,
    /// Tracked registrations (at or above `helper_min_bytes`), those where the caller pinned
    /// itself, the time those callers waited for their pins, and the time all tracked
    /// registrations took.
    pub tracked_registrations: u64,
    pub caller_pins: u64,
    pub caller_pin_wait_ns: u64,
    pub caller_wait_ns: u64,
    /// Pinned bytes averaged over the time the helper ran, and the peak.
    pub avg_pinned_bytes: u64,
    pub peak_pinned_bytes: u64,
    pub elapsed_ns: u64,
    /// Events dropped because the helper's queue was full.
    pub events_dropped: u64,
}
