//! One registration cache per protection domain and remote-rights class (`struct ibv_pd *` plus
//! the request's remote read/write/atomic bits -> cache), created on the first registration of
//! that kind and dropped, all classes at once, by our `ibv_dealloc_pd` hook (and by our
//! `ibv_close_device` hook, for every domain of the device).
//!
//! Why split by remote rights: the cache serves a request from any region whose rights cover it
//! and merges overlapping regions with the union of their rights. Within one domain that would
//! hand an application that asked for remote *read* an rkey that also allows remote *write* (an
//! earlier registration of the same buffer had it): a drop-in must not widen what a peer may do.
//! Local write may still be widened (it concerns only this process). Each class is its own
//! cache, so a remote-read request never lands on a remote-write region.
//!
//! The map lock is held only to find or insert an entry, never across a registration, so a slow
//! `ibv_reg_mr` in one domain does not stall another, and a cache is never dropped under it
//! (dropping one takes the library's locks). `fork_lock` lets the atfork handlers hold it across
//! `fork` so a child never inherits it locked; in the child the map is forgotten, not dropped:
//! the caches in it are the parent's (quarantined by the library), and the child makes its own.
//!
//! A cache that cannot be subscribed to memory events (the library's registry is full) is never
//! used: `for_pd` fails with `NoCache::TooManyCaches` and that registration passes through
//! uncached.

use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use firehose::internals::assembly::{self, AssembleError, Parts};
use firehose::internals::cache::{Cache, CacheError, Limits, Registration, Stats};
use firehose::internals::helper::{pin_flag, Helper};
use firehose::internals::monitor::{self, Hooked, MonitorOptions, Subscription};
use firehose::internals::pin::fork_mode;
use firehose::internals::pin::Access;
#[cfg(test)]
use firehose::internals::pin::Pinner;

use crate::ffi_types::IbvPd;
use crate::real_pinner::RealPinner;
use crate::{real_verbs, settings};
use rustc_hash::FxHashMap;

/// The cache of one protection domain.
pub(crate) struct PdCache {
    /// Declared first so it drops first: events stop reaching the cache before it goes away.
    _events: Option<Subscription>,
    /// The helper thread (`FH_HELPER=1`), stopped and joined before the cache drops.
    helper: Helper,
    cache: Arc<Cache>,
    /// The real backend, for MR handles (`None` for a test double).
    pinner: Option<Arc<RealPinner>>,
}
/// Test doubles' caches watch their ranges with userfaultfd (the native miss benchmark).
#[cfg(test)]
pub(crate) static TEST_UFFD: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);
#[cfg(test)]
static TEST_PINNERS: Mutex<Vec<(usize, Arc<dyn Pinner>)>> = Mutex::new(Vec::new());

/// Remote access bits: requests differing in these never share a cache.
pub(crate) const REMOTE_RIGHTS: u32 =
    Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0 | Access::REMOTE_ATOMIC.0;

/// (pd address, remote-rights class).
type Key = (usize, u32);
type PdMap = FxHashMap<Key, Arc<PdCache>>;

static PDS: Mutex<Option<PdMap>> = Mutex::new(None);
/// Counters of caches already dropped (their domain was deallocated), so totals never go back.
static RETIRED: Mutex<Stats> = Mutex::new(Stats {
    hits: 0,
    misses: 0,
    evictions: 0,
    invalidations: 0,
    pinned_bytes: 0,
    pinned_peak: 0,
    regions: 0,
    in_use: 0,
    pin_retries: 0,
    pin_failures: 0,
    uncached: 0,
    prefetched: 0,
    released_ahead: 0,
});

fn pds() -> MutexGuard<'static, Option<PdMap>> {
    PDS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The map and the retired counters, locked across `fork` (see `fork.rs`).
pub(crate) struct ForkGuard {
    map: MutexGuard<'static, Option<PdMap>>,
    _retired: MutexGuard<'static, Stats>,
}

/// Lock the map, then the retired counters, for `fork`.
pub(crate) fn fork_lock() -> ForkGuard {
    ForkGuard {
        map: pds(),
        _retired: RETIRED.lock().unwrap_or_else(|e| e.into_inner()),
    }
}

impl ForkGuard {
    /// In the child, from the atfork handler (one thread, no allocation, no lock): forget every
    /// cache of the parent without dropping it (dropping would unsubscribe and release what the
    /// parent registered), and make this thread's remembered lookup stale, so that the next
    /// registration of any domain builds a new cache.
    pub(crate) fn forget_in_child(&mut self) {
        if let Some(m) = self.map.take() {
            std::mem::forget(m);
        }
        GENERATION.fetch_add(1, Ordering::Release);
        let _ = LAST.try_with(|l| {
            if let Ok(mut l) = l.try_borrow_mut() {
                std::mem::forget(l.take());
            }
        });
    }
}

/// Bumped whenever an entry leaves the map (`drop_pd`): a thread's remembered lookup from an
/// older generation may name a dropped cache (or a pd address since reused) and is not trusted.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// One thread's last lookup: (generation, key, cache).
type LastLookup = Option<(u64, Key, Arc<PdCache>)>;

thread_local! {
    /// Applications register over and over in the same domain with the same rights: remembering
    /// the last answer per thread skips the map's lock and hash on the hit path.
    static LAST: RefCell<LastLookup> = const { RefCell::new(None) };
}

/// Why a domain has no cache: its registrations pass through uncached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoCache {
    /// Invalidation is on but the monitor cannot see this process's unmaps.
    Blind,
    /// The library's registry of listeners is full.
    TooManyCaches,
}

impl From<AssembleError> for NoCache {
    fn from(e: AssembleError) -> NoCache {
        match e {
            AssembleError::TooManyCaches => NoCache::TooManyCaches,
        }
    }
}

/// The cache for requests with `access` in `pd`, created on first use.
pub(crate) fn for_pd(pd: *mut IbvPd, access: Access) -> Result<Arc<PdCache>, NoCache> {
    let key = (pd as usize, access.0 & REMOTE_RIGHTS);
    // Acquire pairs with the Release bump in `drop_pd`: a thread that sees the old generation
    // started its lookup before the entry was removed, as it would with the map itself.
    let generation = GENERATION.load(Ordering::Acquire);
    if let Some(c) = remembered(generation, key) {
        return Ok(c);
    }
    let c = lookup_or_create(pd, key)?;
    let _ = LAST.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            *l = Some((generation, key, c.clone()));
        }
    });
    Ok(c)
}

/// The cache for requests with `access` in `pd` if one exists (a bypassed registration's
/// look-up must not build one).
pub(crate) fn existing(pd: *mut IbvPd, access: Access) -> Option<Arc<PdCache>> {
    let key = (pd as usize, access.0 & REMOTE_RIGHTS);
    remembered(GENERATION.load(Ordering::Acquire), key)
        .or_else(|| pds().as_ref().and_then(|m| m.get(&key)).cloned())
}

/// This thread's last answer, if it was for `key` and no domain was dropped since.
fn remembered(generation: u64, key: Key) -> Option<Arc<PdCache>> {
    LAST.try_with(|l| match &*l.borrow() {
        Some((g, k, c)) if *g == generation && *k == key => Some(c.clone()),
        _ => None,
    })
    .ok()
    .flatten()
}

fn lookup_or_create(pd: *mut IbvPd, key: Key) -> Result<Arc<PdCache>, NoCache> {
    if let Some(c) = pds().as_ref().and_then(|m| m.get(&key)) {
        return Ok(c.clone());
    }
    // Build outside the lock (it may install the monitor, which can take a while).
    let fresh = PdCache::new(pd)?;
    let mut g = pds();
    let map = g.get_or_insert_with(FxHashMap::default);
    let c = map.entry(key).or_insert_with(|| fresh.clone()).clone();
    drop(g);
    // `fresh` (if another thread's cache won the race) is dropped here, outside the lock.
    drop(fresh);
    Ok(c)
}

/// Forget the cache of `pd` and release every idle registration it keeps, so that the real
/// `ibv_dealloc_pd` does not fail with EBUSY because of MRs only the cache still holds.
pub(crate) fn drop_pd(pd: *mut IbvPd) {
    drop_where(|p| p == pd);
}

/// Forget the caches of every domain of the device context `ctx` and release their idle
/// registrations, before the real `ibv_close_device`. An application may close a device without
/// deallocating its domains (the kernel then destroys what they hold, and libibverbs frees the
/// context): MRs left in a cache would later be deregistered through the freed context, at the
/// next unmap of a cached range or at the next eviction, a use after free.
pub(crate) fn drop_context(ctx: *mut c_void) {
    // SAFETY: every pd in the map is live: it leaves the map when the application deallocates
    // it (`ibv_dealloc_pd` is interposed) or closes its device (here), and until then libibverbs
    // keeps the struct. Only its `context` field is read, under the map's lock.
    drop_where(|pd| unsafe { (*pd).context } == ctx);
}

/// Forget the caches of the domains `which` picks (see `drop_pd`).
fn drop_where(which: impl Fn(*mut IbvPd) -> bool) {
    let mut gone = Vec::new();
    if let Some(m) = pds().as_mut() {
        m.retain(|k, c| {
            let drop = which(k.0 as *mut IbvPd);
            if drop {
                gone.push(c.clone());
            }
            !drop
        });
    }
    // Before the flush: threads stop trusting their remembered lookups of this domain.
    GENERATION.fetch_add(1, Ordering::Release);
    // Our own memory of it would keep the cache alive past the real dealloc.
    let _ = LAST.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            *l = None;
        }
    });
    for c in gone {
        c.stop_helper();
        c.flush();
        let s = c.stats();
        let mut r = RETIRED.lock().unwrap_or_else(|e| e.into_inner());
        r.hits += s.hits;
        r.misses += s.misses;
        r.evictions += s.evictions;
        r.invalidations += s.invalidations;
    }
}

/// Release the idle registrations of every cache (all domains and rights classes); returns how
/// many caches there were. Called when a registration ran out of pinnable memory: the limit
/// (`RLIMIT_MEMLOCK`, the HCA's) is the process's, while each cache evicts only its own.
pub(crate) fn flush_all_idle() -> usize {
    let caches: Vec<Arc<PdCache>> = pds()
        .as_ref()
        .map(|m| m.values().cloned().collect())
        .unwrap_or_default();
    for c in &caches {
        c.flush();
    }
    caches.len()
}

/// Cache counters summed over live and retired caches, and the number of live caches.
pub(crate) fn stats_sum() -> (Stats, u64) {
    let caches: Vec<Arc<PdCache>> = pds()
        .as_ref()
        .map(|m| m.values().cloned().collect())
        .unwrap_or_default();
    let mut t = *RETIRED.lock().unwrap_or_else(|e| e.into_inner());
    for c in &caches {
        let s = c.stats();
        t.hits += s.hits;
        t.misses += s.misses;
        t.evictions += s.evictions;
        t.invalidations += s.invalidations;
        t.regions += s.regions;
        t.in_use += s.in_use;
    }
    (t, caches.len() as u64)
}

/// The fork mode the caches were made with (`FH_FORK_MODE`, resolved once per cache; the same for
/// all), as its byte; `NO_CACHE_YET` before the first.
static FORK_MODE: AtomicU8 = AtomicU8::new(NO_CACHE_YET);
const NO_CACHE_YET: u8 = u8::MAX;

/// The `FH_STATS` line of the fork mode, once a cache was made (they may all be gone by exit).
pub(crate) fn fork_line() -> Option<String> {
    let m = FORK_MODE.load(Ordering::Relaxed);
    (m != NO_CACHE_YET).then(|| {
        let mode = fork_mode::ForkMode::from_u8(m);
        format!("  fork:          {} (FH_FORK_MODE)\n", mode.as_str())
    })
}

/// The helper threads' line for the `FH_STATS` summary (`None` without `FH_HELPER=1`): summed
/// over the live caches, or why the first one stayed off.
pub(crate) fn helper_line() -> Option<String> {
    if !settings::config().helper.enabled {
        return None;
    }
    let caches: Vec<Arc<PdCache>> = pds()
        .as_ref()
        .map(|m| m.values().cloned().collect())
        .unwrap_or_default();
    let on: Vec<_> = caches.iter().filter(|c| c.helper.is_on()).collect();
    if on.is_empty() {
        let why = caches
            .iter()
            .find_map(|c| match c.helper.state() {
                firehose::internals::helper::HelperState::Off { reason } => Some(reason.clone()),
                _ => None,
            })
            .unwrap_or_else(|| "no cache".into());
        return Some(format!("  helper:        off: {why}\n"));
    }
    let (mut uses, mut early, mut late, mut pins, mut unpins, mut avg) = (0, 0, 0, 0, 0, 0);
    let (mut judged, mut accurate) = (0, 0);
    for c in &on {
        let st = c.helper.stats();
        let p = st.planner;
        uses += p.uses;
        early += p.early;
        late += p.late;
        pins += p.helper_pins;
        unpins += p.helper_unpins;
        avg += st.avg_pinned_bytes;
        judged += p.predictor.evaluated;
        accurate += p.predictor.accurate;
    }
    Some(format!(
        "  helper:        {n} thread(s): {uses} tracked registrations, {early} early, {late} late; \
         {pins} pins, {unpins} unpins ahead; {accurate}/{judged} predictions within 5 %; \
         {avg} bytes pinned on average\n",
        n = on.len()
    ))
}

/// Install the monitor on the first registration of the process (not in the constructor: most
/// processes that inherit LD_PRELOAD never register, and userfaultfd starts a thread). Not a
/// `Once`: a child forked while another thread was inside one would wait for it forever;
/// `monitor::install` is idempotent and fork-safe, so two first registrations may both call it.
fn ensure_monitor() {
    static DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if DONE.load(Ordering::Acquire) {
        return;
    }
    let m = settings::config().monitor;
    let deferred =
        m.patch_libc && !settings::monitor_explicit() && crate::coexist::foreign_patcher_loaded();
    // Before the hooks go live, as the library does: every patched unmap is logged for the
    // helper threads (and waits for their pins ahead).
    firehose::internals::helper::install_unmap_windows();
    let st = monitor::install(MonitorOptions {
        patch_libc: m.patch_libc && !deferred,
        userfaultfd: m.userfaultfd,
    });
    DEFERRED.store(deferred, Ordering::Release);
    // The library that owns libc's entries tells us of unmaps itself, before they happen.
    let foreign = if deferred {
        crate::foreign_events::subscribe()
    } else {
        0
    };
    if deferred && !sees_free_unmaps(&st) && foreign == 0 {
        BLIND.store(true, Ordering::Release);
        crate::coexist::warn_blind(st.uffd_errno);
    }
    DONE.store(true, Ordering::Release);
}

/// The application allocated a protection domain (`ibv_alloc_pd`): install the monitor and start
/// userfaultfd's reader now, rather than inside its first registration. Measured in the Soft-RoCE
/// VM, those one-time starts made the first cached registrations of a run cost several
/// milliseconds between them. Nothing else changes: the caches are still made on first use.
pub(crate) fn warm_up() {
    if !settings::invalidation_enabled() {
        return;
    }
    ensure_monitor();
    if settings::config().monitor.userfaultfd && !blind() {
        monitor::start_uffd_reader();
        warm_uffd_path();
    }
}

/// One userfaultfd watch and unwatch of a page of the shim's own (mapped and unmapped by raw
/// system calls, so no monitor hears of it), so that the first cached registration's
/// `UFFDIO_REGISTER` is not the process's first. Once per process (a forked child has its own
/// userfaultfd context, so once more there).
fn warm_uffd_path() {
    static DONE_IN: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    if DONE_IN.swap(me, Ordering::Relaxed) == me {
        return;
    }
    let page = 4096;
    // SAFETY: a fresh private anonymous mapping of our own; nothing else refers to it.
    let p = unsafe {
        libc::syscall(
            libc::SYS_mmap,
            0usize,
            page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1isize,
            0usize,
        )
    };
    if p < 0 {
        return;
    }
    let addr = p as usize;
    if firehose::internals::monitor::uffd_watch(addr, page) != 0 {
        firehose::internals::monitor::uffd_unwatch(addr, page);
    }
    // SAFETY: our mapping from above, unregistered again (its unmap makes no userfaultfd event).
    unsafe { libc::syscall(libc::SYS_munmap, addr, page) };
}

/// The default monitor left libc's entries to another library (`coexist.rs`).
static DEFERRED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A new protection domain's cache: the library that owns libc's entries may have been loaded
/// since the monitor was installed (MPI loads UCX with `dlopen`): subscribe to its events now,
/// which also ends `BLIND` once a source sees `free`'s unmaps.
fn refresh_foreign() {
    if !DEFERRED.load(Ordering::Acquire) {
        return;
    }
    let all = crate::foreign_events::SRC_UCM | crate::foreign_events::SRC_OPAL;
    if crate::foreign_events::live() & all != all && crate::foreign_events::subscribe() != 0 {
        BLIND.store(false, Ordering::Release);
    }
}

/// For `FH_STATS`: which sources tell the caches of unmaps.
pub(crate) fn monitor_line() -> String {
    let st = monitor::status();
    let libc = if st.patched != 0 {
        "libc entries patched"
    } else if DEFERRED.load(Ordering::Acquire) {
        "libc entries left to another library"
    } else {
        "libc entries not patched"
    };
    let foreign = crate::foreign_events::describe(crate::foreign_events::live());
    let (unmapped, mapped, released) = crate::foreign_events::heard();
    format!(
        "  monitor:       {libc}; userfaultfd {}; {}{}\n\
         \x20 events:        userfaultfd: {} ranges registered, {} events read; \
         libucm: {unmapped} unmapped, {mapped} mapped; Open MPI: {released} released\n",
        if st.uffd { "on" } else { "off" },
        if foreign.is_empty() {
            "no foreign events"
        } else {
            "subscribed to "
        },
        foreign,
        st.uffd_registered,
        st.uffd_events,
    )
}

/// The default monitor left libc's code to another library's hooks (`coexist.rs`) and
/// userfaultfd is not running either: the unmaps glibc makes inside `free`, `realloc` and
/// `malloc_trim` reach no cache, so a cached registration of memory `free` gave back would stay a
/// hit (seen with userfaultfd refused by a seccomp filter, as in containers). Then nothing is
/// cached: every registration passes through.
static BLIND: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the monitor sees the unmaps of glibc's own `free`/`realloc`/`malloc_trim`: libc's
/// munmap, mremap and madvise patched, or userfaultfd running.
fn sees_free_unmaps(st: &monitor::MonitorStatus) -> bool {
    let free_paths = Hooked::Munmap.bit() | Hooked::Mremap.bit() | Hooked::Madvise.bit();
    st.patched & free_paths == free_paths || st.uffd
}

/// True when caching is off because nothing would see `free`'s unmaps (see `BLIND`).
pub(crate) fn blind() -> bool {
    BLIND.load(Ordering::Acquire)
}

impl PdCache {
    fn new(pd: *mut IbvPd) -> Result<Arc<PdCache>, NoCache> {
        #[cfg(test)]
        if let Some(c) = Self::new_for_test(pd) {
            return c;
        }
        if settings::invalidation_enabled() {
            ensure_monitor();
            refresh_foreign();
            if blind() {
                return Err(NoCache::Blind);
            }
        }
        let cfg = settings::config();
        let pinner = Arc::new(RealPinner::new(pd, real_verbs::get()));
        // Registrations here are the application's verbs MRs: what libibverbs says of fork
        // decides (`FH_FORK_MODE=auto`, the default).
        let fork = fork_mode::resolve(cfg.fork, true);
        FORK_MODE.store(fork as u8, Ordering::Relaxed);
        // (The monitor was installed above.) FH_TEST_NO_INVALIDATE: a cache deaf to memory events
        // (tests only). A forked child watches with its own userfaultfd context, as the library's
        // caches do (the monitor opens one in the child on its first watch).
        let invalidate = settings::invalidation_enabled();
        Self::assembled(
            Parts {
                pinner: pinner.clone(),
                limits: Limits {
                    max_pinned: cfg.max_pinned,
                    max_regions: cfg.max_regions,
                },
                uffd_watch: invalidate && cfg.monitor.userfaultfd,
                fork,
                events: invalidate,
                helper: assembly::helper_config(&cfg.helper),
            },
            Some(pinner),
        )
    }

    /// The cache from the one assembly (`firehose::internals::assembly`); `NoCache::TooManyCaches` when the
    /// library's registry has no room: a cache nobody invalidates would serve stale
    /// registrations, so this domain's registrations pass through uncached.
    fn assembled(parts: Parts, pinner: Option<Arc<RealPinner>>) -> Result<Arc<PdCache>, NoCache> {
        let a = assembly::assemble(parts)?;
        Ok(Arc::new(PdCache {
            _events: a.subscription,
            helper: a.helper,
            cache: a.cache,
            pinner,
        }))
    }

    /// Test double: the caches of the fake domain `pd` will run over `pinner` (subscribed to
    /// memory events, without installing the monitor).
    #[cfg(test)]
    pub(crate) fn install_for_test(pd: *mut IbvPd, pinner: Arc<dyn Pinner>) {
        // A fake pd may reuse the address of an earlier test's: forget that one's caches.
        drop_pd(pd);
        let mut t = TEST_PINNERS.lock().unwrap_or_else(|e| e.into_inner());
        t.retain(|(p, _)| *p != pd as usize);
        t.push((pd as usize, pinner));
    }

    #[cfg(test)]
    fn new_for_test(pd: *mut IbvPd) -> Option<Result<Arc<PdCache>, NoCache>> {
        let pinner = TEST_PINNERS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(p, _)| *p == pd as usize)
            .map(|(_, p)| p.clone())?;
        let limits = Limits {
            max_pinned: 1 << 30,
            max_regions: 1024,
        };
        let cfg = settings::config();
        Some(Self::assembled(
            Parts {
                pinner,
                limits,
                uffd_watch: TEST_UFFD.load(Ordering::Relaxed),
                fork: fork_mode::resolve(cfg.fork, true),
                events: true,
                helper: assembly::helper_config(&cfg.helper),
            },
            None,
        ))
    }

    /// Register (or find) `[addr, addr + len)` with at least `access`. The flag is true for a
    /// hit (no real registration was made for it).
    pub(crate) fn register(
        &self,
        addr: usize,
        len: usize,
        access: Access,
    ) -> Result<(Registration, bool), CacheError> {
        let t0 = crate::miss_cost::begin();
        pin_flag::clear();
        // Undispatched userfaultfd events first (see `firehose::internals::monitor::quiesce`).
        firehose::internals::monitor::quiesce();
        let t1 = crate::miss_cost::ticks();
        // No call site from the hooks: the helper's signatures use the address and the context
        // window of previous registrations alone.
        let r = self.helper.register(&self.cache, 0, addr, len, access)?;
        let hit = !pin_flag::take();
        if !hit {
            crate::miss_cost::record_miss(t0, t1, crate::miss_cost::ticks());
        }
        Ok((r, hit))
    }

    /// The cached registration of `[addr, addr + len)` if the cache holds it (a hit), else
    /// `None` with nothing pinned: the look-up of a bypassed registration (`bypass.rs`).
    pub(crate) fn register_if_cached(
        &self,
        addr: usize,
        len: usize,
        access: Access,
    ) -> Option<Registration> {
        // As `register`: no hit on a range whose userfaultfd event is queued but not dispatched.
        firehose::internals::monitor::quiesce();
        self.cache
            .register_if_cached(addr, len, access)
            .ok()
            .flatten()
    }

    /// Time a real registration and deregistration of `[addr, addr + len)`, which a hit just
    /// found registered (so resident and pinned): what that hit avoided. Recorded in the
    /// resident-pages cost model (`cost_model.rs`); nothing else sees this registration.
    pub(crate) fn sample_resident(&self, addr: usize, len: usize, access: Access) {
        if let Some(p) = &self.pinner {
            if let Some((reg, dereg)) = p.time_reg_dereg(addr, len, access) {
                crate::cost_model::record_resident(len, reg, dereg);
            }
        }
    }

    /// Release one registration returned by `register`.
    pub(crate) fn deregister(&self, handle: u64) -> Result<(), CacheError> {
        self.helper.deregister(&self.cache, handle)
    }

    /// Release every idle registration.
    pub(crate) fn flush(&self) {
        self.cache.flush();
    }

    /// Stop the helper thread for good and wait for it (it may be registering ahead on this
    /// domain right now): before the real `ibv_dealloc_pd`, while other threads' remembered
    /// lookups may keep this cache alive.
    pub(crate) fn stop_helper(&self) {
        self.helper.stop();
    }

    pub(crate) fn stats(&self) -> Stats {
        self.cache.stats()
    }

    /// Whether the library quarantined this cache (it was inherited across `fork`).
    #[cfg(test)]
    pub(crate) fn is_forked(&self) -> bool {
        self.cache.is_forked()
    }

    /// Kernel handle of the live MR with this lkey.
    pub(crate) fn mr_handle(&self, lkey: u32) -> u32 {
        self.pinner.as_ref().map_or(0, |p| p.handle_of(lkey))
    }
}

#[cfg(test)]
mod blind_tests {
    use super::*;

    /// Caching needs libc's free paths patched (munmap, mremap, madvise) or userfaultfd: without
    /// either, a registration of memory `free` gave back stayed a hit (found by review with
    /// userfaultfd refused by seccomp next to a foreign patcher).
    #[test]
    fn free_unmaps_are_seen_by_the_patch_or_userfaultfd_only() {
        let all = Hooked::Munmap.bit() | Hooked::Mremap.bit() | Hooked::Madvise.bit();
        let st = |patched, uffd| monitor::MonitorStatus {
            patched,
            uffd,
            ..Default::default()
        };
        assert!(sees_free_unmaps(&st(all, false)));
        assert!(sees_free_unmaps(&st(0, true)));
        assert!(!sees_free_unmaps(&st(0, false)), "deferred, no userfaultfd");
        assert!(
            !sees_free_unmaps(&st(Hooked::Munmap.bit(), false)),
            "realloc's mremap and trimming's madvise unseen"
        );
    }
}
