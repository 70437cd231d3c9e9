//! `FH_*` settings of the shim, read once in the constructor.
//!
//! - `FH_DISABLE=1`: every hook passes straight through (no cache, no monitor, no wrappers).
//! - `FH_STATS=1`: a one-screen summary at exit, to a duplicate of stderr taken at start-up (the
//!   application may close fd 2 first), or to `FH_STATS_FILE` (appended) when set.
//! - `FH_BYPASS=auto|off`: pass registrations that almost never come back straight through
//!   (`bypass.rs`); `off` always caches.
//! - `FH_STATS_SAMPLE=N`: with `FH_STATS`, one hit in N (default 256, 0: none) is re-registered
//!   for real, timed, to price hits (`cost_model.rs`).
//! - `FH_TEST_NO_INVALIDATE=1` (tests only): no monitor, no notifications, so stale-registration
//!   tests can be shown to fail.
//! - Cache limits and `FH_MONITOR` come from the library's own `FH_*` variables; without
//!   `FH_MONITOR`, libc patching is skipped next to other memory hookers (`coexist.rs`).
//!
//! Hooks read only the atomics below: they may run before the constructor (then the defaults,
//! "enabled", apply), and must not allocate.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::OnceLock;

use firehose::internals::config::Config;

static DISABLED: AtomicBool = AtomicBool::new(false);
static NO_INVALIDATE: AtomicBool = AtomicBool::new(false);
static STATS_FD: AtomicI32 = AtomicI32::new(-1);
static MONITOR_EXPLICIT: AtomicBool = AtomicBool::new(false);

/// Descriptors at or above this are unlikely to be closed by an application's fd sweep.
const STATS_FD_MIN: i32 = 500;

/// True when `FH_DISABLE` asks for pure pass-through.
#[inline]
pub(crate) fn disabled() -> bool {
    DISABLED.load(Ordering::Relaxed)
}

/// True when memory events should reach the caches.
#[inline]
pub(crate) fn invalidation_enabled() -> bool {
    !NO_INVALIDATE.load(Ordering::Relaxed) && !disabled()
}

/// True when `FH_MONITOR` was set: then it is obeyed even next to other memory hookers
/// (see `coexist.rs`).
pub(crate) fn monitor_explicit() -> bool {
    MONITOR_EXPLICIT.load(Ordering::Relaxed)
}

/// Where the exit summary goes (`None` without `FH_STATS`).
pub(crate) fn stats_fd() -> Option<i32> {
    let fd = STATS_FD.load(Ordering::Relaxed);
    (fd >= 0).then_some(fd)
}

/// Stop reporting from this process (a forked child: its counters are its parent's copy).
/// The descriptor stays open (close-on-exec, harmless).
pub(crate) fn forget_stats_fd() {
    STATS_FD.store(-1, Ordering::Relaxed);
}

/// "1", "yes", "true", "on" (any case) are true; unset, empty or anything else is false.
pub(crate) fn truthy(v: Option<&str>) -> bool {
    matches!(
        v.map(|s| s.trim().to_ascii_lowercase()).as_deref(),
        Some("1" | "yes" | "true" | "on")
    )
}

fn env_flag(name: &str) -> bool {
    truthy(std::env::var(name).ok().as_deref())
}

static CONFIG: OnceLock<Config> = OnceLock::new();

/// The library's own settings (`FH_MAX_PINNED`, `FH_MAX_REGIONS`, `FH_MONITOR`...). An invalid
/// value is reported once (by the parser, through the library's log) and the defaults apply.
pub(crate) fn config() -> Config {
    *CONFIG.get_or_init(|| {
        Config::from_env()
            .or_else(|_| Config::from_lookup(|_| None).map_err(|_| ()))
            .expect("the defaults are valid")
    })
}

/// Read the environment and open the stats descriptor. Called once from the constructor.
pub(crate) fn load() {
    let _ = config();
    MONITOR_EXPLICIT.store(std::env::var_os("FH_MONITOR").is_some(), Ordering::Relaxed);
    DISABLED.store(env_flag("FH_DISABLE"), Ordering::Relaxed);
    NO_INVALIDATE.store(env_flag("FH_TEST_NO_INVALIDATE"), Ordering::Relaxed);
    // The host unit tests share one process and its bypass counters across tests on fake
    // domains (a bypassed one would reach the real libibverbs): there it is off unless a test
    // turns it on (`bypass::reset` then `set_enabled(true)`).
    let bypass = bypass_setting(std::env::var("FH_BYPASS").ok().as_deref());
    crate::bypass::set_enabled(bypass && !cfg!(test));
    if let Some(n) = sample_setting(std::env::var("FH_STATS_SAMPLE").ok().as_deref()) {
        crate::cost_model::set_sample_every(n);
    }
    if env_flag("FH_STATS") && !disabled() {
        STATS_FD.store(open_stats_fd(), Ordering::Relaxed);
    }
}

/// `FH_BYPASS`: `auto` (or unset, empty) adapts; `off`/`0`/`no`/`false` always caches. Anything
/// else is reported once and `auto` applies.
fn bypass_setting(v: Option<&str>) -> bool {
    match v.map(|s| s.trim().to_ascii_lowercase()).as_deref() {
        None | Some("" | "auto") => true,
        Some("off" | "0" | "no" | "false") => false,
        Some(other) => {
            firehose::fh_warn!("firehose-preload: FH_BYPASS={other:?} is not auto or off: auto");
            true
        }
    }
}

/// `FH_STATS_SAMPLE`: sample one hit in N (0: none). `None` (the default applies) when unset or
/// invalid (reported once).
fn sample_setting(v: Option<&str>) -> Option<u64> {
    let v = v?.trim();
    if v.is_empty() {
        return None;
    }
    match v.parse::<u64>() {
        Ok(n) => Some(n),
        Err(_) => {
            firehose::fh_warn!(
                "firehose-preload: FH_STATS_SAMPLE={v:?} is not a count: the default applies"
            );
            None
        }
    }
}

fn open_stats_fd() -> i32 {
    let src = match std::env::var_os("FH_STATS_FILE") {
        Some(path) if !path.is_empty() => {
            let Ok(c) =
                std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()))
            else {
                return -1;
            };
            // SAFETY: `c` is NUL-terminated; the descriptor is ours and closed just below.
            let fd = unsafe {
                libc::open(
                    c.as_ptr(),
                    libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND | libc::O_CLOEXEC,
                    0o644,
                )
            };
            if fd < 0 {
                return -1;
            }
            // SAFETY: `fd` is open; move it up high so the application's own numbering is not
            // disturbed, then drop the low number.
            let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, STATS_FD_MIN) };
            // SAFETY: closing the descriptor we opened above.
            unsafe { libc::close(fd) };
            return high;
        }
        _ => 2,
    };
    // SAFETY: duplicating stderr (if it is open) to a high, close-on-exec descriptor.
    unsafe { libc::fcntl(src, libc::F_DUPFD_CLOEXEC, STATS_FD_MIN) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truthy_accepts_the_usual_spellings_only() {
        for v in ["1", "yes", "TRUE", " on "] {
            assert!(truthy(Some(v)), "{v:?}");
        }
        for v in ["0", "", "no", "off", "2"] {
            assert!(!truthy(Some(v)), "{v:?}");
        }
        assert!(!truthy(None));
    }

    #[test]
    fn bypass_and_sample_settings_parse() {
        assert!(bypass_setting(None));
        assert!(bypass_setting(Some("auto")));
        assert!(!bypass_setting(Some("OFF")));
        assert!(!bypass_setting(Some("0")));
        assert!(bypass_setting(Some("bogus")), "invalid: auto");
        assert_eq!(sample_setting(None), None);
        assert_eq!(sample_setting(Some("")), None);
        assert_eq!(sample_setting(Some("0")), Some(0));
        assert_eq!(sample_setting(Some(" 1024 ")), Some(1024));
        assert_eq!(sample_setting(Some("lots")), None);
    }

    #[test]
    fn the_stats_descriptor_is_high_and_close_on_exec() {
        let fd = open_stats_fd();
        assert!(fd >= STATS_FD_MIN, "got {fd}");
        // SAFETY: querying and closing the descriptor opened above.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            assert_ne!(flags & libc::FD_CLOEXEC, 0);
            libc::close(fd);
        }
    }
}
