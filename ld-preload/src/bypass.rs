//! Adaptive bypass (`FH_BYPASS=auto`, the default): when recent registrations almost never come
//! back, stop caching and hand them straight to libibverbs.
//!
//! A workload that registers every message from a new address (a benchmark that walks its buffer,
//! an application that allocates each message) only misses; each miss pays, beyond the real
//! `ibv_reg_mr`, the cache's bookkeeping and the userfaultfd registration of the range, and the
//! idle regions it leaves pinned are later evicted or invalidated. Passed through, such a
//! registration costs what it costs without the shim.
//!
//! A bypassed registration is the application's own MR from libibverbs, exactly as a pass-through
//! (`passthrough_reg` counts it): no wrapper, never in a cache, deregistered by the application
//! with the real `ibv_dereg_mr`. It cannot go stale, and the caches' invalidation is unchanged
//! (regions cached before the switch stay watched and invalidated as always).
//!
//! The decision, per window of `WINDOW` registrations (the first one `FIRST_WINDOW`; process-wide,
//! relaxed counters):
//! a registration is *useful* when the cache hit, or when the same (domain, address, length,
//! remote rights) was registered recently (a direct-mapped table of recent keys, `GHOST`): a
//! repeat the cache would serve, unless memory went away in between, which still says the program
//! re-registers. Fewer useful than the break-even share below: bypass. While bypassing, the keys
//! are still remembered, a repeat still goes through the cache (and hits there after its first
//! miss), and one other registration in `PROBE` looks in the cache without pinning anything there
//! (so that registrations of sub-ranges of a region cached earlier are seen to hit; a probe that
//! missed would pay a cached miss, the very cost the bypass avoids); twice the break-even share
//! useful (at most 3 in 4): cache again.
//!
//! The break-even share comes from this process's own measurements (`miss_cost`): a cached miss
//! pays an overhead `o` beyond the real registration (userfaultfd registration and unregistration
//! of the range, the event sync, the cache's lock and bookkeeping), and a useful registration
//! saves `s`, a registration and a deregistration. Caching pays when the useful share `u` gives
//! `u * s > (1 - u) * o`, that is `u > o / (o + s)`. Measured natively (`miss_bench.rs`, 64 KiB,
//! `mlock` as the registration) that is about 1 in 4; with 1 in 4 registrations coming back among
//! new buffers, the fixed 1 in 8 of before kept caching all of them (0.88x of no cache's time),
//! the measured share bypasses the new ones and keeps the repeats (0.70x). Where a registration
//! is dear (the Soft-RoCE VM: a fresh buffer's `ibv_reg_mr` faults its pages in, milliseconds
//! against a fraction of that for userfaultfd), it stays near 1 in 8. `s` is read high on
//! purpose (a miss's registration may fault in pages that a hit's would find resident), which
//! leans to caching.
//! The share is kept within [1 in 8, 1 in 2]: at least 1 in 8 because a window with almost no
//! hits never pays; at most 1 in 2 because bypassing a workload that does hit loses its hits
//! (repeats excepted), while caching one that hits rarely only loses its misses' overhead. Before
//! any miss was measured: 1 in 8.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering::Relaxed};

/// Registrations per decision.
pub(crate) const WINDOW: u32 = 256;
/// Registrations before the first decision (then `WINDOW`). Why shorter: a workload that only
/// misses pays a cached miss's overhead for the whole first window, and in a run of a thousand
/// registrations 256 of them are a quarter of it (in the Soft-RoCE VM a cached miss cost 5.6x the
/// plain registration, so that first window alone made the run ~15 % slower than no cache). A
/// wrong early bypass costs little: repeats still go through the cache, and count as useful, so
/// a working set that comes back turns caching on again within a window.
pub(crate) const FIRST_WINDOW: u32 = 32;
/// While bypassing, one registration in this many still goes through the cache.
pub(crate) const PROBE: u64 = 64;
const GHOSTS: usize = 4096;

/// `FH_BYPASS`: `auto` (default) or `off` (always cache).
static ENABLED: AtomicBool = AtomicBool::new(true);
static BYPASSING: AtomicBool = AtomicBool::new(false);
static SEEN: AtomicU32 = AtomicU32::new(0);
/// The first decision was made (windows are `WINDOW` long from then on).
static DECIDED: AtomicBool = AtomicBool::new(false);
static USEFUL: AtomicU32 = AtomicU32::new(0);
static PROBES: AtomicU64 = AtomicU64::new(0);
/// Registrations passed straight through, and how often the mode changed.
pub(crate) static BYPASSED: AtomicU64 = AtomicU64::new(0);
pub(crate) static SWITCHES: AtomicU64 = AtomicU64::new(0);
static GHOST: [AtomicU64; GHOSTS] = [const { AtomicU64::new(0) }; GHOSTS];
/// Last decision's useful fraction, in 1/256 (for the summary).
static LAST_USEFUL: AtomicU8 = AtomicU8::new(0);
/// Last decision's break-even share, in 1/256 (for the summary; 0: no decision yet).
static BREAK_EVEN: AtomicU8 = AtomicU8::new(0);

pub(crate) fn set_enabled(on: bool) {
    ENABLED.store(on, Relaxed);
}

pub(crate) fn enabled() -> bool {
    ENABLED.load(Relaxed)
}

pub(crate) fn bypassing() -> bool {
    BYPASSING.load(Relaxed)
}

/// Where a cacheable registration goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// Through the cache; `repeat`: its key was registered recently. Report the outcome with
    /// `cached`.
    Cache { repeat: bool },
    /// Straight to libibverbs (already counted).
    Direct,
    /// While bypassing, one registration in `PROBE`: served by the cache if it already holds the
    /// range (a sub-range of a region cached earlier hits), else straight to libibverbs, with
    /// nothing pinned by the cache. Report the outcome with `peeked`.
    Peek,
}

fn key(pd: usize, addr: usize, len: usize, rights: u32) -> u64 {
    let mut h = (pd as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^= (addr as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    h = h.rotate_left(29) ^ (len as u64).wrapping_mul(0x1656_67B1_9E37_79F9);
    h ^= rights as u64;
    h | 1 // never 0: 0 is an empty slot
}

/// Remember this key; true if it was the last one in its slot (a recent repeat).
fn remember(k: u64) -> bool {
    GHOST[(k >> 52) as usize % GHOSTS].swap(k, Relaxed) == k
}

/// Route one cacheable registration of `[addr, addr + len)` in `pd` with remote rights `rights`.
pub(crate) fn route(pd: usize, addr: usize, len: usize, rights: u32) -> Route {
    if !enabled() {
        return Route::Cache { repeat: false };
    }
    let repeat = remember(key(pd, addr, len, rights));
    if bypassing() && !repeat {
        if PROBES.fetch_add(1, Relaxed).is_multiple_of(PROBE) {
            return Route::Peek;
        }
        BYPASSED.fetch_add(1, Relaxed);
        count(false);
        return Route::Direct;
    }
    Route::Cache { repeat }
}

/// The outcome of a `Route::Peek`: `hit`, served by the cache; else passed straight through.
pub(crate) fn peeked(hit: bool) {
    if !hit {
        BYPASSED.fetch_add(1, Relaxed);
    }
    count(hit);
}

/// The outcome of a registration routed to the cache.
pub(crate) fn cached(repeat: bool, hit: bool) {
    if enabled() {
        count(repeat || hit);
    }
}

fn count(useful: bool) {
    if useful {
        USEFUL.fetch_add(1, Relaxed);
    }
    let window = if DECIDED.load(Relaxed) {
        WINDOW
    } else {
        FIRST_WINDOW
    };
    if SEEN.fetch_add(1, Relaxed) + 1 == window {
        let u = USEFUL.swap(0, Relaxed);
        SEEN.store(0, Relaxed);
        DECIDED.store(true, Relaxed);
        decide(u, window);
    }
}

/// The break-even share of useful registrations, in 1/256, from the mean overhead of a cached
/// miss beyond its registration (`overhead_us`) and what a useful registration saves
/// (`saving_us`), clamped to [1 in 8, 1 in 2]; 1 in 8 without a measurement.
pub(crate) fn break_even_256(overhead_us: f64, saving_us: f64) -> u32 {
    const LOW: u32 = 256 / 8;
    const HIGH: u32 = 256 / 2;
    let total = overhead_us + saving_us;
    if !(overhead_us >= 0.0 && saving_us > 0.0 && total.is_finite()) {
        return LOW;
    }
    ((overhead_us / total * 256.0) as u32).clamp(LOW, HIGH)
}

/// The break-even share now, from the misses measured so far.
fn measured_break_even_256() -> u32 {
    let b = crate::miss_cost::current();
    if b.misses == 0 {
        return break_even_256(f64::NAN, 0.0);
    }
    let overhead = b.watch_us + b.unwatch_per_miss_us + b.quiesce_us + b.rest_us;
    // A deregistration costs about what a registration does; the misses' own deregistrations
    // (victims on the way) give its mean when there were any.
    let dereg = if b.deregs_per_miss > 0.0 {
        b.dereg_us / b.deregs_per_miss
    } else {
        b.reg_us
    };
    break_even_256(overhead, b.reg_us + dereg)
}

/// End of a window with `useful` of `seen` registrations useful.
fn decide(useful: u32, seen: u32) {
    #[cfg(test)]
    {
        let forced = FORCED_EVEN.load(Relaxed);
        if forced != 0 {
            return decide_at(useful, seen, forced);
        }
    }
    decide_at(useful, seen, measured_break_even_256());
}

/// The host tests' break-even share (0: measure): the miss costs are process-wide and other
/// tests record misses, so a test of the decision says which share it decides at.
#[cfg(test)]
static FORCED_EVEN: AtomicU32 = AtomicU32::new(256 / 8);

/// Host tests and the native benchmark: decide at `even` (in 1/256; 0: the measured share) until
/// the next `reset`.
#[cfg(test)]
pub(crate) fn force_break_even(even: u32) {
    FORCED_EVEN.store(even, Relaxed);
}

/// `decide` with the break-even share `even` (in 1/256): bypass below it, cache again at twice
/// it (at most 3 in 4).
fn decide_at(useful: u32, seen: u32, even: u32) {
    LAST_USEFUL.store((useful * 256 / seen.max(1)).min(255) as u8, Relaxed);
    BREAK_EVEN.store(even.min(255) as u8, Relaxed);
    let share = u64::from(useful) * 256;
    let seen = u64::from(seen);
    let now = bypassing();
    let next = if now {
        share < u64::from((2 * even).min(192)) * seen
    } else {
        share < u64::from(even) * seen
    };
    if next != now {
        BYPASSING.store(next, Relaxed);
        SWITCHES.fetch_add(1, Relaxed);
    }
}

/// The `FH_STATS` line (`None` with `FH_BYPASS=off`).
pub(crate) fn line() -> Option<String> {
    if !enabled() {
        return None;
    }
    Some(format!(
        "  bypass:        {} registrations passed straight to libibverbs (FH_BYPASS=auto: while fewer \
         repeat or hit than a miss's overhead pays for), {} switches, now {}; last window {:.0}% useful, \
         break-even {:.0}%\n",
        BYPASSED.load(Relaxed),
        SWITCHES.load(Relaxed),
        if bypassing() { "bypassing" } else { "caching" },
        LAST_USEFUL.load(Relaxed) as f64 * 100.0 / 256.0,
        BREAK_EVEN.load(Relaxed) as f64 * 100.0 / 256.0,
    ))
}

/// In a forked child (atfork handler: atomics only): caching again, with an empty window. The
/// recent keys stay (the child's memory is a copy of its parent's).
pub(crate) fn restart_in_child() {
    BYPASSING.store(false, Relaxed);
    DECIDED.store(false, Relaxed);
    SEEN.store(0, Relaxed);
    USEFUL.store(0, Relaxed);
}

/// Back to the start state of the host tests: off, empty windows and keys (a test of the bypass
/// turns it on with `set_enabled(true)`).
#[cfg(test)]
pub(crate) fn reset() {
    ENABLED.store(false, Relaxed);
    BYPASSING.store(false, Relaxed);
    DECIDED.store(false, Relaxed);
    SEEN.store(0, Relaxed);
    USEFUL.store(0, Relaxed);
    PROBES.store(0, Relaxed);
    FORCED_EVEN.store(256 / 8, Relaxed);
    for g in &GHOST {
        g.store(0, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_addresses_bypass_and_repeats_resume_caching() {
        let _s = crate::serial::serial();
        reset();
        set_enabled(true);
        let pd = 0x5000;
        // Every registration a new address, every one a miss: after the first window, bypass.
        let mut a = 0x10_0000_0000usize;
        for _ in 0..FIRST_WINDOW {
            match route(pd, a, 65536, 0) {
                Route::Cache { repeat } => cached(repeat, false),
                Route::Direct | Route::Peek => panic!("bypass before a full window"),
            }
            a += 65536 + 4096;
        }
        assert!(bypassing());
        let b0 = BYPASSED.load(Relaxed);
        let mut direct = 0;
        let mut peeks = 0;
        for _ in 0..WINDOW {
            match route(pd, a, 65536, 0) {
                Route::Cache { .. } => panic!("a new address cached while bypassing"),
                Route::Peek => {
                    peeks += 1;
                    peeked(false) // the cache did not hold it: passed through
                }
                Route::Direct => direct += 1,
            }
            a += 65536 + 4096;
        }
        assert_eq!(peeks, WINDOW as u64 / PROBE, "one probe in PROBE");
        assert_eq!(direct, WINDOW as u64 - peeks, "all but the probes");
        assert_eq!(
            BYPASSED.load(Relaxed) - b0,
            WINDOW as u64,
            "a probe the cache missed passed through too"
        );
        assert!(bypassing(), "still fresh: still bypassing");
        // A forked child starts caching again (its registrations are its own), with a short
        // first window.
        restart_in_child();
        assert!(!bypassing());
        assert_eq!((SEEN.load(Relaxed), USEFUL.load(Relaxed)), (0, 0));
        assert!(!DECIDED.load(Relaxed));
        DECIDED.store(true, Relaxed);
        BYPASSING.store(true, Relaxed);
        // The program turns to a working set of 8 buffers: repeats go to the cache and are
        // useful; within a window caching resumes.
        let mut routed_to_cache_repeat = 0;
        for i in 0..WINDOW {
            let addr = 0x20_0000_0000usize + (i as usize % 8) * 65536;
            match route(pd, addr, 65536, 0) {
                Route::Cache { repeat } => {
                    routed_to_cache_repeat += repeat as u32;
                    cached(repeat, true)
                }
                Route::Peek => peeked(true),
                Route::Direct => {}
            }
        }
        assert!(
            routed_to_cache_repeat >= WINDOW - 16,
            "repeats are never bypassed"
        );
        assert!(!bypassing(), "repeats: caching again");
        reset();
    }

    /// A working set larger than the first window, all new at first: bypassed early, but its
    /// second round comes back through the cache (repeats) and turns caching on again.
    #[test]
    fn an_early_bypass_of_a_working_set_undoes_itself() {
        let _s = crate::serial::serial();
        reset();
        set_enabled(true);
        let (pd, n) = (0x6000, 48usize);
        let addr = |i: usize| 0x50_0000_0000usize + (i % n) * 65536;
        for i in 0..n {
            match route(pd, addr(i), 65536, 0) {
                Route::Cache { repeat } => cached(repeat, false),
                Route::Peek => peeked(false),
                Route::Direct => {}
            }
        }
        assert!(
            bypassing(),
            "48 new buffers: bypassed after the first window"
        );
        let mut direct_later = 0;
        for i in n..n + WINDOW as usize + 2 * n {
            match route(pd, addr(i), 65536, 0) {
                // Repeats go to the cache: after their first miss there, they hit.
                Route::Cache { repeat } => cached(repeat, i >= 2 * n),
                Route::Direct | Route::Peek => direct_later += 1,
            }
        }
        assert_eq!(direct_later, 0, "every later registration is a repeat");
        assert!(!bypassing(), "caching again within a window");
        reset();
    }

    #[test]
    fn hits_keep_caching_and_off_never_bypasses() {
        let _s = crate::serial::serial();
        reset();
        set_enabled(true);
        // New keys every time but the cache hits (sub-ranges of a registered pool): caching.
        for i in 0..4 * WINDOW as usize {
            let Route::Cache { repeat } = route(1, 0x30_0000_0000 + i * 64, 64, 0) else {
                panic!("a hitting workload was bypassed");
            };
            cached(repeat, i % 4 == 0);
        }
        assert!(!bypassing());
        set_enabled(false);
        for i in 0..4 * WINDOW as usize {
            assert_eq!(
                route(1, 0x40_0000_0000 + i * 8192, 4096, 0),
                Route::Cache { repeat: false }
            );
            cached(false, false);
        }
        assert!(!bypassing(), "FH_BYPASS=off");
        reset();
    }

    #[test]
    fn the_break_even_share_follows_the_measured_costs() {
        // Natively a miss costs ~1.6x the registration and deregistration it stands for.
        assert_eq!(break_even_256(60.0, 100.0), 96, "3 in 8");
        // The VM: a cached miss's overhead 150 us against 80 us saved: capped at 1 in 2.
        assert_eq!(break_even_256(150.0, 80.0), 128);
        // Cheap misses: never below 1 in 8.
        assert_eq!(break_even_256(1.0, 100.0), 32);
        assert_eq!(break_even_256(0.0, 10.0), 32);
        // Nothing measured, or nonsense: 1 in 8.
        assert_eq!(break_even_256(f64::NAN, 0.0), 32);
        assert_eq!(break_even_256(5.0, 0.0), 32);
        assert_eq!(break_even_256(-1.0, 10.0), 32);
        assert_eq!(break_even_256(f64::INFINITY, 10.0), 32);
    }

    /// Half the registrations repeat (a benchmark cycling a few buffer offsets among fresh ones),
    /// where a cached miss's overhead is twice what a hit saves: bypassing the fresh half pays,
    /// and the repeats are still served by the cache; at 1 in 8 (cheap misses) it keeps caching.
    #[test]
    fn costly_misses_bypass_a_half_repeating_workload_and_keep_its_repeats() {
        let _s = crate::serial::serial();
        for (overhead, saving, bypass_expected) in [(150.0, 80.0, true), (1.0, 80.0, false)] {
            reset();
            set_enabled(true);
            FORCED_EVEN.store(break_even_256(overhead, saving), Relaxed);
            let pd = 0x7000;
            let mut fresh = 0x60_0000_0000usize;
            let (mut direct, mut repeats_cached) = (0, 0);
            for i in 0..FIRST_WINDOW as usize + 4 * WINDOW as usize {
                // Even: one of 4 offsets that come back; odd: an address never seen.
                let addr = if i % 2 == 0 {
                    0x70_0000_0000usize + (i / 2 % 4) * 65536
                } else {
                    fresh += 65536 + 4096;
                    fresh
                };
                match route(pd, addr, 65536, 0) {
                    Route::Cache { repeat } => {
                        repeats_cached += u32::from(repeat);
                        cached(repeat, repeat && i >= 8)
                    }
                    Route::Peek => peeked(false),
                    Route::Direct => direct += 1,
                }
            }
            assert_eq!(bypassing(), bypass_expected, "overhead {overhead} us");
            if bypass_expected {
                assert!(direct > WINDOW, "the fresh half passed through: {direct}");
            } else {
                assert_eq!(direct, 0);
            }
            assert!(
                repeats_cached >= 2 * WINDOW - 8,
                "the repeats went to the cache either way: {repeats_cached}"
            );
        }
        reset();
    }

    #[test]
    fn keys_differ_by_domain_length_and_rights() {
        let k = key(1, 0x1000, 4096, 0);
        assert_ne!(k, key(2, 0x1000, 4096, 0));
        assert_ne!(k, key(1, 0x1000, 8192, 0));
        assert_ne!(k, key(1, 0x1000, 4096, 2));
        assert_ne!(k, key(1, 0x2000, 4096, 0));
        assert_eq!(k & 1, 1);
    }
}
