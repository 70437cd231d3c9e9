//! The `fh_preload_stats` query and the `FH_STATS` exit summary, over the shim's counters
//! (`counters.rs`) and the caches' own.

use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, Ordering};

use firehose::internals::cache::Stats;

use crate::counters::COUNTERS;

/// What `fh_preload_stats` reports. Append-only: fields are never reordered; `struct_size` says
/// how much the shim filled in.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct FhPreloadStats {
    pub struct_size: u32,
    /// Bit 0: the shim is active (not `FH_DISABLE`); bit 1: invalidation is on.
    pub flags: u32,
    pub app_reg_calls: u64,
    pub nested_calls: u64,
    pub passthrough_reg: u64,
    pub passthrough_dereg: u64,
    pub wrappers_live: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub invalidations: u64,
    pub pinned_bytes: u64,
    pub pinned_peak: u64,
    pub real_regs: u64,
    pub real_reg_ns: u64,
    pub real_deregs: u64,
    pub real_dereg_ns: u64,
    /// Live caches (one per protection domain and remote-rights class).
    pub caches: u64,
    pub hit_bytes: u64,
    /// Estimate of the time hits saved, priced by the sampled re-registrations of resident pages
    /// (`cost_model.rs`; 0 without samples: `FH_STATS` off or no hit yet).
    pub saved_ns: u64,
    /// `ibv_dereg_mr`/`ibv_rereg_mr` of a wrapper already deregistered: refused (EINVAL).
    pub stale_deregs: u64,
    /// Sampled re-registrations behind `saved_ns`.
    pub resident_samples: u64,
    /// Upper bound of the time saved: hits priced by the line fitted on the misses (which also
    /// paid the first touch of their pages).
    pub saved_upper_ns: u64,
    /// Registrations passed straight through by the adaptive bypass (`FH_BYPASS`; also counted
    /// in `passthrough_reg`).
    pub bypassed_reg: u64,
    /// Misses whose pages were all resident (`FH_STATS` only): when non-zero, `saved_ns` prices
    /// hits by their `ibv_reg_mr` and the real deregistrations instead of the samples.
    pub resident_misses: u64,
    /// Hits priced by the sampled re-registrations alone (those pin pages that are pinned
    /// already).
    pub sampled_saved_ns: u64,
    /// Hits priced by the misses on resident pages alone (0 without such a miss).
    pub resident_miss_saved_ns: u64,
}

pub(crate) const FLAG_ACTIVE: u32 = 1;
pub(crate) const FLAG_INVALIDATION: u32 = 2;

/// A snapshot: shim counters plus the caches' own counters summed over protection domains.
pub(crate) fn snapshot() -> FhPreloadStats {
    let c = &COUNTERS;
    let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let (cache, pds): (Stats, u64) = crate::pd_cache::stats_sum();
    let mut flags = 0;
    // Not when nothing would see free()'s unmaps (`pd_cache::blind`): then nothing is cached.
    if !crate::settings::disabled() && !crate::pd_cache::blind() {
        flags |= FLAG_ACTIVE;
    }
    if crate::settings::invalidation_enabled() {
        flags |= FLAG_INVALIDATION;
    }
    FhPreloadStats {
        struct_size: std::mem::size_of::<FhPreloadStats>() as u32,
        flags,
        app_reg_calls: ld(&c.app_reg_calls),
        nested_calls: ld(&c.nested_calls),
        passthrough_reg: ld(&c.passthrough_reg),
        passthrough_dereg: ld(&c.passthrough_dereg),
        wrappers_live: crate::wrapper::live(),
        hits: cache.hits,
        misses: cache.misses,
        evictions: cache.evictions,
        invalidations: cache.invalidations,
        pinned_bytes: ld(&c.pinned_now),
        pinned_peak: ld(&c.pinned_peak),
        real_regs: ld(&c.real_regs),
        real_reg_ns: ld(&c.real_reg_ns),
        real_deregs: ld(&c.real_deregs),
        real_dereg_ns: ld(&c.real_dereg_ns),
        caches: pds,
        hit_bytes: ld(&c.hit_bytes),
        saved_ns: crate::cost_model::lower_estimate(cache.hits, ld(&c.hit_bytes)),
        stale_deregs: ld(&c.stale_dereg),
        resident_samples: crate::cost_model::samples(),
        saved_upper_ns: crate::cost_model::saved_ns(cache.hits, ld(&c.hit_bytes)),
        bypassed_reg: ld(&crate::bypass::BYPASSED),
        resident_misses: crate::cost_model::resident_misses(),
        sampled_saved_ns: crate::cost_model::resident_saved_ns(cache.hits, ld(&c.hit_bytes)),
        resident_miss_saved_ns: crate::cost_model::resident_miss_saved_ns(
            cache.hits,
            ld(&c.hit_bytes),
        ),
    }
}

/// Copy a snapshot into `*out` (at most `size` bytes, so older callers with a shorter struct
/// work). Returns 0, or -1 when `out` is NULL or `size` is too small for the first two fields.
///
/// # Safety
/// `out` is NULL or valid for writing `size` bytes.
#[no_mangle]
pub(crate) unsafe extern "C" fn fh_preload_stats(out: *mut FhPreloadStats, size: usize) -> c_int {
    if out.is_null() || size < 8 {
        return -1;
    }
    let s = std::panic::catch_unwind(snapshot).unwrap_or_default();
    let n = size.min(std::mem::size_of::<FhPreloadStats>());
    // SAFETY: `s` is a plain repr(C) value of at least `n` bytes; `out` is writable for `n`
    // bytes per the contract; the two do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(&s as *const _ as *const u8, out as *mut u8, n) };
    0
}

/// Mean of `total_ns` over `n` in microseconds (0 when `n == 0`).
fn mean_us(total_ns: u64, n: u64) -> f64 {
    if n == 0 {
        0.0
    } else {
        total_ns as f64 / n as f64 / 1000.0
    }
}

/// The `FH_STATS` summary text.
pub(crate) fn summary(s: &FhPreloadStats) -> String {
    let reg_us = mean_us(s.real_reg_ns, s.real_regs);
    let dereg_us = mean_us(s.real_dereg_ns, s.real_deregs);
    // Every hit is a registration (and later a deregistration) the application did not pay for.
    let saved_ms = s.hits as f64 * (reg_us + dereg_us) / 1000.0;
    let sized_ms = s.saved_upper_ns as f64 / 1e6;
    let estimate = if s.resident_misses > 0 {
        let sampled = if s.resident_samples == 0 {
            String::new()
        } else {
            format!(
                "\n\x20                and ~{:.3} ms priced by {} sampled re-registrations of the hits' \
                 pinned pages (1 hit in {}; the samples took {:.3} ms)",
                s.sampled_saved_ns as f64 / 1e6,
                s.resident_samples,
                crate::cost_model::sample_every(),
                crate::cost_model::sample_ns() as f64 / 1e6,
            )
        };
        format!(
            "~{:.3} ms estimated, the lower of: ~{:.3} ms priced by {} misses on resident pages \
             (their ibv_reg_mr, t = a + b*bytes, and the real ibv_dereg_mr){sampled}\n\
             \x20                (both read high: a process's first registrations cost more, and a sample \
             pins pages pinned already; time the job with and without)",
            s.saved_ns as f64 / 1e6,
            s.resident_miss_saved_ns as f64 / 1e6,
            s.resident_misses,
        )
    } else if s.resident_samples == 0 {
        "not estimated: no miss on resident pages and no sampled re-registration (FH_STATS_SAMPLE=0, or no hit)".to_string()
    } else {
        format!(
            "~{:.3} ms estimated from {} sampled re-registrations of resident pages \
             (1 hit in {}, t = a + b*bytes; the samples took {:.3} ms)",
            s.saved_ns as f64 / 1e6,
            s.resident_samples,
            crate::cost_model::sample_every(),
            crate::cost_model::sample_ns() as f64 / 1e6,
        )
    };
    let lookups = s.hits + s.misses;
    let hit_pct = if lookups == 0 {
        0.0
    } else {
        100.0 * s.hits as f64 / lookups as f64
    };
    format!(
        "firehose-preload (pid {pid}) summary\n\
         \x20 registrations: {calls} app calls ({nested} nested calls passed through), {pt} uncached ({byp} bypassed)\n\
         \x20 cache:         {hits} hits, {misses} misses ({hit_pct:.1}% hits), {ev} evictions, {inv} invalidations\n\
         \x20 pinned:        {now} bytes now, peak {peak} bytes, {pds} cache(s) (per pd and remote rights)\n\
         \x20 miss cost:     ibv_reg_mr {reg_us:.1} us mean over {nr}, ibv_dereg_mr {dereg_us:.1} us mean over {nd}\n\
         \x20 time saved:    {estimate}\n\
         \x20                at most ~{sized_ms:.3} ms priced by size (t = a + b*bytes fitted on the misses, {hit_bytes} hit bytes)\n\
         \x20                at most ~{saved_ms:.3} ms by hits x mean reg+dereg cost\n\
         \x20                (upper bounds: a miss also paid the first touch of its pages, which a hit's\n\
         \x20                re-registration of resident pages would not; time the job with and without)\n",
        hit_bytes = s.hit_bytes,
        pid = std::process::id(),
        calls = s.app_reg_calls,
        nested = s.nested_calls,
        pt = s.passthrough_reg,
        byp = s.bypassed_reg,
        hits = s.hits,
        misses = s.misses,
        ev = s.evictions,
        inv = s.invalidations,
        now = s.pinned_bytes,
        peak = s.pinned_peak,
        pds = s.caches,
        nr = s.real_regs,
        nd = s.real_deregs,
    )
}

/// `atexit` handler: write the summary to the stats descriptor. Never unwinds.
pub(crate) extern "C" fn print_at_exit() {
    let Some(fd) = crate::settings::stats_fd() else {
        return;
    };
    let _ = std::panic::catch_unwind(|| {
        let s = snapshot();
        // Every child inherits LD_PRELOAD (shells, launchers, `timeout`...): only processes that
        // used verbs report.
        if s.app_reg_calls == 0 && s.nested_calls == 0 && s.passthrough_dereg == 0 {
            return;
        }
        let mut text = summary(&s);
        if s.stale_deregs != 0 {
            text.push_str(&format!(
                "  refused:       {} ibv_dereg_mr/ibv_rereg_mr of MRs already deregistered (EINVAL)\n",
                s.stale_deregs
            ));
        }
        if let Some(lines) = crate::miss_cost::lines(&crate::miss_cost::current()) {
            text.push_str(&lines);
        }
        if let Some(line) = crate::bypass::line() {
            text.push_str(&line);
        }
        text.push_str(&crate::pd_cache::monitor_line());
        if let Some(n) = crate::miss_cost::mappings() {
            text.push_str(&format!(
                "  mappings:      {n} in /proc/self/maps at exit\n"
            ));
        }
        if let Some(line) = crate::pd_cache::fork_line() {
            text.push_str(&line);
        }
        if let Some(line) = crate::pd_cache::helper_line() {
            text.push_str(&line);
        }
        let mut buf = text.as_bytes();
        while !buf.is_empty() {
            // SAFETY: writing our own buffer to a descriptor we opened.
            let n = unsafe { libc::write(fd, buf.as_ptr() as *const _, buf.len()) };
            if n <= 0 {
                break;
            }
            buf = &buf[n as usize..];
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_estimates_time_saved_from_hits_and_mean_costs() {
        let s = FhPreloadStats {
            hits: 1000,
            misses: 10,
            real_regs: 10,
            real_reg_ns: 10 * 40_000, // 40 us each
            real_deregs: 4,
            real_dereg_ns: 4 * 10_000, // 10 us each
            ..Default::default()
        };
        let t = summary(&s);
        assert!(t.contains("1000 hits, 10 misses (99.0% hits)"), "{t}");
        assert!(t.contains("ibv_reg_mr 40.0 us mean over 10"), "{t}");
        assert!(t.contains("at most ~50.000 ms by hits x mean"), "{t}");
        assert!(t.contains("upper bounds"), "{t}");
        assert!(
            t.contains("not estimated: no miss on resident pages"),
            "{t}"
        );
        let sampled = summary(&FhPreloadStats {
            resident_samples: 4,
            saved_ns: 12_500_000,
            ..s
        });
        assert!(
            sampled.contains("~12.500 ms estimated from 4 sampled re-registrations"),
            "{sampled}"
        );
        // Misses on resident pages price the hits when there are any; the samples then read as
        // an upper bound.
        let by_misses = summary(&FhPreloadStats {
            resident_samples: 4,
            resident_misses: 3,
            saved_ns: 2_000_000,
            resident_miss_saved_ns: 2_000_000,
            sampled_saved_ns: 12_500_000,
            ..s
        });
        assert!(
            by_misses.contains(
                "~2.000 ms estimated, the lower of: ~2.000 ms priced by 3 misses on resident pages"
            ),
            "{by_misses}"
        );
        assert!(
            by_misses.contains("and ~12.500 ms priced by 4 sampled re-registrations"),
            "{by_misses}"
        );
        assert!(t.lines().count() <= 24, "one screen");
    }

    #[test]
    fn query_respects_the_callers_struct_size() {
        let mut full = FhPreloadStats::default();
        // SAFETY: `full` is writable for its whole size.
        assert_eq!(
            unsafe { fh_preload_stats(&mut full, std::mem::size_of_val(&full)) },
            0
        );
        assert_eq!(
            full.struct_size as usize,
            std::mem::size_of::<FhPreloadStats>()
        );
        let mut short = [0xAAu8; 16];
        // SAFETY: `short` is writable for 16 bytes and we pass 16.
        assert_eq!(
            unsafe { fh_preload_stats(short.as_mut_ptr() as *mut _, 16) },
            0
        );
        assert_eq!(
            u32::from_ne_bytes(short[0..4].try_into().unwrap()),
            full.struct_size
        );
        // SAFETY: NULL is rejected before any write.
        assert_eq!(unsafe { fh_preload_stats(std::ptr::null_mut(), 64) }, -1);
    }
}
