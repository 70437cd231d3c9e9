//! Pins ahead in progress (the helper thread's prefetch), which a patched unmap of the same
//! memory waits for before its system call.
//!
//! Why: the helper pins memory nobody is registering at that moment. If the application unmaps
//! that memory while the pin runs and maps something new there, the pin (`mlock`, a userfaultfd
//! watch) lands partly on the new mapping. Undoing it afterwards restores the flags but not the
//! mapping: the kernel split it at the old range's edge, and its two parts, faulted in separately,
//! got different `anon_vma`s and never merge again. The application's next `mremap` of the whole
//! mapping then fails with EFAULT (`case6_stale_threads_helper`, under AddressSanitizer, about 1
//! run in 30). Checking the unmap log before and after the pin cannot close that: the unmap and
//! the new mapping can both happen between the two checks. So the patched unmaps wait: the
//! helper's pin and its check then run on the old memory, and the undo (`still_valid` answers
//! false, the unmap began) happens before the pages go.
//!
//! Protocol (Dekker, every access `SeqCst`): the helper announces its range here ([`enter`]),
//! then asks the unmap log whether an overlapping unmap began; a hook logs its unmap
//! (`unmap_log::begin`), then looks here ([`wait_for_overlapping`]). One of the two sees the
//! other: the helper gives up the pin, or the hook waits until the helper left ([`PinAhead`]'s
//! drop, after the pin and its undo or publication; a published region is then invalidated by the
//! hook's listeners, which run after the wait).
//!
//! Not waited for: a libc heap trim (glibc holds an arena mutex there, which the helper's next
//! `malloc` may need: `caller.rs`); a thread inside the library (`crate::rt::inside`: a C API call
//! may hold a cache's mutex, the mlock backend its count lock, and the helper threads are marked
//! for good, so two helpers never wait for each other); the thread that announced the pin (a
//! signal handler or an allocation of its own); and anything after `MAX_WAIT_NS` (a lock we do
//! not know of, e.g. in another allocator, or a cache's mutex held by a Rust-API caller: the
//! wait ends, and the unmap goes ahead as it did before this existed).
//! Unmaps by raw system calls are seen only after the fact (userfaultfd) and cannot wait.
//!
//! Hook-safe: fixed slots, atomics, `sched_yield`/`nanosleep`/the vDSO clock; no allocation, no
//! lock, no panic.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};

use super::unmap_log;
use crate::monitor::{set_unmap_windows, UnmapWindows};
use crate::rt::fork::{self, ForkHook};
use crate::rt::monotonic::monotonic_ns;

const SLOTS: usize = 64;

/// Longest wait of one unmap for the pins ahead it overlaps (ns).
pub(crate) const MAX_WAIT_NS: u64 = 1_000_000_000;

struct Slot {
    /// Odd while taken; each take and each release adds 1.
    gen: AtomicU64,
    /// The `gen` whose range and owner below are written (a taken slot whose `ready` is not its
    /// `gen` is still being filled in: treated as overlapping).
    ready: AtomicU64,
    start: AtomicUsize,
    end: AtomicUsize,
    /// `pthread_self()` of the pinning thread.
    owner: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    gen: AtomicU64::new(0),
    ready: AtomicU64::new(0),
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    owner: AtomicUsize::new(0),
};

static TABLE: [Slot; SLOTS] = [FREE; SLOTS];
/// Slots taken or being taken: a hook with nothing to wait for reads only this.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);
/// Unmaps that waited, and waits that ended at `MAX_WAIT_NS` (for tests and `fh_info`).
static WAITS: AtomicU64 = AtomicU64::new(0);
static WAITS_TIMED_OUT: AtomicU64 = AtomicU64::new(0);

fn me() -> usize {
    // SAFETY: pthread_self has no preconditions (a register read on Linux).
    unsafe { libc::pthread_self() as usize }
}

/// A pin ahead of `[start, end)` announced; dropping it withdraws the announcement.
#[must_use]
pub struct PinAhead {
    slot: usize,
    gen: u64,
}

/// Announce a pin ahead of `[start, end)` by this thread. `None` when all slots are taken (then
/// do not pin: nothing would make an unmap wait for it).
pub fn enter(start: usize, end: usize) -> Option<PinAhead> {
    install_unmap_windows();
    ACTIVE.fetch_add(1, SeqCst);
    for (i, s) in TABLE.iter().enumerate() {
        let g = s.gen.load(SeqCst);
        if g % 2 == 1 || s.gen.compare_exchange(g, g + 1, SeqCst, SeqCst).is_err() {
            continue;
        }
        s.start.store(start, SeqCst);
        s.end.store(end, SeqCst);
        s.owner.store(me(), SeqCst);
        s.ready.store(g + 1, SeqCst);
        return Some(PinAhead {
            slot: i,
            gen: g + 1,
        });
    }
    ACTIVE.fetch_sub(1, SeqCst);
    None
}

impl Drop for PinAhead {
    fn drop(&mut self) {
        let s = &TABLE[self.slot];
        // A forked child's reset may have freed the slot under us (the owner is then a thread of
        // the parent, not us); only the taker releases its own generation.
        if s.gen
            .compare_exchange(self.gen, self.gen + 1, SeqCst, SeqCst)
            .is_ok()
        {
            ACTIVE.fetch_sub(1, SeqCst);
        }
    }
}

/// What a hook sees in slot `s` for `[start, end)`.
enum Seen {
    Nothing,
    /// A pin ahead that overlaps (or one not filled in yet), of generation `gen`.
    Wait(u64),
}

fn look(s: &Slot, start: usize, end: usize, me: usize) -> Seen {
    loop {
        let g = s.gen.load(SeqCst);
        if g % 2 == 0 {
            return Seen::Nothing;
        }
        if s.ready.load(SeqCst) != g {
            return Seen::Wait(g);
        }
        let (a, b, who) = (
            s.start.load(SeqCst),
            s.end.load(SeqCst),
            s.owner.load(SeqCst),
        );
        if s.gen.load(SeqCst) != g {
            // Released (maybe taken again) while we read: that pin is over; look again.
            continue;
        }
        return if who == me || !(a < end && start < b) {
            Seen::Nothing
        } else {
            Seen::Wait(g)
        };
    }
}

fn pause(round: u32) {
    if round < 64 {
        // SAFETY: no preconditions.
        unsafe { libc::sched_yield() };
    } else {
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 20_000,
        };
        // SAFETY: a valid timespec; an early wake-up (signal) only shortens one pause.
        unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
    }
}

/// Whether any pin ahead is announced (or being announced) now. Read after `unmap_log::begin`,
/// it is the cheap half of the protocol: `false` means every pin announced later sees the unmap.
#[inline]
pub fn any() -> bool {
    ACTIVE.load(SeqCst) != 0
}

/// Called by a patched unmap of `[start, end)` after `unmap_log::begin` and before its
/// listeners and its system call: returns once no pin ahead by another thread overlaps the range,
/// or after `MAX_WAIT_NS`. Returns whether it waited.
pub fn wait_for_overlapping(start: usize, end: usize) -> bool {
    if ACTIVE.load(SeqCst) == 0 {
        return false;
    }
    wait_slow(start, end, MAX_WAIT_NS)
}

#[cold]
#[inline(never)]
fn wait_slow(start: usize, end: usize, max_ns: u64) -> bool {
    let me = me();
    let mut t0 = 0;
    let mut round = 0u32;
    for s in &TABLE {
        while let Seen::Wait(g) = look(s, start, end, me) {
            if t0 == 0 {
                t0 = monotonic_ns().max(1);
                WAITS.fetch_add(1, SeqCst);
            }
            if monotonic_ns().saturating_sub(t0) >= max_ns {
                WAITS_TIMED_OUT.fetch_add(1, SeqCst);
                return true;
            }
            // Until that pin is over (its slot's generation moves on).
            while s.gen.load(SeqCst) == g && monotonic_ns().saturating_sub(t0) < max_ns {
                pause(round);
                round = round.saturating_add(1);
            }
        }
    }
    t0 != 0
}

/// `(unmaps that waited, waits that ended at MAX_WAIT_NS)` since the start of the process.
pub fn waits() -> (u64, u64) {
    (WAITS.load(SeqCst), WAITS_TIMED_OUT.load(SeqCst))
}

/// What the monitor's hooks call around each patched unmap: the unmap log's window
/// (`unmap_log.rs`), and the wait for the pins ahead the unmap overlaps.
static WINDOWS: UnmapWindows = UnmapWindows {
    begin: unmap_log::begin,
    end: unmap_log::end,
    before_unmap,
};

/// Not for a thread inside the library: it may hold a cache's lock, which the pin needs.
fn before_unmap(start: usize, end: usize) {
    // `any` first: one load when no helper pins ahead (every hooked call pays it).
    if any() && !crate::rt::inside::is_inside() {
        wait_for_overlapping(start, end);
    }
}

/// Place 61 of `rt::fork`'s order (after the locks, with none of its own): the child withdraws
/// the announcements of the parent's helpers.
static FORK_HOOK: ForkHook = ForkHook {
    order: 61,
    prepare: fork::nothing,
    parent: fork::nothing,
    child: fork_child,
};

static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Make the monitor's patched unmaps log themselves in the unmap log and wait for the pins ahead
/// they overlap, and the atfork child handler repair both (idempotent). Called before the monitor
/// is installed (by `ffi` and the preload shim, so that no hooked unmap goes unlogged), by the
/// helper thread's start and by `enter`. Never from hook context, never with a lock of
/// `rt::fork`'s order held.
pub fn install_unmap_windows() {
    if INSTALLED.load(SeqCst) {
        return;
    }
    fork::register(&unmap_log::FORK_HOOK);
    fork::register(&FORK_HOOK);
    set_unmap_windows(&WINDOWS);
    INSTALLED.store(true, SeqCst);
}

/// In a forked child (the atfork child handler, one thread left): the parent's helper threads
/// are not here to withdraw their announcements, which would make every unmap of those ranges
/// wait `MAX_WAIT_NS`. No lock, no allocation.
fn fork_child() {
    for s in &TABLE {
        let g = s.gen.load(SeqCst);
        if g % 2 == 1 {
            s.gen.store(g + 1, SeqCst);
        }
    }
    ACTIVE.store(0, SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    // The table is process-wide: made-up high ranges no other test announces.
    const BASE: usize = 0x7ddd_0000_0000;

    /// An unmap of a range another thread pins ahead waits until that pin is withdrawn; one of a
    /// range next to it does not.
    #[test]
    fn an_overlapping_unmap_waits_for_the_pin_to_end() {
        let (a, b) = (BASE, BASE + 0x10000);
        let entered = Arc::new(AtomicBool::new(false));
        let left = Arc::new(AtomicBool::new(false));
        let (e2, l2) = (entered.clone(), left.clone());
        let pinner = std::thread::spawn(move || {
            let g = enter(a, b).expect("a free slot");
            e2.store(true, SeqCst);
            std::thread::sleep(Duration::from_millis(150));
            l2.store(true, SeqCst);
            drop(g);
        });
        while !entered.load(SeqCst) {
            std::thread::yield_now();
        }
        let t = Instant::now();
        assert!(!wait_for_overlapping(b, b + 0x1000), "adjacent: no wait");
        assert!(t.elapsed() < Duration::from_millis(100));
        assert!(wait_for_overlapping(b - 0x1000, b + 0x1000));
        assert!(left.load(SeqCst), "returned before the pin was withdrawn");
        pinner.join().unwrap();
        assert!(!wait_for_overlapping(a, b), "withdrawn: no wait");
    }

    /// The announcing thread's own unmaps never wait for it (they would wait for themselves).
    #[test]
    fn the_pinning_thread_does_not_wait_for_itself() {
        let (a, b) = (BASE + 0x100000, BASE + 0x110000);
        let g = enter(a, b).expect("a free slot");
        let t = Instant::now();
        assert!(!wait_slow(a, b, 50_000_000));
        assert!(t.elapsed() < Duration::from_millis(40));
        drop(g);
    }

    /// A pin that never ends stops holding an unmap after the bound.
    #[test]
    fn a_wait_ends_at_its_bound() {
        let (a, b) = (BASE + 0x200000, BASE + 0x210000);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
        let h = std::thread::spawn(move || {
            let g = enter(a, b).expect("a free slot");
            ready_tx.send(()).unwrap();
            rx.recv().unwrap();
            drop(g);
        });
        ready_rx.recv().unwrap();
        let (_, out0) = waits();
        let t = Instant::now();
        assert!(wait_slow(a, b, 30_000_000));
        let dt = t.elapsed();
        assert!(
            dt >= Duration::from_millis(30) && dt < Duration::from_secs(5),
            "{dt:?}"
        );
        assert!(waits().1 > out0);
        tx.send(()).unwrap();
        h.join().unwrap();
    }
}
