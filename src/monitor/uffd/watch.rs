//! Watch counting: `watch`/`unwatch` register and unregister the pinned ranges, counted per
//! address across every watcher of the process, and keep the counts in step with what the reader
//! saw unmapped (`sync_events`).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use libc::c_int;

use super::super::maps;
use super::abi::{events_in_flight, open_fd, register, unregister};
use super::reader::reader_main;
use super::state::*;
use crate::rt::range_counts::RangeCounts;

/// Smallest huge page size: a VMA aligned to it at both ends may be hugetlb (see
/// [`register_by_vma`]).
const HUGE_ALIGN: usize = 2 << 20;

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

/// Open the process's userfaultfd (idempotent). On failure, record errno and carry on without.
pub(crate) fn open() {
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
/// unless `monitor::install` enabled userfaultfd.
#[derive(Clone, Copy, Debug, Default)]
pub struct UffdWatcher;

impl crate::rt::seam::RangeWatcher for UffdWatcher {
    fn watch(&self, addr: usize, len: usize) {
        if !ACTIVE.load(SeqCst) {
            return;
        }
        let t0 = std::time::Instant::now();
        watch(addr, len);
        add_elapsed(&WATCH_CALLS, &WATCH_NS, t0);
    }
    fn unwatch(&self, addr: usize, len: usize) {
        if !ACTIVE.load(SeqCst) {
            return;
        }
        let t0 = std::time::Instant::now();
        unwatch(addr, len);
        add_elapsed(&UNWATCH_CALLS, &UNWATCH_NS, t0);
    }
}

/// Count one call of `t0`'s duration (only watched and unwatched ranges pay the two clock reads:
/// a miss, an unpin).
fn add_elapsed(
    calls: &std::sync::atomic::AtomicU64,
    ns: &std::sync::atomic::AtomicU64,
    t0: std::time::Instant,
) {
    use std::sync::atomic::Ordering::Relaxed;
    calls.fetch_add(1, Relaxed);
    ns.fetch_add(
        u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX),
        Relaxed,
    );
}

/// Start the reader now rather than at the first watch (idempotent; nothing if userfaultfd is
/// off or refused). For a caller that knows registrations are coming (the shim, when the
/// application allocates a protection domain): the thread's start is then not paid by the first
/// registration. A forked child still starts its own at its first watch.
pub(crate) fn start_reader() {
    if !ACTIVE.load(SeqCst) {
        return;
    }
    let mut guard = lock_state();
    if let Some(fd) = ensure_open(&mut guard) {
        let st = guard.as_mut().expect("opened above");
        ensure_reader(st, fd);
    }
}

/// Count one more watch of the pages under [addr, addr+len) and register them. Returns how many
/// ranges were registered (1 normally; 0 if userfaultfd is off or refused all of it).
pub(crate) fn watch(addr: usize, len: usize) -> usize {
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
pub(crate) fn unwatch(addr: usize, len: usize) {
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

#[cold]
fn settle(fd: c_int) {
    if super::super::guard::in_hook() {
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
}
