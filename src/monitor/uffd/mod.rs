//! userfaultfd event source: catches what no libc hook can see (raw `syscall(SYS_munmap)`, brk
//! shrinking by glibc's internal `__sbrk`, other libraries' private syscall stubs) for ranges a
//! [`UffdWatcher`] watches.
//!
//! - Mode WP only: registering does not take over page faults (nothing is ever write-protected).
//! - Exactly the pinned ranges are registered, and only while pinned: the cache calls `watch` after
//!   each cached pin and one `unwatch` with the same values when that region is unpinned. A pinned
//!   range is already its own VMA(s) (mlock sets VM_LOCKED, `ibv_reg_mr` MADV_DONTFORK), so
//!   registering it splits nothing the pin did not split, and unregistering at unpin lets the
//!   kernel merge the VMAs back. Nothing outside a watched range is ever registered: registering a
//!   whole VMA read from /proc/self/maps (the old way) raced with other threads mapping and
//!   unmapping next to it, split their mappings and made their `mremap` fail with EFAULT.
//! - `watch` always issues UFFDIO_REGISTER (a no-op in the kernel for what this context already
//!   has). No "already registered" state is trusted: another thread may have unmapped the range
//!   and mapped new memory there before the reader even read the UNMAP event, and that new memory
//!   must be registered too, or its own unmap goes unseen.
//! - A process-wide count of live watches per address ([`RangeCounts`], under [`STATE`]'s mutex,
//!   updated together with the ioctls) decides what `unwatch` unregisters: only what no live watch
//!   covers any more (two caches may pin the same pages).
//! - A watch whose memory was unmapped or moved away is stale: its `unwatch` may come much later
//!   (a region is unpinned when its cache next drains, or when its holder releases it), and until
//!   then its count would keep registered whatever memory was mapped there since, splitting the
//!   new owner's mapping (its `mremap` then fails with EFAULT; since Linux 6.17 a same-size
//!   MREMAP_FIXED move of several VMAs even moves the part before the registered one first). So
//!   the reader puts every unmapped/moved range into a ring, and each `watch`/`unwatch` first
//!   marks the watches over them stale ([`sync_events`]); a stale watch no longer counts. Its own
//!   `unwatch` then only unregisters what no live watch covers: UFFDIO_UNREGISTER of memory that
//!   is unmapped or not registered is a no-op.
//! - The kernel blocks a thread that unmaps a registered range until the event is *read*, so the
//!   reader thread (`fh-uffd`) never waits for a lock: it reads a batch and runs the listeners.
//! - The event arrives *after* the pages are gone: between the unmap and the listener call, a
//!   cache could still hand out the stale registration. [`quiesce`] closes that for the thread
//!   that unmapped; only the synchronous hooks close it for other threads.
//! - If the reader cannot go on (poll/read error, its fd closed under it) userfaultfd is turned off
//!   for good and the fd closed, which unregisters everything (see [`retire`]).
//! - brk: when glibc trims the heap (`__sbrk` with a negative increment) the kernel sends UNMAP
//!   for the released part of a registered heap range.
//! - After fork the child's mappings are no longer registered (no EVENT_FORK) and the inherited
//!   context belongs to the parent: the child forgets the counts and opens its own fd on its first
//!   watch.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::Duration;

use libc::{c_int, c_long, c_ulong};

use super::guard::notify_guarded;
use super::maps;
use super::options::MonitorStatus;
use super::prune_ring::PruneRing;
use crate::rt::fork::{ForkHook, HeldAcrossFork};
use crate::rt::range_counts::RangeCounts;
use crate::rt::seam::UnmapEvent;

const UFFD_API: u64 = 0xAA;
const UFFDIO_API: c_ulong = 0xc018_aa3f;
const UFFDIO_REGISTER: c_ulong = 0xc020_aa00;
const UFFDIO_UNREGISTER: c_ulong = 0x8010_aa01;
const UFFDIO_ZEROPAGE: c_ulong = 0xc020_aa04;
const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
const UFFD_USER_MODE_ONLY: c_int = 1;

const FEATURE_EVENT_REMAP: u64 = 1 << 2;
const FEATURE_EVENT_REMOVE: u64 = 1 << 3;
const FEATURE_EVENT_UNMAP: u64 = 1 << 6;
const FEATURE_WP_HUGETLBFS_SHMEM: u64 = 1 << 12;
const WANTED: u64 =
    FEATURE_EVENT_REMAP | FEATURE_EVENT_REMOVE | FEATURE_EVENT_UNMAP | FEATURE_WP_HUGETLBFS_SHMEM;

const EVENT_REMAP: u8 = 0x14;
const EVENT_REMOVE: u8 = 0x15;
const EVENT_UNMAP: u8 = 0x16;

/// Smallest huge page size: a VMA aligned to it at both ends may be hugetlb (see
/// [`register_by_vma`]).
const HUGE_ALIGN: usize = 2 << 20;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioRegister {
    start: u64,
    len: u64,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
struct UffdioZeropage {
    start: u64,
    len: u64,
    mode: u64,
    zeropage: i64,
}

/// `struct uffd_msg`: event byte, padding, then a 24-byte union (we read three u64).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct UffdMsg {
    event: u8,
    _r1: u8,
    _r2: u16,
    _r3: u32,
    a: u64,
    b: u64,
    c: u64,
}

/// Watch-side state (the reader only ever `try_lock`s it, when it retires).
struct State {
    /// Process that opened `fd` (a forked child must not use its parent's context).
    pid: libc::pid_t,
    /// -1 once the reader retired and closed it: nothing is registered, nothing will be.
    fd: c_int,
    reader_started: bool,
    /// Live watches per address: what must stay registered.
    counts: RangeCounts,
    /// Every watch not yet unwatched, by [`WatchKey`].
    watches: BTreeMap<WatchKey, Watch>,
    /// Widest extent (asked or counted) of any watch so far: bounds the scan in
    /// [`forget_unmapped`].
    widest: usize,
}

/// (start, end) of the page span asked for, (start, end) of the span counted for it: the same
/// normally, wider for hugetlb (see [`register_by_vma`]), (0, 0) when nothing could be registered.
type WatchKey = (usize, usize, usize, usize);

/// How many watches with one key are live (counted in [`State::counts`]) or stale: some of their
/// memory was unmapped or moved away since (the reader saw it), so their registration has done its
/// job, and only their `unwatch` is still to come.
#[derive(Clone, Copy, Debug, Default)]
struct Watch {
    live: u32,
    stale: u32,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);
/// Ranges the reader saw unmapped or moved away, for [`sync_events`].
static RING: PruneRing = PruneRing::new();

static ACTIVE: AtomicBool = AtomicBool::new(false);
/// Set by the reader once its start-up (which may allocate: TLS) is over.
static READER_READY: AtomicBool = AtomicBool::new(false);
static FEATURES: AtomicU64 = AtomicU64::new(0);
static ERRNO: AtomicI32 = AtomicI32::new(0);
static REGISTERED: AtomicU64 = AtomicU64::new(0);
static UNSUPPORTED: AtomicU64 = AtomicU64::new(0);
static EVENTS: AtomicU64 = AtomicU64::new(0);
/// Reader progress, for [`quiesce`]: high 32 bits = batches started (raised before `read`), low
/// 32 bits = batches whose events were all dispatched. One word, so "idle" is one load.
static BATCHES: AtomicU64 = AtomicU64::new(0);
/// Pid of the process whose reader is running, 0 when none. A forked child (no reader) sees its
/// parent's pid here and never waits.
static READER_PID: AtomicI32 = AtomicI32::new(0);
/// Test hook: the reader treats its next wake-up as a failed `read` (see
/// [`test_fail_reader`]).
static FAIL_NEXT_READ: AtomicBool = AtomicBool::new(false);
static PAGE: AtomicUsize = AtomicUsize::new(0);

fn pack(started: u32, finished: u32) -> u64 {
    (started as u64) << 32 | finished as u64
}

/// Wait until every userfaultfd event the reader has already read is dispatched to the listeners.
///
/// Why: the kernel lets an unmapping thread continue as soon as its UNMAP event is *read*, before
/// the reader has told any listener. Without this, a registration made right after `munmap`
/// returned -- even on the same thread -- could still find the old region (seen on Soft-RoCE with
/// userfaultfd as the only path: munmap, mmap at the same address, register, stale hit). The
/// reader counts a batch as started before `read` and as finished once it is dispatched; a caller
/// waits only for the batch under way when it looked (not for a steady stream of later ones, which
/// cannot contain its own event). One load when idle; never blocks on a lock. Called by the glue
/// before a registration (`fh_register`, the shim), never by a listener.
#[inline]
pub fn quiesce() {
    let b = BATCHES.load(SeqCst);
    if (b >> 32) as u32 != b as u32 {
        quiesce_slow((b >> 32) as u32);
    }
}

#[cold]
fn quiesce_slow(started: u32) {
    if super::guard::in_hook() {
        return; // on the reader thread itself (or inside a hook): waiting would never end
    }
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    while READER_PID.load(SeqCst) == me {
        let finished = BATCHES.load(SeqCst) as u32;
        if finished.wrapping_sub(started) as i32 >= 0 {
            return;
        }
        std::thread::yield_now();
    }
}

pub fn fill_status(s: &mut MonitorStatus) {
    s.uffd = ACTIVE.load(SeqCst);
    s.uffd_features = FEATURES.load(SeqCst);
    s.uffd_errno = ERRNO.load(SeqCst);
    s.uffd_registered = REGISTERED.load(SeqCst);
    s.uffd_unsupported = UNSUPPORTED.load(SeqCst);
    s.uffd_events = EVENTS.load(SeqCst);
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn page() -> usize {
    let p = PAGE.load(SeqCst);
    if p != 0 {
        return p;
    }
    // SAFETY: sysconf has no preconditions.
    let p = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 && (n as usize).is_power_of_two() => n as usize,
        _ => 4096,
    };
    PAGE.store(p, SeqCst);
    p
}

/// [addr, addr+len) widened to whole pages; None if empty or past the end of the address space.
fn page_span(addr: usize, len: usize) -> Option<(usize, usize)> {
    let pg = page();
    let end = addr.checked_add(len)?.checked_add(pg - 1)? & !(pg - 1);
    let start = addr & !(pg - 1);
    (len != 0).then_some((start, end))
}

fn raw_uffd() -> Result<c_int, i32> {
    let flags = (libc::O_CLOEXEC | libc::O_NONBLOCK) as c_long;
    // SAFETY: userfaultfd takes only flags.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    if fd >= 0 {
        return Ok(fd as c_int);
    }
    let e = errno();
    if e != libc::EPERM {
        return Err(e);
    }
    // Unprivileged with vm.unprivileged_userfaultfd=0: user-mode-only faults are still allowed,
    // and we never handle faults anyway.
    // SAFETY: as above.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags | UFFD_USER_MODE_ONLY as c_long) };
    if fd >= 0 {
        Ok(fd as c_int)
    } else {
        Err(errno())
    }
}

fn api(fd: c_int, features: u64) -> Result<u64, i32> {
    let mut a = UffdioApi {
        api: UFFD_API,
        features,
        ioctls: 0,
    };
    // SAFETY: UFFDIO_API reads and writes the struct we pass.
    if unsafe { libc::ioctl(fd, UFFDIO_API, &mut a as *mut UffdioApi) } != 0 {
        return Err(errno());
    }
    Ok(a.features)
}

/// Open a userfaultfd with the event features we want (the handshake can be done once per fd,
/// so probe on a first fd, then enable on a second).
fn open_fd() -> Result<(c_int, u64), i32> {
    let probe = raw_uffd()?;
    let supported = api(probe, 0);
    // SAFETY: closing the fd we just opened.
    unsafe { libc::close(probe) };
    let want = WANTED & supported?;
    if want & FEATURE_EVENT_UNMAP == 0 {
        return Err(libc::ENOTSUP);
    }
    let fd = raw_uffd()?;
    match api(fd, want) {
        Ok(_) => Ok((fd, want)),
        Err(e) => {
            // SAFETY: as above.
            unsafe { libc::close(fd) };
            Err(e)
        }
    }
}

fn lock_state() -> std::sync::MutexGuard<'static, Option<State>> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Open the process's userfaultfd (idempotent). On failure, record errno and carry on without.
pub fn open() {
    let mut st = lock_state();
    ensure_open(&mut st);
}

fn ensure_open(st: &mut Option<State>) -> Option<c_int> {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    if let Some(s) = st.as_ref() {
        if s.pid == pid {
            return (s.fd >= 0).then_some(s.fd);
        }
        // Forked child: the inherited fd is the parent's context, and none of our mappings is
        // registered any more (the kernel drops registrations in the child without EVENT_FORK).
        // Drop the fd and the counts, and start over.
        if s.fd >= 0 {
            // SAFETY: closing our copy of the inherited fd.
            unsafe { libc::close(s.fd) };
        }
        *st = None;
        ACTIVE.store(false, SeqCst);
    }
    match open_fd() {
        Ok((fd, features)) => {
            FEATURES.store(features, SeqCst);
            ERRNO.store(0, SeqCst);
            // A forked child starts its own reader.
            READER_READY.store(false, SeqCst);
            READER_PID.store(0, SeqCst);
            BATCHES.store(0, SeqCst);
            RING.forget();
            ACTIVE.store(true, SeqCst);
            *st = Some(State {
                pid,
                fd,
                reader_started: false,
                counts: RangeCounts::default(),
                watches: BTreeMap::new(),
                widest: 0,
            });
            Some(fd)
        }
        Err(e) => {
            ERRNO.store(e, SeqCst);
            None
        }
    }
}

/// Start the reader once. Returns false if it could not be started (then nothing may be
/// registered: an unmap of it would wait forever for a reader).
fn ensure_reader(st: &mut State, fd: c_int) -> bool {
    if st.reader_started {
        return true;
    }
    // A plain pthread, not `std::thread`: std's thread start and exit take a process-wide mutex of
    // its own (its stack-overflow bookkeeping, `thread_info`), which no atfork handler covers, so
    // a child forked while any std thread of the parent was starting or ending hung here, in its
    // first `watch`, waiting for a reader that never got past std's start (seen with gdb;
    // `tests/fork_threads.rs`). Nothing here takes another lock of ours: STATE is held.
    let mut t: libc::pthread_t = 0;
    // SAFETY: `reader_main` takes the fd as its argument and never unwinds.
    let rc = unsafe {
        libc::pthread_create(
            &mut t,
            std::ptr::null(),
            reader_main,
            fd as isize as *mut libc::c_void,
        )
    };
    if rc != 0 {
        return false;
    }
    // SAFETY: a thread of ours, detached once; it is never joined.
    unsafe { libc::pthread_detach(t) };
    st.reader_started = true;
    // Register nothing before the reader is in its loop: while starting, it calls malloc, and a
    // thread that trims a registered heap does so holding malloc's arena lock and then waits for
    // the reader (seen as a deadlock with MALLOC_ARENA_MAX=1 before this wait).
    while !READER_READY.load(SeqCst) {
        std::thread::yield_now();
    }
    true
}

fn register(fd: c_int, start: usize, end: usize) -> Result<(), i32> {
    let mut r = UffdioRegister {
        start: start as u64,
        len: (end - start) as u64,
        mode: UFFDIO_REGISTER_MODE_WP,
        ioctls: 0,
    };
    // SAFETY: UFFDIO_REGISTER reads/writes the struct we pass; it changes VMA flags only.
    if unsafe { libc::ioctl(fd, UFFDIO_REGISTER, &mut r as *mut UffdioRegister) } == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}

fn unregister(fd: c_int, start: usize, end: usize) -> Result<(), i32> {
    let mut r = UffdioRange {
        start: start as u64,
        len: (end - start) as u64,
    };
    // SAFETY: UFFDIO_UNREGISTER reads the struct we pass; it changes VMA flags only.
    if unsafe { libc::ioctl(fd, UFFDIO_UNREGISTER, &mut r as *mut UffdioRange) } == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}

/// The mappings overlapping [start, end), from /proc/self/maps. Only the rare fallbacks below read
/// it (the answer can be stale by the time it is used; they only ever touch ranges inside a
/// watched span).
fn vmas_in(start: usize, end: usize) -> Vec<maps::Vma> {
    let mut v = Vec::new();
    maps::for_each_vma(|m| {
        if m.end > start && m.start < end {
            v.push(*m);
        }
        m.start < end
    });
    v
}

/// A [`crate::rt::seam::RangeWatcher`] that registers each pinned range with userfaultfd
/// (write-protect mode only, so no page fault is ever taken over) while it is pinned. Does nothing
/// unless [`super::install`] enabled userfaultfd.
#[derive(Clone, Copy, Debug, Default)]
pub struct UffdWatcher;

impl crate::rt::seam::RangeWatcher for UffdWatcher {
    fn watch(&self, addr: usize, len: usize) {
        watch(addr, len);
    }
    fn unwatch(&self, addr: usize, len: usize) {
        unwatch(addr, len);
    }
}

/// Count one more watch of the pages under [addr, addr+len) and register them. Returns how many
/// ranges were registered (1 normally; 0 if userfaultfd is off or refused all of it).
pub fn watch(addr: usize, len: usize) -> usize {
    if !ACTIVE.load(SeqCst) {
        return 0;
    }
    let Some((s, e)) = page_span(addr, len) else {
        return 0;
    };
    let mut guard = lock_state();
    let Some(fd) = ensure_open(&mut guard) else {
        return 0;
    };
    let st = guard.as_mut().expect("opened above");
    if !ensure_reader(st, fd) {
        return 0;
    }
    sync_events(st, fd);
    let (n, counted) = if register(fd, s, e).is_ok() {
        (1, (s, e))
    } else {
        register_by_vma(fd, s, e)
    };
    REGISTERED.fetch_add(n as u64, SeqCst);
    st.counts.add(counted.0, counted.1, 1);
    st.watches
        .entry((s, e, counted.0, counted.1))
        .or_default()
        .live += 1;
    let (lo, hi) = if counted.0 < counted.1 {
        (s.min(counted.0), e.max(counted.1))
    } else {
        (s, e)
    };
    st.widest = st.widest.max(hi - lo);
    n
}

/// Registering [s, e) in one ioctl failed: some mapping in it is refused (file-backed: EINVAL;
/// owned by another userfaultfd: EBUSY; VM_MAYWRITE missing: EPERM) or is hugetlb with a bound
/// inside a huge page (the kernel wants huge-page aligned bounds there: EINVAL). Retry per
/// mapping, from /proc/self/maps -- read on this path only. A mapping aligned to 2 MiB at both
/// ends whose piece still fails is tried whole (hugetlb mappings are aligned to their page size,
/// so that stays inside the one mapping and splits nobody's). Returns how many pieces were
/// registered and the span to count: the hull of those pieces, (0, 0) if none.
fn register_by_vma(fd: c_int, s: usize, e: usize) -> (usize, (usize, usize)) {
    let (mut n, mut lo, mut hi) = (0, usize::MAX, 0);
    for v in vmas_in(s, e) {
        let (mut a, mut b) = (s.max(v.start), e.min(v.end));
        let mut ok = register(fd, a, b).is_ok();
        let whole = (v.start, v.end);
        if !ok && (a, b) != whole && v.start % HUGE_ALIGN == 0 && v.end % HUGE_ALIGN == 0 {
            (a, b) = whole;
            ok = register(fd, a, b).is_ok();
        }
        if ok {
            n += 1;
            lo = lo.min(a);
            hi = hi.max(b);
        } else {
            UNSUPPORTED.fetch_add(1, SeqCst);
        }
    }
    if n == 0 {
        return (0, (0, 0));
    }
    (n, (lo, hi))
}

/// Undo one [`watch`] with the same arguments: unregister the pages no live watch covers now.
pub fn unwatch(addr: usize, len: usize) {
    if !ACTIVE.load(SeqCst) {
        return; // never on, or retired: nothing of ours is registered
    }
    let Some((s, e)) = page_span(addr, len) else {
        return;
    };
    let mut guard = lock_state();
    let Some(st) = guard.as_mut() else { return };
    // SAFETY: getpid has no preconditions.
    if st.fd < 0 || st.pid != unsafe { libc::getpid() } {
        return; // retired, or a forked child that has not watched yet: nothing registered here
    }
    let fd = st.fd;
    sync_events(st, fd);
    // Among the watches of this span, a stale one first: if this call is really for a live one,
    // that one stays registered until the last call for the span -- later, never too early. Among
    // live ones (the same span counted over different pieces: a watch made while part of the span
    // was unmapped registers only the rest), the one counted over the fewest pages: taking the
    // other's count would leave pages of a still-pinned range unregistered, so that a raw unmap
    // of them went unseen (a stale registration); taking this one's, if wrong, only keeps pages
    // registered until the other's `unwatch`.
    let keys = (s, e, 0, 0)..=(s, e, usize::MAX, usize::MAX);
    let pick = st
        .watches
        .range(keys.clone())
        .find(|(_, w)| w.stale > 0)
        .or_else(|| {
            st.watches
                .range(keys)
                .filter(|(_, w)| w.live > 0)
                .min_by_key(|(k, _)| k.3.saturating_sub(k.2))
        })
        .map(|(k, w)| (*k, *w));
    let Some((key, mut w)) = pick else {
        return; // not watched (userfaultfd was off then, or the child of a fork)
    };
    let (cs, ce) = (key.2, key.3);
    let runs = if w.stale > 0 {
        // Its counts were dropped when it went stale; its registration was left alone (see
        // `forget_unmapped`): unregister what no live watch covers now.
        w.stale -= 1;
        st.counts.zero_runs(cs, ce)
    } else {
        w.live -= 1;
        st.counts.sub(cs, ce, 1)
    };
    if w.live == 0 && w.stale == 0 {
        st.watches.remove(&key);
    } else {
        st.watches.insert(key, w);
    }
    for (a, b) in runs {
        unregister_unwatched(fd, a, b);
    }
}

/// Bring the watches up to date with every unmap that happened before this call, so that no
/// watch of memory that is gone keeps memory mapped there since registered (which would split the
/// new owner's mapping, and make its `mremap` fail).
///
/// The kernel queues an UNMAP event only after the unmap, so another thread may already have
/// mapped new memory at the same address; it counts the event as in flight from before the unmap
/// until the unmapping thread is released, after the reader read it (UFFDIO_ZEROPAGE answers
/// EAGAIN meanwhile -- asked with an empty range it does nothing else). So: wait until nothing is
/// in flight and the reader's batch is done (it puts what it read into [`RING`] before finishing
/// the batch), then mark the watches over those ranges stale. The wait is bounded (a thread
/// stuck in an unmap must not stop every registration); past it, a stale watch may stay counted
/// until its own `unwatch`. Costs one ioctl when nothing is in flight.
fn sync_events(st: &mut State, fd: c_int) {
    let b = BATCHES.load(SeqCst);
    if events_in_flight(fd) || (b >> 32) as u32 != b as u32 {
        settle(fd);
    }
    // A full ring dropped ranges (more than its 1024 unmaps of watched memory between two
    // calls here): their watches stay counted as live until their own `unwatch`, so their pages
    // stay registered longer, which reports more unmaps, never fewer. Marking every watch stale
    // instead would stop counting live ones, and an `unwatch` could then unregister pages still
    // pinned: a raw unmap of them would go unseen.
    let _dropped = RING.drain(|a, b| forget_unmapped(st, a, b));
}

/// An event of ours is between its unmap and the release of the thread that unmapped.
fn events_in_flight(fd: c_int) -> bool {
    let mut z = UffdioZeropage {
        start: 0,
        len: 0,
        mode: 0,
        zeropage: 0,
    };
    // SAFETY: the kernel checks "events in flight" (EAGAIN) first, then rejects the empty range
    // (EINVAL): nothing is ever mapped or changed.
    let r = unsafe { libc::ioctl(fd, UFFDIO_ZEROPAGE, &mut z as *mut UffdioZeropage) };
    r != 0 && errno() == libc::EAGAIN
}

#[cold]
fn settle(fd: c_int) {
    if super::guard::in_hook() {
        return;
    }
    const LIMIT: Duration = Duration::from_millis(50);
    let t0 = std::time::Instant::now();
    while events_in_flight(fd) {
        if t0.elapsed() > LIMIT {
            return;
        }
        std::thread::yield_now();
    }
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    let started = (BATCHES.load(SeqCst) >> 32) as u32;
    while READER_PID.load(SeqCst) == me
        && ((BATCHES.load(SeqCst) as u32).wrapping_sub(started) as i32) < 0
    {
        if t0.elapsed() > LIMIT {
            return;
        }
        std::thread::yield_now();
    }
}

/// [a, b) was unmapped or moved away: every live watch whose counted span overlaps it is stale.
/// Its counts go; its registration is left to its `unwatch` (the rest of it may still be
/// registered, and dropping it here would gain nothing).
fn forget_unmapped(st: &mut State, a: usize, b: usize) {
    if a >= b || !st.counts.any_in(a, b) {
        return; // no live watch there
    }
    let lo = a.saturating_sub(st.widest);
    let hi = b.saturating_add(st.widest);
    let hit: Vec<WatchKey> = st
        .watches
        .range((lo, 0, 0, 0)..(hi, 0, 0, 0))
        .filter(|(k, w)| w.live > 0 && k.2 < b && a < k.3)
        .map(|(k, _)| *k)
        .collect();
    for k in hit {
        if let Some(w) = st.watches.get_mut(&k) {
            st.counts.sub(k.2, k.3, w.live);
            w.stale += w.live;
            w.live = 0;
        }
    }
}

/// Unregister [a, b), which no live watch covers. Usually one ioctl. It fails (EINVAL) when
/// nothing is mapped there any more -- the common way: the pinned memory was unmapped before it
/// was released -- and when some mapping there is one the ioctl refuses (file-backed, another
/// userfaultfd's, hugetlb cut inside a huge page): a watch that spanned such a mapping, or memory
/// mapped there since. Only in the second case can a piece of ours still be registered, and only
/// if all of [a, b) is mapped (`msync(MS_ASYNC)` fails with ENOMEM on any hole and writes nothing
/// back): then unregister mapping by mapping, from /proc/self/maps.
fn unregister_unwatched(fd: c_int, a: usize, b: usize) {
    if unregister(fd, a, b).is_ok() {
        return;
    }
    // SAFETY: msync with MS_ASYNC only checks the range (page aligned) is mapped.
    if unsafe { libc::msync(a as *mut libc::c_void, b - a, libc::MS_ASYNC) } != 0 {
        return;
    }
    for v in vmas_in(a, b) {
        let _ = unregister(fd, a.max(v.start), b.min(v.end));
    }
}

/// Test hook: make the reader fail as if its next `read` had failed, to prove that a dead reader
/// leaves nothing registered (an unmap of a registered range would otherwise wait forever).
/// Userfaultfd stays off in this process afterwards.
pub fn test_fail_reader() {
    FAIL_NEXT_READ.store(true, SeqCst);
}

/// Entry of the `fh-uffd` thread (see [`ensure_reader`]); `arg` is the fd. A panic in the reader
/// (a listener's) takes the reader's failure path: it keeps reading and dispatching until it can
/// [`retire`], so no unmap waits forever for an event nobody reads.
extern "C" fn reader_main(arg: *mut libc::c_void) -> *mut libc::c_void {
    let fd = arg as isize as c_int;
    // SAFETY: naming this thread (at most 15 bytes and the NUL): prctl, no allocation.
    unsafe { libc::pthread_setname_np(libc::pthread_self(), c"fh-uffd".as_ptr()) };
    let mut dying = None;
    loop {
        let run = std::panic::AssertUnwindSafe(|| reader(fd, &mut dying));
        if std::panic::catch_unwind(run).is_ok() {
            break;
        }
        // The batch under way is over: nobody may wait for the rest of it (see `quiesce`).
        let started = (BATCHES.load(SeqCst) >> 32) as u32;
        BATCHES.store(pack(started, started), SeqCst);
        fail(&mut dying, true, libc::EIO);
    }
    std::ptr::null_mut()
}

/// The `fh-uffd` thread: poll, read a batch, notify. Never waits for a lock and never allocates
/// in the loop. `dying`: Some(fd_still_ours) once something failed (see `retire`); kept by the
/// caller across a panic.
fn reader(fd: c_int, dying: &mut Option<bool>) {
    const BATCH: usize = 64;
    let mut msgs = [UffdMsg::default(); BATCH];
    // Touch the thread-locals the loop uses now (a dlopen'ed library's TLS may be allocated on
    // first use), then declare the thread ready: from here on nothing allocates or locks.
    let _ = super::guard::in_hook();
    let _ = errno();
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    READER_PID.store(me, SeqCst);
    READER_READY.store(true, SeqCst);
    let mut done: u32 = BATCHES.load(SeqCst) as u32;
    loop {
        if let Some(fd_ours) = *dying {
            if retire(fd, fd_ours, me) {
                break;
            }
            if !fd_ours {
                // The fd number is not ours any more: nothing to read; the context is gone or
                // goes with whoever holds it.
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
        }
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let timeout = if dying.is_some() { 1 } else { -1 };
        // SAFETY: one pollfd on our stack.
        let r = unsafe { libc::poll(&mut pfd, 1, timeout) };
        if r < 0 {
            let e = errno();
            if e != libc::EINTR {
                fail(dying, true, e);
            }
            continue;
        }
        if r == 0 {
            continue;
        }
        if pfd.revents & libc::POLLNVAL != 0 {
            // Someone closed our fd number: it may already name someone else's file.
            fail(dying, false, libc::EBADF);
            continue;
        }
        if pfd.revents & libc::POLLERR != 0 {
            fail(dying, true, libc::EIO);
            continue;
        }
        if FAIL_NEXT_READ.swap(false, SeqCst) {
            fail(dying, true, libc::EIO);
            continue;
        }
        // Before `read`: the unmapping thread is released by the read itself (see `quiesce`).
        BATCHES.store(pack(done.wrapping_add(1), done), SeqCst);
        // SAFETY: reading whole messages into our stack array.
        let n = unsafe { libc::read(fd, msgs.as_mut_ptr().cast(), std::mem::size_of_val(&msgs)) };
        let read_errno = if n < 0 { errno() } else { 0 };
        let count = if n > 0 {
            n as usize / std::mem::size_of::<UffdMsg>()
        } else {
            0
        };
        EVENTS.fetch_add(count as u64, SeqCst);
        // Before the batch counts as finished (see `sync_events`).
        for m in &msgs[..count] {
            match m.event {
                EVENT_UNMAP => RING.push(m.a as usize, m.b as usize),
                EVENT_REMAP => RING.push(m.a as usize, (m.a + m.c) as usize),
                _ => {}
            }
        }
        for m in &msgs[..count] {
            match m.event {
                // [start, end)
                EVENT_UNMAP | EVENT_REMOVE => {
                    notify_guarded(m.a as usize, (m.b - m.a) as usize, UnmapEvent::Late);
                }
                // from, to, len: the pages left `from`.
                EVENT_REMAP => {
                    notify_guarded(m.a as usize, m.c as usize, UnmapEvent::Late);
                }
                _ => {}
            }
        }
        done = done.wrapping_add(1);
        BATCHES.store(pack(done, done), SeqCst);
        if n < 0 && read_errno != libc::EAGAIN && read_errno != libc::EINTR {
            fail(dying, true, read_errno);
        }
    }
    BATCHES.store(pack(done, done), SeqCst);
    READER_PID.store(0, SeqCst);
}

/// The reader hit error `e`: from now on it only works towards [`retire`].
fn fail(dying: &mut Option<bool>, fd_ours: bool, e: i32) {
    if dying.is_none() {
        ERRNO.store(e, SeqCst);
    } else {
        std::thread::sleep(Duration::from_millis(1)); // failing again: do not spin
    }
    *dying = Some(dying.unwrap_or(true) && fd_ours);
}

/// The reader cannot go on: turn userfaultfd off for good in this process and leave nothing
/// registered, or the next unmap of a registered range would wait forever for a reader.
///
/// `ACTIVE` goes false first, so no new `watch` gets past its first check. Then, under
/// [`STATE`]'s lock (so no `watch`/`unwatch` is between its check and its ioctl on this fd number),
/// the fd is closed: closing a userfaultfd releases its context, which unregisters every range it
/// had (`userfaultfd_release`) and wakes every thread waiting for its event to be read. The lock
/// is only tried: its holder may be inside malloc, trimming a registered heap and waiting for us
/// to read that event. Returns false if the lock was busy; the reader then keeps reading and
/// dispatching events and tries again. `fd_ours` false: the fd number was closed by someone else
/// and may name another file now: it is forgotten, not closed.
fn retire(fd: c_int, fd_ours: bool, me: libc::pid_t) -> bool {
    ACTIVE.store(false, SeqCst);
    let mut guard = match STATE.try_lock() {
        Ok(g) => g,
        Err(TryLockError::Poisoned(p)) => p.into_inner(),
        Err(TryLockError::WouldBlock) => return false,
    };
    if let Some(st) = guard.as_mut().filter(|st| st.pid == me && st.fd == fd) {
        // The counts stay as they are (nothing looks at them once `fd` is -1): clearing them
        // would call free() here, and a thread holding malloc's lock may be the one waiting for
        // an event (with `fd_ours` false nobody may ever read it).
        st.fd = -1;
    }
    if fd_ours {
        // SAFETY: the number is ours, and nobody uses it any more: `st.fd` is -1 and we hold the
        // lock, so no watch/unwatch is between its check and its ioctl.
        unsafe { libc::close(fd) };
    }
    true
}

/// Place 20 of `rt::fork`'s order (registered by `install`, which takes it under place 10):
/// `STATE` held across `fork`, so a child never inherits it locked by a thread that is gone.
pub(super) static FORK_HOOK: ForkHook = ForkHook {
    order: 20,
    prepare: || {
        // SAFETY: this hook's prepare, the lock just taken.
        unsafe { HELD.put(lock_state()) }
    },
    parent: || {
        // SAFETY: this hook's parent.
        drop(unsafe { HELD.take() })
    },
    child: || {
        // SAFETY: this hook's child.
        drop(unsafe { HELD.take() })
    },
};
static HELD: HeldAcrossFork<MutexGuard<'static, Option<State>>> = HeldAcrossFork::new();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_span_rounds_out_and_rejects_empty_or_overflow() {
        let pg = page();
        assert_eq!(page_span(pg + 1, 1), Some((pg, 2 * pg)));
        assert_eq!(page_span(pg, pg), Some((pg, 2 * pg)));
        assert_eq!(page_span(pg, 0), None);
        assert_eq!(page_span(usize::MAX - 10, 5), None);
    }

    #[test]
    fn quiesce_returns_when_idle_and_for_a_foreign_reader() {
        quiesce();
        // A batch marked started by a reader of another process (as a forked child inherits it):
        // no wait.
        let saved = (BATCHES.load(SeqCst), READER_PID.load(SeqCst));
        if saved.1 == 0 {
            BATCHES.store(pack(7, 6), SeqCst);
            READER_PID.store(1, SeqCst);
            quiesce();
            BATCHES.store(saved.0, SeqCst);
            READER_PID.store(saved.1, SeqCst);
        }
    }
}
