//! `MlockPinner`: pins with mlock(2) on hosts with no RDMA device.
//!
//! Keys are local-only cookies (lkey = rkey = a per-process counter): they identify the pin for
//! bookkeeping and tests but mean nothing to any NIC.
//!
//! Linux mlock is NOT reference counted: locking a page twice and unlocking it once leaves it
//! unlocked. Pins overlap (a detached region still in use next to the union that replaced it; two
//! caches over the same memory; a stale region whose memory went away and whose addresses now
//! hold another cache's live region), so every pinner of the process shares one count of locked
//! pages per address, and `unpin` unlocks only what no live pin still covers. Without it, a stale
//! unpin unlocked part of a live region: its mapping was then split by lock state, and the
//! application's `mremap` of it failed with EFAULT (seen in `case6_stale_threads`).
//!
//! The count must also forget a pin whose memory went away. A cache unpins an invalidated
//! region at its next call, after the unmap; meanwhile the addresses may hold a new mapping, and
//! a pin of it, made and undone, would leave the old pin's pages locked (still counted) and the
//! rest not: the same split, and the same EFAULT (the form of a failure `case6_stale_threads_helper`
//! showed once in CI, one round in 2400, where the helper unpins idle regions ahead;
//! `c-tests/stale_pin_mremap.c` replays it). So the monitor's post-unmap events
//! reach the count ([`GoneFeed`], subscribed once per process by whoever assembles a cache):
//! every pin over the range made before the unmap is stale from then on, its count goes (no
//! munlock: those pages are gone), and its `unpin` unlocks only pages no live pin covers.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crossbeam_queue::ArrayQueue;

use super::{Access, PinError, Pinned, Pinner};
use crate::rt::fork::{self, ForkHook, HeldAcrossFork};
use crate::rt::race_once::RaceOnce;
use crate::rt::range_counts::RangeCounts;
use crate::rt::seam::{MemoryListener, UnmapEvent};

#[derive(Default)]
pub struct MlockPinner {
    next_key: AtomicU32,
}

/// Live pins per address, for every `MlockPinner` of the process, and the pins themselves. The
/// mutex also orders each mlock/munlock with its count update (a leaf lock: nothing is called
/// out while it is held but the two system calls).
static LOCKED: Mutex<Locked> = Mutex::new(Locked::new());

struct Locked {
    /// How many live pins cover each page.
    counts: RangeCounts,
    /// Every pin not undone yet, by (start, end, sequence number, which is its `Pinned::token`):
    /// true once it is stale (its memory went away; its count was dropped then).
    pins: BTreeMap<(usize, usize, usize), bool>,
    /// The longest pinned range so far (bounds the scan for pins overlapping a range).
    widest: usize,
}

impl Locked {
    const fn new() -> Self {
        Locked {
            counts: RangeCounts::new(),
            pins: BTreeMap::new(),
            widest: 0,
        }
    }

    /// Take in the ranges [`GoneFeed`] heard of.
    fn sync_gone(&mut self) {
        if GONE_DEAD.load(Ordering::Acquire) {
            return;
        }
        let Some(q) = GONE.get() else { return };
        while let Some((s, e, before)) = q.pop() {
            self.forget(s, e, before);
        }
    }

    /// [s, e) went away after every pin numbered below `before` was made: those that overlap it
    /// are stale. Their counts go now, without an munlock (the kernel dropped their locks with
    /// the pages; whatever is mapped there now is someone else's).
    fn forget(&mut self, s: usize, e: usize, before: usize) {
        if s >= e || !self.counts.any_in(s, e) {
            return;
        }
        let lo = s.saturating_sub(self.widest);
        let hits: Vec<(usize, usize, usize)> = self
            .pins
            .range((lo, 0, 0)..(e, 0, 0))
            .filter(|(&(ps, pe, seq), &stale)| !stale && seq < before && ps < e && s < pe)
            .map(|(k, _)| *k)
            .collect();
        for k in hits {
            self.counts.sub(k.0, k.1, 1);
            self.pins.insert(k, true);
        }
    }
}

fn locked() -> MutexGuard<'static, Locked> {
    LOCKED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sequence number of the next pin (taken under `LOCKED`, right before its mlock).
static NEXT_PIN: AtomicUsize = AtomicUsize::new(0);

/// Ranges whose memory went away, each with the `NEXT_PIN` of before the unmap, pushed from
/// hook context by [`GoneFeed`] and taken in under `LOCKED` at the next pin or unpin. Made by
/// the first `MlockPinner` (never in a hook: it allocates; `RaceOnce`: a child forked during
/// the making must not wait for it).
static GONE: RaceOnce<ArrayQueue<(usize, usize, usize)>> = RaceOnce::new();
const GONE_CAPACITY: usize = 1024;
/// In a forked child: `GONE` may hold a push that a parent thread never finished, so the child
/// stops using it (its pins are counted as before the feed).
static GONE_DEAD: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// `NEXT_PIN` when this thread's patched call announced its unmap (`UnmapEvent::Before`),
    /// for the `Done` that follows on the same thread: a pin made after that announcement may
    /// be of the memory mapped there since, and stays live.
    static BEFORE: Cell<usize> = const { Cell::new(0) };
}

/// The monitor's events, told to the count of locked pages (see the module doc). One per
/// process is enough: the count is the process's. Hook-safe: a queue push, no allocation, no
/// lock.
pub struct GoneFeed;

impl GoneFeed {
    fn push(s: usize, e: usize, before: usize) {
        // (In a forked child a parent thread may have left a pop half done: a push could wait
        // for that slot for good.)
        if GONE_DEAD.load(Ordering::Acquire) {
            return;
        }
        if let Some(q) = GONE.get() {
            // Full (more than its capacity of unmaps between two pins or unpins): the range is
            // dropped, and the pins over it stay counted until their own unpin, as without the
            // feed (pages locked longer, the split this prevents possible again).
            let _ = q.push((s, e, before));
        }
    }
}

impl MemoryListener for GoneFeed {
    fn on_unmap(&self, addr: usize, len: usize) {
        self.on_event(addr, len, UnmapEvent::Told);
    }

    fn on_event(&self, addr: usize, len: usize, ev: UnmapEvent) {
        let now = NEXT_PIN.load(Ordering::SeqCst);
        let e = addr.saturating_add(len);
        match ev {
            // The pages are still there: remember which pins came before, for the `Done`.
            UnmapEvent::Before => {
                let _ = BEFORE.try_with(|b| b.set(now));
            }
            UnmapEvent::Done | UnmapEvent::DoneInLibcTrim => {
                let before = BEFORE.try_with(|b| b.get()).unwrap_or(0);
                Self::push(addr, e, before);
            }
            // After the unmap (userfaultfd), told by the application, or new memory handed out
            // by a patched call before its caller sees it: every pin so far.
            UnmapEvent::Late | UnmapEvent::Told | UnmapEvent::Fresh => Self::push(addr, e, now),
        }
    }

    fn wants_done(&self) -> bool {
        true
    }
}

/// Place 50 of `rt::fork`'s order: `LOCKED`, held across `fork` (nothing is locked under it).
/// The child starts with no page locked (mlock is not inherited), so it starts with no count
/// either.
static FORK_HOOK: ForkHook = ForkHook {
    order: 50,
    prepare: || {
        // SAFETY: this hook's prepare, the lock just taken.
        unsafe { HELD.put(locked()) }
    },
    parent: || {
        // SAFETY: this hook's parent.
        drop(unsafe { HELD.take() })
    },
    child: || {
        // SAFETY: this hook's child.
        if let Some(mut g) = unsafe { HELD.take() } {
            *g = Locked::new();
        }
        GONE_DEAD.store(true, Ordering::Release);
    },
};
static HELD: HeldAcrossFork<MutexGuard<'static, Locked>> = HeldAcrossFork::new();

impl MlockPinner {
    pub fn new() -> Self {
        // A child forked while another thread held `LOCKED` would hang in its first pin.
        fork::register(&FORK_HOOK);
        let _ = GONE.get_or_init(|| ArrayQueue::new(GONE_CAPACITY));
        Self::default()
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

impl Pinner for MlockPinner {
    fn pin(&self, addr: usize, len: usize, _access: Access) -> Result<Pinned, PinError> {
        // Inside the library while `LOCKED` is held: if the count table's growth frees memory
        // that a helper is pinning ahead of, this thread's unmap must not wait for that pin,
        // which needs `LOCKED` (`helper/pins_ahead.rs`).
        let _in = crate::rt::inside::enter();
        let mut g = locked();
        g.sync_gone();
        let seq = NEXT_PIN.fetch_add(1, Ordering::SeqCst);
        // Always locked, counted or not: a count left by a stale pin says nothing of the memory
        // mapped there now.
        // SAFETY: mlock only changes residency of the calling process's pages; an invalid range
        // is reported through errno (ENOMEM for unmapped), never a fault.
        let rc = unsafe { libc::mlock(addr as *const libc::c_void, len) };
        if rc == 0 {
            g.counts.add(addr, addr + len, 1);
            g.pins.insert((addr, addr + len, seq), false);
            g.widest = g.widest.max(len);
        }
        drop(g);
        if rc != 0 {
            let e = errno();
            // ENOMEM is ambiguous: RLIMIT_MEMLOCK exceeded or part of the range unmapped. An
            // unmapped range must not be "evict and retry" forever, so tell them apart.
            return Err(match e {
                libc::EAGAIN => PinError::NoMemory(e),
                libc::ENOMEM if range_is_mapped(addr, len) => PinError::NoMemory(e),
                _ => PinError::Failed(e),
            });
        }
        let key = self
            .next_key
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_add(1);
        Ok(Pinned {
            token: seq,
            lkey: key,
            rkey: key,
        })
    }

    fn unpin(&self, pinned: Pinned, addr: usize, len: usize) {
        let _in = crate::rt::inside::enter(); // as in `pin`
        let mut g = locked();
        g.sync_gone();
        let end = addr + len;
        let munlock = |s: usize, e: usize| {
            // SAFETY: munlock of an unmapped (already invalidated) range just fails with ENOMEM.
            let _ = unsafe { libc::munlock(s as *const libc::c_void, e - s) };
        };
        match g.pins.remove(&(addr, end, pinned.token)) {
            Some(false) => g.counts.sub_each(addr, end, 1, munlock),
            // Stale (its count went with its memory), or unknown (a forked child's count starts
            // empty): unlock what no live pin covers, of whatever is mapped there now.
            Some(true) | None => {
                for (s, e) in g.counts.zero_runs(addr, end) {
                    munlock(s, e);
                }
            }
        }
    }

    fn memory_listener(&self) -> Option<Arc<dyn MemoryListener>> {
        Some(Arc::new(GoneFeed))
    }

    fn name(&self) -> &'static str {
        "mlock"
    }
}

/// True if every page of `[addr, addr+len)` is mapped (mincore fails with ENOMEM otherwise).
fn range_is_mapped(addr: usize, len: usize) -> bool {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    let mut vec = [0u8; 256];
    let mut a = addr & !(page - 1);
    let end = addr.saturating_add(len);
    while a < end {
        let n = ((end - a).div_ceil(page)).min(vec.len());
        // SAFETY: `vec` has room for `n` entries; mincore checks the range and reports ENOMEM for
        // unmapped pages instead of faulting.
        let rc = unsafe { libc::mincore(a as *mut libc::c_void, n * page, vec.as_mut_ptr()) };
        if rc != 0 {
            return false;
        }
        a += n * page;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh anonymous mapping of `len` bytes: anywhere (`at` 0), or straight over `at`
    /// (MAP_FIXED: the old mapping there and its locks go, with no window for another thread).
    fn map_at(at: usize, len: usize) -> usize {
        let fixed = if at == 0 { 0 } else { libc::MAP_FIXED };
        // SAFETY: an anonymous private mapping; with `at`, over a mapping of the calling test.
        let p = unsafe {
            libc::mmap(
                at as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | fixed,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        assert!(at == 0 || p as usize == at);
        p as usize
    }

    fn map(len: usize) -> usize {
        map_at(0, len)
    }

    #[test]
    fn pins_mapped_memory_and_rejects_unmapped() {
        let m = MlockPinner::new();
        let a = map(3 * 4096);
        let p = m
            .pin(a, 4096, Access::LOCAL_WRITE)
            .expect("mlock of a mapped page");
        let q = m.pin(a + 4096, 4096, Access::LOCAL_WRITE).unwrap();
        assert_ne!(p.lkey, q.lkey);
        assert_eq!(p.lkey, p.rkey);
        m.unpin(p, a, 4096);
        m.unpin(q, a + 4096, 4096);
        // Unmapped memory is a hard failure, not a retryable NoMemory. The page at 4096 lies below
        // vm.mmap_min_addr, so nothing can be mapped there (a range we unmap ourselves may be
        // mapped again at once by another test thread of this process).
        assert!(matches!(
            m.pin(4096, 4096, Access(0)),
            Err(PinError::Failed(_))
        ));
        // SAFETY: unmapping our own mapping.
        unsafe { libc::munmap(a as *mut libc::c_void, 3 * 4096) };
        // munlock of the now-unmapped range must not crash.
        m.unpin(q, a, 4096);
    }

    /// Whether every page of the range is locked (VmFlags "lo" of its mapping(s) in smaps).
    fn locked_now(addr: usize, len: usize) -> bool {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut cur: Option<(usize, usize)> = None;
        let mut covered = Vec::new();
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((a, b)) = range.split_once('-') {
                    if let (Ok(a), Ok(b)) =
                        (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                    {
                        cur = Some((a, b));
                        continue;
                    }
                }
            }
            if let (Some(flags), Some((a, b))) = (line.strip_prefix("VmFlags:"), cur) {
                if b > addr && a < addr + len && flags.split_whitespace().any(|f| f == "lo") {
                    covered.push((a.max(addr), b.min(addr + len)));
                }
            }
        }
        covered.sort();
        let mut at = addr;
        for (a, b) in covered {
            if a > at {
                return false;
            }
            at = at.max(b);
        }
        at >= addr + len
    }

    /// Whether any page of the range is locked.
    fn any_locked(addr: usize, len: usize) -> bool {
        (0..len / 4096).any(|i| locked_now(addr + i * 4096, 4096))
    }

    /// New memory straight over `[a, a + len)` (as a munmap and an mmap at the same address).
    fn replace(a: usize, len: usize) {
        map_at(a, len);
    }

    /// What a patched munmap/mmap(MAP_FIXED) tells the feed around its system call.
    fn patched_unmap(a: usize, len: usize, call: impl FnOnce()) {
        GoneFeed.on_event(a, len, UnmapEvent::Before);
        call();
        GoneFeed.on_event(a, len, UnmapEvent::Done);
    }

    /// A pin whose memory went away before it was undone (a cache unpins an invalidated region
    /// at its next call) must not keep the new mapping there locked once the new mapping's own
    /// pin is undone: part of it would stay locked, the mapping would be split in two by lock
    /// state, and an `mremap` of all of it would fail with EFAULT (`case6_stale_threads_helper`).
    #[test]
    fn a_pin_of_memory_that_went_away_keeps_nothing_of_the_next_mapping_locked() {
        let m = MlockPinner::new();
        let len = 8 * 4096;
        let a = map(len);
        let old = m.pin(a, 4 * 4096, Access(0)).unwrap();
        patched_unmap(a, len, || replace(a, len));
        let new = m.pin(a, len, Access(0)).unwrap();
        assert!(locked_now(a, len));
        m.unpin(new, a, len);
        assert!(!any_locked(a, len), "the old pin's pages stayed locked");
        // The whole mapping is one again: it moves in one piece.
        let q = map(len);
        // SAFETY: moves our own mapping over our own mapping `q`.
        let r = unsafe {
            libc::mremap(
                a as *mut libc::c_void,
                len,
                len,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                q as *mut libc::c_void,
            )
        };
        assert_eq!(r as usize, q, "mremap: {}", std::io::Error::last_os_error());
        // The old pin's own unpin, late, unlocks nothing of anyone's.
        let b = map(len);
        m.unpin(old, a, 4 * 4096);
        // SAFETY: our own mappings.
        unsafe {
            libc::munmap(q as *mut libc::c_void, len);
            libc::munmap(b as *mut libc::c_void, len);
        }
    }

    /// A pin made after an unmap was announced may be of the memory mapped there since (another
    /// thread mapped the hole and pinned before the unmapping thread's `Done`): it stays live, so
    /// undoing a third pin over the same pages does not unlock them.
    #[test]
    fn a_pin_made_after_the_unmap_began_stays_counted() {
        let m = MlockPinner::new();
        let len = 4 * 4096;
        let a = map(len);
        let old = m.pin(a, len, Access(0)).unwrap();
        GoneFeed.on_event(a, len, UnmapEvent::Before);
        replace(a, len);
        let new = m.pin(a, len, Access(0)).unwrap();
        GoneFeed.on_event(a, len, UnmapEvent::Done);
        let other = m.pin(a, len, Access(0)).unwrap();
        m.unpin(other, a, len);
        assert!(locked_now(a, len), "the new pin lost its lock");
        m.unpin(old, a, len);
        assert!(
            locked_now(a, len),
            "the stale pin's unpin unlocked a live pin's pages"
        );
        m.unpin(new, a, len);
        assert!(!any_locked(a, len));
        // SAFETY: our own mapping.
        unsafe { libc::munmap(a as *mut libc::c_void, len) };
    }

    /// New memory handed out by a patched `mmap` (`Fresh`, before its caller sees it): every pin
    /// over it so far is stale.
    #[test]
    fn fresh_memory_makes_earlier_pins_over_it_stale() {
        let m = MlockPinner::new();
        let len = 6 * 4096;
        let a = map(len);
        let old = m.pin(a + 4096, 2 * 4096, Access(0)).unwrap();
        replace(a, len);
        GoneFeed.on_event(a, len, UnmapEvent::Fresh);
        let new = m.pin(a, len, Access(0)).unwrap();
        m.unpin(new, a, len);
        assert!(!any_locked(a, len));
        m.unpin(old, a + 4096, 2 * 4096);
        // SAFETY: our own mapping.
        unsafe { libc::munmap(a as *mut libc::c_void, len) };
    }

    /// Two pinners (two caches) pin overlapping ranges; unpinning one leaves the pages the other
    /// still holds locked. (mlock itself does not count: without the shared count the second
    /// range lost its lock here, and with it its mapping was split in two by lock state.)
    #[test]
    fn an_unpin_never_unlocks_what_another_pin_holds() {
        let (m1, m2) = (MlockPinner::new(), MlockPinner::new());
        let a = map(4 * 4096);
        let p1 = m1.pin(a, 3 * 4096, Access(0)).unwrap();
        let p2 = m2.pin(a + 4096, 3 * 4096, Access(0)).unwrap();
        m1.unpin(p1, a, 3 * 4096);
        assert!(
            locked_now(a + 4096, 3 * 4096),
            "m2's pages must stay locked"
        );
        assert!(!locked_now(a, 4096), "the page only m1 held is unlocked");
        m2.unpin(p2, a + 4096, 3 * 4096);
        assert!(!locked_now(a, 4 * 4096));
        // SAFETY: unmapping our own mapping.
        unsafe { libc::munmap(a as *mut libc::c_void, 4 * 4096) };
    }
}
