//! userfaultfd event source: catches what no libc hook can see (raw `syscall(SYS_munmap)`, brk
//! shrinking by glibc's internal `__sbrk`, other libraries' private syscall stubs) for mappings
//! registered by [`UffdWatcher`].
//!
//! - Mode WP only: registering does not take over page faults (nothing is ever write-protected).
//! - Whole VMAs are registered (from /proc/self/maps): registering a sub-range would split the VMA
//!   and `mremap` across the split pieces fails with EFAULT.
//! - The kernel blocks a thread that unmaps a registered range until the event is *read*, so the
//!   reader thread (`fh-uffd`) never takes a lock: it reads a batch, publishes the ranges that are
//!   no longer registered into a lock-free ring, then runs the listeners.
//! - The event arrives *after* the pages are gone: between the unmap and the listener call, a
//!   cache could still hand out the stale registration. Only the synchronous hooks close that.
//! - brk: when glibc trims the heap (`__sbrk` with a negative increment) the kernel sends UNMAP
//!   for the released part of a registered `[heap]` VMA. Growing the heap creates a new VMA (a
//!   registered VMA does not merge with fresh brk memory); it is registered on its first watch.
//! - After fork the child shares the parent's userfaultfd context, which belongs to the parent's
//!   address space; the child opens its own on its first watch.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering::SeqCst};
use std::sync::Mutex;

use libc::{c_int, c_long, c_ulong};

use super::guard::notify_guarded;
use super::interval_set::IntervalSet;
use super::maps;
use super::prune_ring::PruneRing;
use super::MonitorStatus;

const UFFD_API: u64 = 0xAA;
const UFFDIO_API: c_ulong = 0xc018_aa3f;
const UFFDIO_REGISTER: c_ulong = 0xc020_aa00;
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

/// Miss-path state (never touched by the reader thread).
struct State {
    /// Process that opened `fd` (a forked child must not use its parent's context).
    pid: libc::pid_t,
    fd: c_int,
    reader_started: bool,
    registered: IntervalSet,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);
static RING: PruneRing = PruneRing::new();

static ACTIVE: AtomicBool = AtomicBool::new(false);
/// Set by the reader once its start-up (which allocates: thread name, TLS) is over.
static READER_READY: AtomicBool = AtomicBool::new(false);
static FEATURES: AtomicU64 = AtomicU64::new(0);
static ERRNO: AtomicI32 = AtomicI32::new(0);
static REGISTERED: AtomicU64 = AtomicU64::new(0);
static UNSUPPORTED: AtomicU64 = AtomicU64::new(0);
static EVENTS: AtomicU64 = AtomicU64::new(0);
/// Pid of the process whose reader is between "poll said readable" and "every event of the batch
/// it read was dispatched to the listeners"; 0 when idle. A pid, not a flag, so that a child forked
/// mid-dispatch (which has no reader) sees a foreign mark and never waits on it. See [`quiesce`].
static DISPATCHING: AtomicI32 = AtomicI32::new(0);

/// Wait until every userfaultfd event the reader has already read is dispatched to the listeners.
///
/// Why: the kernel lets an unmapping thread continue as soon as its UNMAP event is *read*, before
/// the reader has told any listener. Without this, a registration made right after `munmap`
/// returned -- even on the same thread -- could still find the old region (seen on Soft-RoCE with
/// userfaultfd as the only path: munmap, mmap at the same address, register, stale hit). The
/// reader raises the mark before `read`, so once `munmap` has returned, a caller either sees the
/// mark (and waits for it to drop) or sees the dispatch finished. One load when idle; never blocks
/// on a lock (the reader takes none). Called by the glue before a registration (`fh_register`, the
/// shim), never by a listener.
#[inline]
pub fn quiesce() {
    let d = DISPATCHING.load(SeqCst);
    if d != 0 {
        quiesce_slow(d);
    }
}

#[cold]
fn quiesce_slow(mut d: i32) {
    if super::guard::in_hook() {
        return; // on the reader thread itself (or inside a hook): waiting would never end
    }
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    while d == me {
        std::thread::yield_now();
        d = DISPATCHING.load(SeqCst);
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
            return Some(s.fd);
        }
        // Forked child: the inherited fd is the parent's context. Drop it and start over.
        // SAFETY: closing our copy of the inherited fd.
        unsafe { libc::close(s.fd) };
        *st = None;
        ACTIVE.store(false, SeqCst);
    }
    match open_fd() {
        Ok((fd, features)) => {
            FEATURES.store(features, SeqCst);
            ERRNO.store(0, SeqCst);
            ACTIVE.store(true, SeqCst);
            READER_READY.store(false, SeqCst); // a forked child starts its own reader
            *st = Some(State {
                pid,
                fd,
                reader_started: false,
                registered: IntervalSet::default(),
            });
            Some(fd)
        }
        Err(e) => {
            ERRNO.store(e, SeqCst);
            None
        }
    }
}

/// A [`crate::cache::RangeWatcher`] that registers the whole mapping(s) under a range with
/// userfaultfd (write-protect mode only, so no page fault is ever taken over), once. Does nothing
/// unless [`super::install`] enabled userfaultfd.
#[derive(Clone, Copy, Debug, Default)]
pub struct UffdWatcher;

impl crate::seam::RangeWatcher for UffdWatcher {
    fn watch(&self, addr: usize, len: usize) {
        watch(addr, len);
    }
    fn unwatch(&self, _addr: usize, _len: usize) {}
}

/// Register every VMA overlapping [addr, addr+len). Returns how many were newly registered.
pub fn watch(addr: usize, len: usize) -> usize {
    if !ACTIVE.load(SeqCst) || len == 0 {
        return 0;
    }
    let end = addr.saturating_add(len);
    let mut guard = lock_state();
    let Some(fd) = ensure_open(&mut guard) else {
        return 0;
    };
    let st = guard.as_mut().expect("opened above");
    // Forget ranges the reader saw unmapped. drain() waits for a batch in progress, so an unmap
    // that returned before this call is always accounted for.
    if RING.drain(|s, e| st.registered.remove(s, e)) {
        st.registered.clear();
    }
    if st.registered.covers(addr, end) {
        return 0;
    }
    if !st.reader_started {
        match std::thread::Builder::new()
            .name("fh-uffd".into())
            .spawn(move || reader(fd))
        {
            Ok(_) => st.reader_started = true,
            Err(_) => return 0, // no reader: registering would make munmap block forever
        }
        // Register nothing before the reader is in its loop: while starting, it calls malloc, and
        // a thread that trims a registered heap does so holding malloc's arena lock and then
        // waits for the reader (seen as a deadlock with MALLOC_ARENA_MAX=1 before this wait).
        while !READER_READY.load(SeqCst) {
            std::thread::yield_now();
        }
    }
    let mut vmas: Vec<maps::Vma> = Vec::new();
    maps::for_each_vma(|v| {
        if v.end > addr && v.start < end {
            vmas.push(*v);
        }
        v.start < end
    });
    let mut newly = 0;
    for v in vmas {
        if st.registered.covers(v.start, v.end) {
            continue;
        }
        let mut r = UffdioRegister {
            start: v.start as u64,
            len: (v.end - v.start) as u64,
            mode: UFFDIO_REGISTER_MODE_WP,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER reads/writes the struct we pass; it changes VMA flags only.
        if unsafe { libc::ioctl(fd, UFFDIO_REGISTER, &mut r as *mut UffdioRegister) } == 0 {
            st.registered.insert(v.start, v.end);
            REGISTERED.fetch_add(1, SeqCst);
            newly += 1;
        } else {
            // EINVAL: VMA type without WP support (file-backed, vdso, ...); EBUSY: another
            // userfaultfd owns it. Not remembered: we would get no event to forget it by.
            UNSUPPORTED.fetch_add(1, SeqCst);
        }
    }
    newly
}

/// The `fh-uffd` thread: poll, read a batch, publish what is no longer registered, notify.
/// Never takes a lock and never allocates in the loop.
fn reader(fd: c_int) {
    const BATCH: usize = 64;
    let mut msgs = [UffdMsg::default(); BATCH];
    // Touch the thread-locals the loop uses now (a dlopen'ed library's TLS may be allocated on
    // first use), then declare the thread ready: from here on nothing allocates or locks.
    let _ = super::guard::in_hook();
    let _ = errno();
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    READER_READY.store(true, SeqCst);
    loop {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd on our stack.
        let r = unsafe { libc::poll(&mut pfd, 1, -1) };
        if r < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            return;
        }
        if pfd.revents & (libc::POLLERR | libc::POLLNVAL) != 0 {
            return;
        }
        // Before `read`: the unmapping thread is released by the read itself (see `quiesce`).
        DISPATCHING.store(me, SeqCst);
        RING.begin();
        // SAFETY: reading whole messages into our stack array.
        let n = unsafe { libc::read(fd, msgs.as_mut_ptr().cast(), std::mem::size_of_val(&msgs)) };
        let count = if n > 0 {
            n as usize / std::mem::size_of::<UffdMsg>()
        } else {
            0
        };
        for m in &msgs[..count] {
            match m.event {
                EVENT_UNMAP => RING.push(m.a as usize, m.b as usize),
                EVENT_REMAP => RING.push(m.a as usize, (m.a + m.c) as usize),
                _ => {}
            }
        }
        RING.end();
        if n < 0 && errno() != libc::EAGAIN && errno() != libc::EINTR {
            DISPATCHING.store(0, SeqCst);
            return;
        }
        EVENTS.fetch_add(count as u64, SeqCst);
        for m in &msgs[..count] {
            match m.event {
                // [start, end)
                EVENT_UNMAP | EVENT_REMOVE => {
                    notify_guarded(m.a as usize, (m.b - m.a) as usize);
                }
                // from, to, len: the pages left `from`.
                EVENT_REMAP => {
                    notify_guarded(m.a as usize, m.c as usize);
                }
                _ => {}
            }
        }
        DISPATCHING.store(0, SeqCst);
    }
}

/// For the atfork handlers (`crate::fork`, lock 2 of its order): `STATE` held across `fork`, so a
/// child never inherits it locked by a thread that is gone.
pub(crate) fn fork_lock() -> impl std::any::Any {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}
