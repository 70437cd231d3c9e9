//! Pinning backends: the one seam between the cache and whatever makes memory DMA-able.
//!
//! Owns: the `Pinner` trait, the backends, the mlock pinner's process-wide count of locked pages
//! (with its fork hook), what a cache does across `fork` (`fork_mode.rs`).
//! May call: `rt` (the mlock count hears memory events through `rt::seam`), libibverbs
//! (`verbs`), libc. Nothing above: the cache calls it, never back.
//!
//! `verbs` registers with `ibv_reg_mr` (real lkey/rkey), `mlock` pins with mlock(2) on hosts with no
//! RDMA device (keys are local-only cookies), `counting` is a test double that records every call.

pub mod counting;
pub mod fork_mode;
pub mod mlock;
pub mod null;
pub mod verbs;

use std::sync::Arc;

use crate::rt::seam::MemoryListener;

/// Access rights, bit-compatible with `enum ibv_access_flags` so they pass straight to verbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(pub u32);

impl Access {
    pub const LOCAL_WRITE: Access = Access(1);
    pub const REMOTE_WRITE: Access = Access(2);
    pub const REMOTE_READ: Access = Access(4);
    pub const REMOTE_ATOMIC: Access = Access(8);
    /// Memory windows may be bound over the region (`IBV_ACCESS_MW_BIND`); only the target's
    /// pins ask for it (`FH_MW`), never the cache (not in `ALL`).
    pub const MW_BIND: Access = Access(16);
    /// Every bit the cache understands; anything else is `FH_ERR_BAD_ACCESS`.
    pub const ALL: Access = Access(1 | 2 | 4 | 8);

    /// The rights an rkey carries onto the wire.
    pub(crate) const REMOTE: Access = Access(2 | 4 | 8);

    /// True when a registration made with `self` may serve a request for `want`: exactly the
    /// remote rights asked for (an rkey must never grant more than was asked: a key handed out
    /// for remote read must not also allow remote write), and at least the local ones.
    #[inline]
    pub fn covers(self, want: Access) -> bool {
        // No bit differs that is wanted or remote (one xor/or/and: this is on the hit path).
        (self.0 ^ want.0) & (want.0 | Self::REMOTE.0) == 0
    }

    /// Same remote rights (the class a registration's rkey belongs to).
    #[inline]
    pub(crate) fn same_remote(self, other: Access) -> bool {
        (self.0 ^ other.0) & Self::REMOTE.0 == 0
    }
    #[inline]
    pub fn union(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }
    #[inline]
    pub fn is_valid(self) -> bool {
        self.0 & !Self::ALL.0 == 0
    }
}

/// What a successful pin returns. `token` is backend-private (e.g. the `struct ibv_mr *`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pinned {
    pub token: usize,
    pub lkey: u32,
    pub rkey: u32,
}

/// Why a pin failed. `NoMemory` is the retryable kind: the cache evicts idle regions and retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinError {
    /// ENOMEM / EAGAIN: out of lockable memory or keys. Evict and retry.
    NoMemory(i32),
    /// Anything else (EFAULT for unmapped memory, EINVAL, EPERM...). Not retried.
    Failed(i32),
}

impl std::fmt::Display for PinError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PinError::NoMemory(e) => write!(f, "out of pinnable memory (errno {e})"),
            PinError::Failed(e) => write!(f, "pin failed (errno {e})"),
        }
    }
}

impl std::error::Error for PinError {}

/// A pinning backend. Implementations must be callable from any thread.
///
/// The cache only calls `pin`/`unpin` outside memory hooks and outside its read path; a backend may
/// allocate and block.
pub trait Pinner: Send + Sync {
    /// Pin `[addr, addr + len)` (page-aligned, `len > 0`) with `access`.
    fn pin(&self, addr: usize, len: usize, access: Access) -> Result<Pinned, PinError>;
    /// Undo one successful `pin`. `addr`/`len` are the same values that were pinned.
    /// The memory may already be unmapped (the region was invalidated): backends must not fault.
    fn unpin(&self, pinned: Pinned, addr: usize, len: usize);
    /// Short backend name for stats and logs ("verbs", "mlock", "counting").
    fn name(&self) -> &'static str;
    /// Memory events this backend must hear, whatever caches come and go: whoever assembles a
    /// cache subscribes it once per process (`assembly`). The mlock backend's count of locked
    /// pages learns there which pins' memory went away (`mlock::GoneFeed`). None by default.
    fn memory_listener(&self) -> Option<Arc<dyn MemoryListener>> {
        None
    }
}

#[cfg(test)]
mod access_tests {
    use super::Access;

    /// The hit path's one-expression `covers` is exactly "remote rights equal, local a superset".
    #[test]
    fn covers_is_equal_remote_and_superset_local() {
        for s in 0..16u32 {
            for w in 0..16u32 {
                let want = s & w == w && (s ^ w) & Access::REMOTE.0 == 0;
                assert_eq!(Access(s).covers(Access(w)), want, "{s:#x} covers {w:#x}");
            }
        }
    }
}
