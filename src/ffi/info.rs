//! Read-only introspection: `fh_get_stats`, `fh_info`, `fh_print_info`, `fh_status_str`, `fh_version`.

use std::ffi::{c_char, c_int};
use std::fmt::Write as _;

use crate::ffi::status::fh_status;
use crate::helper::{Helper, HelperState};
use crate::monitor::Hooked;
use crate::pin::fork_mode::ForkMode;

use super::cache_object::fh_cache;
use super::guard::ffi_guard;
use super::handle::{borrow, write_out};
use super::types::*;

/// Bytes in a short human unit (`1.5 MiB`).
fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Names of the libc functions in a `MonitorStatus` bitmask, or "none".
fn bit_names(mask: u32) -> String {
    let names: Vec<&str> = Hooked::ALL
        .iter()
        .filter(|h| mask & h.bit() != 0)
        .map(|h| h.name())
        .collect();
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(" ")
    }
}

/// The one-screen summary, in the spirit of `ucx_info`: lines starting with `#`, one topic each.
pub(crate) fn render(c: &fh_cache) -> String {
    let s = c.cache.stats();
    let l = c.cache.limits();
    let lookups = s.hits + s.misses;
    let hit_pct = if lookups == 0 {
        0.0
    } else {
        100.0 * s.hits as f64 / lookups as f64
    };
    let mut monitor = Vec::new();
    if c.monitor_requested & FH_MONITOR_PATCH_LIBC != 0 {
        monitor.push("patch_libc");
    }
    if c.monitor_requested & FH_MONITOR_USERFAULTFD != 0 {
        monitor.push("userfaultfd");
    }
    monitor.push("fh_notify_unmapped");
    let mut o = String::new();
    // Writing into a String cannot fail; the results are ignored on purpose.
    let _ = writeln!(o, "# firehose {}", env!("CARGO_PKG_VERSION"));
    let _ = writeln!(o, "#   backend:       {}", c.backend_detail);
    let _ = writeln!(
        o,
        "#   limits:        max_pinned {} ({} bytes), max_regions {}",
        human(l.max_pinned as u64),
        l.max_pinned,
        l.max_regions
    );
    let _ = writeln!(o, "#   monitor asked: {}", monitor.join(", "));
    let fork = c.cache.fork_mode();
    let _ = writeln!(
        o,
        "#   fork:          {} (FH_FORK_MODE; {})",
        fork.as_str(),
        match fork {
            ForkMode::Keep => "a fork leaves the cache alone",
            ForkMode::Release => "idle registrations are released before a fork",
            ForkMode::Retire => "idle ones released before a fork, the rest retired after it",
        }
    );
    // Live, process-wide state (the monitor is shared by every cache).
    let m = crate::monitor::status();
    let _ = writeln!(o, "#   libc patched:  {}", bit_names(m.patched));
    if m.patch_failed != 0 || m.patch_unsupported {
        let _ = writeln!(
            o,
            "#   patch failed:  {}{}",
            bit_names(m.patch_failed),
            if m.patch_unsupported {
                " (architecture not supported)"
            } else {
                ""
            }
        );
    }
    if m.uffd {
        let _ = writeln!(
            o,
            "#   userfaultfd:   on, {} mappings watched, {} refused, {} events",
            m.uffd_registered, m.uffd_unsupported, m.uffd_events
        );
    } else if m.uffd_errno != 0 {
        let _ = writeln!(o, "#   userfaultfd:   off (errno {})", m.uffd_errno);
    } else {
        let _ = writeln!(o, "#   userfaultfd:   off");
    }
    let _ = writeln!(
        o,
        "#   lookups:       {} hits, {} misses ({hit_pct:.1}% hit)",
        s.hits, s.misses
    );
    let _ = writeln!(
        o,
        "#   pinned:        {} now, {} peak, {} regions ({} in use)",
        human(s.pinned_bytes),
        human(s.pinned_peak),
        s.regions,
        s.in_use
    );
    let _ = writeln!(
        o,
        "#   dropped:       {} evictions, {} invalidations, {} pin retries, {} pin failures",
        s.evictions, s.invalidations, s.pin_retries, s.pin_failures
    );
    let _ = writeln!(
        o,
        "#   uncached:      {} registrations (no room: bounds reached, the rest in use)",
        s.uncached
    );
    render_helper(&mut o, c);
    o
}

/// The helper's lines of `fh_info`.
fn render_helper(o: &mut String, c: &fh_cache) {
    let h = &c.helper;
    if h.in_forked_child() {
        let _ = writeln!(
            o,
            "#   helper:        forked: the thread stayed in the parent (make a new cache here)"
        );
        return;
    }
    match h.state() {
        HelperState::Off { reason } => {
            let _ = writeln!(o, "#   helper:        off: {reason}");
            return;
        }
        HelperState::On { cpu } => {
            let running = if h.is_on() { "on" } else { "stopped" };
            let cpu = cpu.map_or("any core".to_string(), |n| format!("core {n}"));
            let clock = crate::helper::clock::selected().map_or(String::new(), |s| {
                format!(
                    ", clock {} (FH_HELPER_CLOCK; clock_gettime {} ns here)",
                    s.source(),
                    s.monotonic_cost_ns
                )
            });
            let _ = writeln!(o, "#   helper:        {running} ({cpu}){clock}");
        }
    }
    let st = h.stats();
    let p = st.planner;
    let pct = |a: u64, b: u64| {
        if b == 0 {
            0.0
        } else {
            100.0 * a as f64 / b as f64
        }
    };
    let _ = writeln!(
        o,
        "#   predictions:   {} made, {} judged, {:.1}% within 5% of the observed period",
        p.predictor.made,
        p.predictor.evaluated,
        pct(p.predictor.accurate, p.predictor.evaluated)
    );
    let _ = writeln!(
        o,
        "#   registrations: {} tracked: {} early, {} late, {} unpredicted; callers pinned {} ({:.3} ms waited)",
        p.uses,
        p.early,
        p.late,
        p.unpredicted,
        p.caller_pins,
        p.caller_pin_wait_ns as f64 / 1e6
    );
    let _ = writeln!(
        o,
        "#   helper work:   {} pins, {} unpins, {} failed or raced; {} handed-over unpins; {} events dropped",
        p.helper_pins, p.helper_unpins, p.helper_pin_failures, st.deferred_unpins, st.events_dropped
    );
    let (waited, timed_out) = crate::helper::pins_ahead::waits();
    let _ = writeln!(
        o,
        "#   unmaps waited: {waited} for a helper's pin ahead of their memory, {timed_out} of them cut at {} s (process)",
        crate::helper::pins_ahead::MAX_WAIT_NS / 1_000_000_000
    );
    let _ = writeln!(
        o,
        "#   pinned (helper): {} time-averaged over {:.3} s, {} peak",
        human(st.avg_pinned_bytes),
        st.elapsed_ns as f64 / 1e9,
        human(st.peak_pinned_bytes)
    );
    let _ = writeln!(
        o,
        "#   cost model:    pin {:.1} us + {:.3} us/page, unpin {:.1} us + {:.3} us/page, slack {:.0} us",
        st.pin_line.0 / 1e3,
        st.pin_line.1 / 1e3,
        st.unpin_line.0 / 1e3,
        st.unpin_line.1 / 1e3,
        st.slack_ns as f64 / 1e3
    );
}

impl From<&Helper> for fh_helper_stats {
    fn from(h: &Helper) -> Self {
        let (state, cpu) = match h.state() {
            HelperState::Off { .. } => return fh_helper_stats::default(),
            HelperState::On { cpu } => {
                (if h.is_on() { 1 } else { 2 }, cpu.map_or(-1, |n| n as i32))
            }
        };
        let st = h.stats();
        let p = st.planner;
        fh_helper_stats {
            state,
            cpu,
            predictions: p.predictor.made,
            predictions_evaluated: p.predictor.evaluated,
            predictions_accurate: p.predictor.accurate,
            early_registrations: p.early,
            late_registrations: p.late,
            unpredicted_registrations: p.unpredicted,
            helper_pins: p.helper_pins,
            helper_unpins: p.helper_unpins,
            helper_pin_failures: p.helper_pin_failures,
            tracked_registrations: p.uses,
            caller_pins: p.caller_pins,
            caller_pin_wait_ns: p.caller_pin_wait_ns,
            caller_wait_ns: p.caller_wait_ns,
            avg_pinned_bytes: st.avg_pinned_bytes,
            peak_pinned_bytes: st.peak_pinned_bytes,
            elapsed_ns: st.elapsed_ns,
            events_dropped: st.events_dropped,
        }
    }
}

/// Copies what the helper thread did into `*out` (the counters it last published: it publishes
/// on every loop, at least every 0.5 ms). With no helper (`fh_config.helper` off, or no idle
/// core) every field is 0 (`state` 0); `fh_info` says why it is off. Returns `FH_ERR_NULL` if
/// `cache` or `out` is NULL, and `FH_ERR_FORKED` in a child forked from the process that made
/// `cache` (its helper thread stayed in the parent); then `*out` is not written.
///
/// # Safety
/// `cache` is NULL or live; `out` is NULL or valid for one `fh_helper_stats` write.
#[no_mangle]
pub unsafe extern "C" fn fh_get_helper_stats(
    cache: *const fh_cache,
    out: *mut fh_helper_stats,
) -> fh_status {
    ffi_guard! {{
        // SAFETY: NULL or live per the contract.
        let Some(c) = (unsafe { borrow(cache) }) else {
            return fh_status::FH_ERR_NULL;
        };
        if out.is_null() {
            return fh_status::FH_ERR_NULL;
        }
        if c.helper.in_forked_child() {
            return fh_status::FH_ERR_FORKED;
        }
        // SAFETY: non-NULL, writable per the contract.
        unsafe { write_out(out, fh_helper_stats::from(&c.helper)) };
        fh_status::FH_OK
    }}
}

/// Copies the cache's counters into `*out`. Invalidations reported so far (by the monitor or
/// `fh_notify_unmapped`) are processed first, so they are counted and their idle regions are
/// unpinned before the copy: the counters are current. Not for use inside a memory hook.
/// Returns `FH_ERR_NULL` if `cache` or `out` is NULL (then `*out` is not written).
///
/// # Safety
/// `cache` is NULL or live; `out` is NULL or valid for one `fh_stats` write.
#[no_mangle]
pub unsafe extern "C" fn fh_get_stats(cache: *const fh_cache, out: *mut fh_stats) -> fh_status {
    ffi_guard! {{
        // SAFETY: NULL or live per the contract.
        let Some(c) = (unsafe { borrow(cache) }) else {
            return fh_status::FH_ERR_NULL;
        };
        if out.is_null() {
            return fh_status::FH_ERR_NULL;
        }
        c.cache.process_invalidations();
        // SAFETY: non-NULL, writable per the contract.
        unsafe { write_out(out, fh_stats::from(c.cache.stats())) };
        fh_status::FH_OK
    }}
}

/// Writes a one-screen, human-readable summary (backend, limits, monitor paths, counters) into
/// `buf`, `snprintf`-style: at most `len - 1` characters plus a NUL; `needed` (may be NULL)
/// receives the full length without the NUL, so a caller can retry with a larger buffer.
/// `buf` may be NULL only if `len` is 0. Returns `FH_ERR_NULL` if `cache` is NULL, or `buf` is
/// NULL with `len > 0`.
///
/// # Safety
/// `cache` is NULL or live; `buf` is valid for `len` byte writes; `needed` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn fh_info(
    cache: *const fh_cache,
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> fh_status {
    ffi_guard! {{
        // SAFETY: NULL or live per the contract.
        let Some(c) = (unsafe { borrow(cache) }) else {
            return fh_status::FH_ERR_NULL;
        };
        if buf.is_null() && len > 0 {
            return fh_status::FH_ERR_NULL;
        }
        let text = render(c);
        if len > 0 {
            let n = text.len().min(len - 1);
            // SAFETY: `buf` is valid for `len` bytes per the contract and `n + 1 <= len`; the
            // source is a live String that cannot overlap caller memory.
            unsafe {
                std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
                buf.add(n).write(0);
            }
        }
        if !needed.is_null() {
            // SAFETY: non-NULL, writable per the contract.
            unsafe { write_out(needed, text.len()) };
        }
        fh_status::FH_OK
    }}
}

/// Writes the `fh_info` summary to file descriptor `fd` (e.g. 1 for stdout).
/// Returns `FH_ERR_NULL` if `cache` is NULL, `FH_ERR_BAD_CONFIG` if `fd` is negative or the write
/// fails.
///
/// # Safety
/// `cache` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn fh_print_info(cache: *const fh_cache, fd: c_int) -> fh_status {
    ffi_guard! {{
        // SAFETY: NULL or live per the contract.
        let Some(c) = (unsafe { borrow(cache) }) else {
            return fh_status::FH_ERR_NULL;
        };
        if fd < 0 {
            return fh_status::FH_ERR_BAD_CONFIG;
        }
        let text = render(c);
        let mut rest = text.as_bytes();
        while !rest.is_empty() {
            // SAFETY: `rest` is a valid byte slice; `fd` is only passed to write(2), which
            // reports EBADF itself for a closed descriptor.
            let n = unsafe { libc::write(fd, rest.as_ptr().cast(), rest.len()) };
            if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            if n <= 0 {
                return fh_status::FH_ERR_BAD_CONFIG;
            }
            rest = &rest[n as usize..];
        }
        fh_status::FH_OK
    }}
}

/// Static, NUL-terminated description of a status code; never NULL. Takes an `int` so that any
/// value is safe to pass: unknown codes give "unknown status".
#[no_mangle]
pub extern "C" fn fh_status_str(status: c_int) -> *const c_char {
    ffi_guard!(fallback = c"internal panic".as_ptr(); {
        match status_from_int(status) {
            Some(s) => s.as_cstr().as_ptr(),
            None => c"unknown status".as_ptr(),
        }
    })
}

/// Maps an integer from C to a status without ever building an invalid enum value.
fn status_from_int(v: c_int) -> Option<fh_status> {
    use fh_status::*;
    const ALL: [fh_status; 24] = [
        FH_OK,
        FH_ERR_NULL,
        FH_ERR_ZERO_LENGTH,
        FH_ERR_OVERFLOW,
        FH_ERR_BAD_ACCESS,
        FH_ERR_UNKNOWN_HANDLE,
        FH_ERR_NO_MEMORY,
        FH_ERR_PIN_FAILED,
        FH_ERR_TOO_LARGE,
        FH_ERR_BAD_CONFIG,
        FH_ERR_NO_DEVICE,
        FH_ERR_BUSY,
        FH_ERR_PANIC,
        FH_ERR_UNSUPPORTED,
        FH_ERR_FORKED,
        FH_ERR_TOO_MANY_CACHES,
        FH_ERR_PEER_LOST,
        FH_ERR_BOOTSTRAP,
        FH_ERR_BAD_RANK,
        FH_ERR_TIMEOUT,
        FH_ERR_FINALIZED,
        FH_ERR_MSG_TOO_LONG,
        FH_ERR_REMOTE_FAULT,
        FH_ERR_REMOTE_DENIED,
    ];
    ALL.into_iter().find(|s| *s as c_int == v)
}

/// The library version, e.g. "0.1.0" (static, never NULL).
#[no_mangle]
pub extern "C" fn fh_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_str_is_total() {
        for v in [-1, 1, 7000, 7024, c_int::MAX] {
            // SAFETY: the function returns a static C string.
            let s = unsafe { std::ffi::CStr::from_ptr(fh_status_str(v)) };
            assert_eq!(s.to_str().unwrap(), "unknown status");
        }
        // SAFETY: as above.
        let s = unsafe { std::ffi::CStr::from_ptr(fh_status_str(7005)) };
        assert_eq!(s, fh_status::FH_ERR_UNKNOWN_HANDLE.as_cstr());
    }

    #[test]
    fn human_units() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(3 << 30), "3.0 GiB");
    }
}
