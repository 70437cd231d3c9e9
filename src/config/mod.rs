//! Settings: defaults plus the `FH_*` environment variables.
//!
//! Its own folder, above `helper` and `pin` whose setting types it fills in (`ClockChoice`,
//! `ForkSetting`), below `net`, `rma` and `ffi`, which read it. Owns: the parsing of the `FH_*`
//! variables and their defaults. May call: `helper::clock`, `pin::fork_mode`, `rt`, and
//! `firehose_proto::config::parse_size` (sizes are parsed the same way everywhere).
//!
//! | variable         | values                                   | default                          |
//! |------------------|------------------------------------------|----------------------------------|
//! | `FH_BACKEND`     | `auto`, `verbs`, `mlock`                 | `auto` (verbs if a device works) |
//! | `FH_MAX_PINNED`  | bytes, suffix `k`/`m`/`g`/`t` (x1024), `inf` | 75 % of min(RLIMIT_MEMLOCK (1), RAM) |
//! | `FH_MAX_REGIONS` | count, or `inf`                          | 16384                            |
//! | `FH_MONITOR`     | comma list of `uffd`, `patch`; or `none` | `uffd,patch`                     |
//! | `FH_HELPER`      | `0`/`1` (`off`/`on`, `no`/`yes`)         | `0` (lazy cache, no helper)      |
//! | `FH_HELPER_CPU`  | core number, or `auto`                   | `auto` (only with an idle core)  |
//! | `FH_HELPER_MIN`  | bytes (suffixes as above)                | `16k` (smaller: not tracked)     |
//! | `FH_HELPER_CLOCK`| `auto`, `tsc`, `monotonic`               | `auto` (`helper/clock.rs`)       |
//! | `FH_FORK_MODE`   | `auto`, `keep`, `release`, `retire`      | `auto` (`pin/fork_mode.rs`)      |
//!
//! (1) only when the kernel enforces it: a process with CAP_IPC_LOCK (root) is not limited.
//!
//! An invalid value is [`BadConfig`] (`FH_ERR_BAD_CONFIG` at the C API), with a message naming
//! the variable on stderr.

use crate::helper::clock::ClockChoice;
use crate::pin::fork_mode::{self, ForkSetting};

/// Which pinning backend to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// verbs when an RDMA device can be opened, else mlock.
    Auto,
    Verbs,
    Mlock,
}

/// Which memory-event sources the monitor installs (`FH_MONITOR`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MonitorFlags {
    /// Patch the entry of libc's unmap-family functions (sees glibc-internal calls, synchronously).
    pub patch_libc: bool,
    /// userfaultfd UNMAP/REMOVE/REMAP events (sees raw syscalls; asynchronous).
    pub userfaultfd: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    pub backend: Backend,
    /// Default: 75 % of min(RLIMIT_MEMLOCK if finite and enforced (not with CAP_IPC_LOCK),
    /// physical memory) -- GASNet firehose's
    /// M = 75 %: leaves a quarter of lockable memory to the application and other libraries, and
    /// makes ENOMEM from the kernel (which costs a failed pin) the exception rather than the rule.
    pub max_pinned: usize,
    /// Default 16384: keeps cache metadata small (~2.5 MiB at ~160 bytes per region all told),
    /// stays far below the MR tables of common HCAs and Soft-RoCE, and is 16x libfabric's 1024
    /// default, which MPI codes with many peers and buffers were seen to thrash.
    pub max_regions: usize,
    pub monitor: MonitorFlags,
    pub helper: HelperSettings,
    /// What caches do around a `fork` (`pin/fork_mode.rs`). Read from the environment only: the
    /// C `fh_config` has no field for it.
    pub fork: ForkSetting,
}

pub(crate) const DEFAULT_MAX_REGIONS: usize = 16384;

/// The helper thread (Li et al., "Scalable Memory Registration for High Performance Networks Using
/// Helper Threads" (CF 2011); `crate::helper`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelperSettings {
    /// `FH_HELPER`: off by default (the lazy cache as before).
    pub enabled: bool,
    /// `FH_HELPER_CPU`: `None` = run only when an idle core is there (the paper's conservative
    /// policy); `Some(n)`: bound to core `n`, if the affinity mask has it.
    pub cpu: Option<usize>,
    /// `FH_HELPER_MIN`: registrations shorter than this are left to the lazy cache (the paper's
    /// 16 KiB: below it, tracking costs more than a pin saved).
    pub min_bytes: usize,
    /// `FH_HELPER_CLOCK`: the helper's time source (`helper/clock.rs`).
    pub clock: ClockChoice,
}

impl Default for HelperSettings {
    fn default() -> Self {
        HelperSettings {
            enabled: false,
            cpu: None,
            min_bytes: 16 << 10,
            clock: ClockChoice::Auto,
        }
    }
}

/// A bad variable: its name and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub var: &'static str,
    pub msg: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "firehose: invalid {}: {}", self.var, self.msg)
    }
}

/// An invalid setting, already reported (the variable and why) on stderr. Plain, to be returned
/// by the `from_env` readers without allocating; the C API returns `FH_ERR_BAD_CONFIG` for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BadConfig;

impl std::fmt::Display for BadConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("invalid configuration value")
    }
}

impl std::error::Error for BadConfig {}

impl std::error::Error for ConfigError {}

impl Default for Config {
    fn default() -> Self {
        Config {
            backend: Backend::Auto,
            max_pinned: default_max_pinned(),
            max_regions: DEFAULT_MAX_REGIONS,
            monitor: MonitorFlags {
                patch_libc: true,
                userfaultfd: true,
            },
            helper: HelperSettings::default(),
            fork: ForkSetting::Auto,
        }
    }
}

impl Config {
    /// Defaults overridden by the process environment. Prints the reason to stderr on error.
    pub fn from_env() -> Result<Config, BadConfig> {
        Self::from_lookup(|k| std::env::var(k).ok()).map_err(|e| {
            crate::fh_error!("{e}");
            BadConfig
        })
    }

    /// Defaults overridden by whatever `get` returns for each `FH_*` name (testable core).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let mut c = Config::default();
        if let Some(v) = get("FH_BACKEND") {
            c.backend = parse_backend(&v).ok_or_else(|| ConfigError {
                var: "FH_BACKEND",
                msg: format!("{v:?} is not one of auto, verbs, mlock"),
            })?;
        }
        if let Some(v) = get("FH_MAX_PINNED") {
            c.max_pinned = parse_size(&v)
                .filter(|&n| n > 0)
                .ok_or_else(|| ConfigError {
                    var: "FH_MAX_PINNED",
                    msg: format!("{v:?} is not a positive byte count (e.g. 512m, 4g, inf)"),
                })?;
        }
        if let Some(v) = get("FH_MAX_REGIONS") {
            c.max_regions = parse_count(&v)
                .filter(|&n| n > 0)
                .ok_or_else(|| ConfigError {
                    var: "FH_MAX_REGIONS",
                    msg: format!("{v:?} is not a positive count or inf"),
                })?;
        }
        if let Some(v) = get("FH_MONITOR") {
            c.monitor = parse_monitor(&v).ok_or_else(|| ConfigError {
                var: "FH_MONITOR",
                msg: format!("{v:?} is not `none` or a comma list of uffd, patch"),
            })?;
        }
        if let Some(v) = get("FH_HELPER") {
            c.helper.enabled = parse_bool(&v).ok_or_else(|| ConfigError {
                var: "FH_HELPER",
                msg: format!("{v:?} is not 0/1, off/on, no/yes"),
            })?;
        }
        if let Some(v) = get("FH_HELPER_CPU") {
            c.helper.cpu = parse_cpu(&v).ok_or_else(|| ConfigError {
                var: "FH_HELPER_CPU",
                msg: format!("{v:?} is not `auto` or a core number below {MAX_CPU}"),
            })?;
        }
        if let Some(v) = get("FH_HELPER_MIN") {
            c.helper.min_bytes = parse_size(&v)
                .filter(|&n| n > 0)
                .ok_or_else(|| ConfigError {
                    var: "FH_HELPER_MIN",
                    msg: format!("{v:?} is not a positive byte count (e.g. 16k)"),
                })?;
        }
        if let Some(v) = get("FH_HELPER_CLOCK") {
            c.helper.clock = parse_clock(&v)?;
        }
        if let Some(v) = get("FH_FORK_MODE") {
            c.fork = parse_fork(&v)?;
        }
        Ok(c)
    }
}

fn parse_fork(v: &str) -> Result<ForkSetting, ConfigError> {
    fork_mode::parse(v).ok_or_else(|| ConfigError {
        var: "FH_FORK_MODE",
        msg: format!("{v:?} is not one of auto, keep, release, retire"),
    })
}

fn parse_clock(v: &str) -> Result<ClockChoice, ConfigError> {
    ClockChoice::parse(v).ok_or_else(|| ConfigError {
        var: "FH_HELPER_CLOCK",
        msg: format!("{v:?} is not one of auto, tsc, monotonic"),
    })
}

/// One environment variable read alone (settings `fh_config` has no field for): its parsed
/// value, `default` when unset, [`BadConfig`] with the reason on stderr when invalid.
fn one_from_env<T>(
    var: &str,
    parse: impl Fn(&str) -> Result<T, ConfigError>,
    default: T,
) -> Result<T, BadConfig> {
    match std::env::var(var) {
        Ok(v) => parse(&v).map_err(|e| {
            crate::fh_error!("{e}");
            BadConfig
        }),
        Err(_) => Ok(default),
    }
}

/// `FH_HELPER_CLOCK` alone (`fh_config` has no field for it).
pub fn helper_clock_from_env() -> Result<ClockChoice, BadConfig> {
    one_from_env("FH_HELPER_CLOCK", parse_clock, ClockChoice::Auto)
}

/// `FH_FORK_MODE` alone (a cache made from an explicit `fh_config` still follows it).
pub(crate) fn fork_setting_from_env() -> Result<ForkSetting, BadConfig> {
    one_from_env("FH_FORK_MODE", parse_fork, ForkSetting::Auto)
}

fn parse_backend(v: &str) -> Option<Backend> {
    match v.trim().to_ascii_lowercase().as_str() {
        "auto" => Some(Backend::Auto),
        "verbs" => Some(Backend::Verbs),
        "mlock" => Some(Backend::Mlock),
        _ => None,
    }
}

/// `123`, `64k`, `512M`, `4g`, `1t` (binary multiples), `inf`/`unlimited` -> usize::MAX. Shared
/// with the Firehose core's settings, which parse the same sizes without depending on this crate.
pub use firehose_proto::config::parse_size;

/// Cores a `cpu_set_t` can name (glibc's CPU_SETSIZE).
pub(crate) const MAX_CPU: usize = 1024;

fn parse_bool(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "on" | "yes" | "true" => Some(true),
        "0" | "off" | "no" | "false" => Some(false),
        _ => None,
    }
}

/// `auto` -> `Some(None)`; a core number below `MAX_CPU` -> `Some(Some(n))`.
fn parse_cpu(v: &str) -> Option<Option<usize>> {
    let v = v.trim().to_ascii_lowercase();
    if v == "auto" {
        return Some(None);
    }
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok().filter(|&n| n < MAX_CPU).map(Some)
}

fn parse_count(v: &str) -> Option<usize> {
    let v = v.trim().to_ascii_lowercase();
    if v == "inf" || v == "unlimited" {
        return Some(usize::MAX);
    }
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok()
}

fn parse_monitor(v: &str) -> Option<MonitorFlags> {
    let mut f = MonitorFlags {
        patch_libc: false,
        userfaultfd: false,
    };
    let v = v.trim().to_ascii_lowercase();
    if v == "none" {
        return Some(f);
    }
    for tok in v.split(',').map(str::trim) {
        match tok {
            "uffd" | "userfaultfd" => f.userfaultfd = true,
            "patch" | "libc" => f.patch_libc = true,
            _ => return None,
        }
    }
    Some(f)
}

/// 75 % of min(RLIMIT_MEMLOCK if finite, physical memory).
pub(crate) fn default_max_pinned() -> usize {
    // SAFETY: sysconf has no preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let phys = if pages > 0 && page > 0 {
        (pages as usize).saturating_mul(page as usize)
    } else {
        usize::MAX
    };
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `rl` is a valid out-pointer.
    let memlock = if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) } == 0
        && rl.rlim_cur != libc::RLIM_INFINITY
        && !has_cap_ipc_lock()
    {
        rl.rlim_cur as usize
    } else {
        usize::MAX
    };
    let base = phys.min(memlock);
    (base / 4 * 3).max(1)
}

/// True when the process holds CAP_IPC_LOCK (e.g. root): the kernel then does not charge pinning
/// (mlock or ibv_reg_mr) against RLIMIT_MEMLOCK, so the 8 MiB soft limit must not size the cache.
/// (Under mpirun as root, a default taken from the rlimit left no room beyond UCX's own pools.)
fn has_cap_ipc_lock() -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn default_max_pinned_ignores_memlock_rlimit_with_cap_ipc_lock() {
        // Root here has CAP_IPC_LOCK and an 8 MiB soft RLIMIT_MEMLOCK: the default must then come
        // from physical memory, not from the rlimit the kernel does not apply.
        if super::has_cap_ipc_lock() {
            assert!(super::default_max_pinned() > 64 << 20);
        }
    }

    use super::*;
    use std::collections::HashMap;

    fn with(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("123"), Some(123));
        assert_eq!(parse_size("64k"), Some(64 << 10));
        assert_eq!(parse_size("512M"), Some(512 << 20));
        assert_eq!(parse_size(" 4g "), Some(4 << 30));
        assert_eq!(parse_size("1t"), Some(1 << 40));
        assert_eq!(parse_size("INF"), Some(usize::MAX));
        assert_eq!(parse_size("99999999999999999999g"), None, "overflow");
        for bad in ["", "k", "-1", "1.5g", "12x", "g12", "0x10"] {
            assert_eq!(parse_size(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn defaults_and_overrides() {
        let d = with(&[]).unwrap();
        assert_eq!(d.backend, Backend::Auto);
        assert_eq!(d.max_regions, DEFAULT_MAX_REGIONS);
        assert!(d.max_pinned > 0 && d.max_pinned == default_max_pinned());
        assert!(d.monitor.patch_libc && d.monitor.userfaultfd);
        let c = with(&[
            ("FH_BACKEND", "MLOCK"),
            ("FH_MAX_PINNED", "8m"),
            ("FH_MAX_REGIONS", "100"),
            ("FH_MONITOR", "uffd"),
        ])
        .unwrap();
        assert_eq!(c.backend, Backend::Mlock);
        assert_eq!(c.max_pinned, 8 << 20);
        assert_eq!(c.max_regions, 100);
        assert_eq!(
            c.monitor,
            MonitorFlags {
                patch_libc: false,
                userfaultfd: true
            }
        );
        let n = with(&[("FH_MONITOR", "none"), ("FH_MAX_REGIONS", "inf")]).unwrap();
        assert!(!n.monitor.patch_libc && !n.monitor.userfaultfd);
        assert_eq!(n.max_regions, usize::MAX);
        let p = with(&[("FH_MONITOR", "patch, uffd")]).unwrap();
        assert!(p.monitor.patch_libc && p.monitor.userfaultfd);
        assert_eq!(d.helper, HelperSettings::default());
        assert!(!d.helper.enabled);
        let h = with(&[
            ("FH_HELPER", "on"),
            ("FH_HELPER_CPU", "1"),
            ("FH_HELPER_MIN", "64k"),
            ("FH_HELPER_CLOCK", "TSC"),
        ])
        .unwrap();
        assert_eq!(
            h.helper,
            HelperSettings {
                enabled: true,
                cpu: Some(1),
                min_bytes: 64 << 10,
                clock: ClockChoice::Tsc,
            }
        );
        let a = with(&[("FH_HELPER", "0"), ("FH_HELPER_CPU", "AUTO")]).unwrap();
        assert!(!a.helper.enabled && a.helper.cpu.is_none());
        assert_eq!(d.fork, ForkSetting::Auto);
        let f = with(&[("FH_FORK_MODE", "Retire")]).unwrap();
        assert_eq!(
            f.fork,
            ForkSetting::Fixed(crate::pin::fork_mode::ForkMode::Retire)
        );
    }

    #[test]
    fn errors_name_the_variable() {
        for (var, val) in [
            ("FH_BACKEND", "ibverbs"),
            ("FH_MAX_PINNED", "lots"),
            ("FH_MAX_PINNED", "0"),
            ("FH_MAX_REGIONS", "-3"),
            ("FH_MAX_REGIONS", "0"),
            ("FH_MONITOR", "uffd,ptrace"),
            ("FH_MONITOR", ""),
            ("FH_HELPER", "2"),
            ("FH_HELPER", "maybe"),
            ("FH_HELPER_CPU", "-1"),
            ("FH_HELPER_CPU", "1024"),
            ("FH_HELPER_CPU", "x"),
            ("FH_HELPER_MIN", "0"),
            ("FH_HELPER_CLOCK", "rdtsc"),
            ("FH_FORK_MODE", "flush"),
        ] {
            let e = with(&[(var, val)]).unwrap_err();
            assert_eq!(e.var, var);
            assert!(e.to_string().contains(var));
        }
    }

    #[test]
    fn default_respects_a_finite_enforced_memlock() {
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) }, 0);
        if rl.rlim_cur != libc::RLIM_INFINITY && !super::has_cap_ipc_lock() {
            assert!(default_max_pinned() <= rl.rlim_cur as usize / 4 * 3);
        }
    }
}
