//! `MlockPinner`: pins with mlock(2) on hosts with no RDMA device.
//!
//! Keys are local-only cookies (lkey = rkey = a per-process counter): they identify the pin for
//! bookkeeping and tests but mean nothing to any NIC.
//!
//! Linux mlock is NOT reference counted: locking a page twice and unlocking it once leaves it
//! unlocked. The cache can hold overlapping pins (a detached region still in use next to the union
//! that replaced it), so unpinning one can unlock pages the other still covers. We accept this and
//! keep no page refcount: with mlock, "pinned" only affects residency (the pages may be swapped
//! out), never correctness, since no device DMAs into them. The verbs backend (ibv_reg_mr) does
//! refcount pins per MR, so it has no such caveat.

use std::sync::atomic::{AtomicU32, Ordering};

use super::{Access, PinError, Pinned, Pinner};

#[derive(Default)]
pub struct MlockPinner {
    next_key: AtomicU32,
}

impl MlockPinner {
    pub fn new() -> Self {
        Self::default()
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

impl Pinner for MlockPinner {
    fn pin(&self, addr: usize, len: usize, _access: Access) -> Result<Pinned, PinError> {
        // SAFETY: mlock only changes residency of the calling process's pages; an invalid range
        // is reported through errno (ENOMEM for unmapped), never a fault.
        let rc = unsafe { libc::mlock(addr as *const libc::c_void, len) };
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
        // SAFETY: munlock of an unmapped (already invalidated) range just fails with ENOMEM.
        let _ = unsafe { libc::munlock(addr as *const libc::c_void, len) };
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
}
