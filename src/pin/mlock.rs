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

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::{Access, PinError, Pinned, Pinner};
use crate::rt::fork::{self, ForkHook, HeldAcrossFork};
use crate::rt::range_counts::RangeCounts;

#[derive(Default)]
pub struct MlockPinner {
    next_key: AtomicU32,
}

/// Live pins per address, for every `MlockPinner` of the process. The mutex also orders each
/// mlock/munlock with its count update (a leaf lock: nothing is called out while it is held but
/// the two system calls).
static LOCKED: Mutex<RangeCounts> = Mutex::new(RangeCounts::new());

fn locked() -> std::sync::MutexGuard<'static, RangeCounts> {
    LOCKED.lock().unwrap_or_else(|e| e.into_inner())
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
            *g = RangeCounts::new();
        }
    },
};
static HELD: HeldAcrossFork<MutexGuard<'static, RangeCounts>> = HeldAcrossFork::new();

impl MlockPinner {
    pub fn new() -> Self {
        // A child forked while another thread held `LOCKED` would hang in its first pin.
        fork::register(&FORK_HOOK);
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
        let mut counts = locked();
        // Always locked, counted or not: a count left by a stale pin says nothing of the memory
        // mapped there now.
        // SAFETY: mlock only changes residency of the calling process's pages; an invalid range
        // is reported through errno (ENOMEM for unmapped), never a fault.
        let rc = unsafe { libc::mlock(addr as *const libc::c_void, len) };
        if rc == 0 {
            counts.add(addr, addr + len, 1);
        }
        drop(counts);
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
            token: 0,
            lkey: key,
            rkey: key,
        })
    }

    fn unpin(&self, _pinned: Pinned, addr: usize, len: usize) {
        let _in = crate::rt::inside::enter(); // as in `pin`
        locked().sub_each(addr, addr + len, 1, |s, e| {
            // SAFETY: munlock of an unmapped (already invalidated) range just fails with ENOMEM.
            let _ = unsafe { libc::munlock(s as *const libc::c_void, e - s) };
        });
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

    fn map(len: usize) -> usize {
        // SAFETY: anonymous private mapping, no preconditions.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        p as usize
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
