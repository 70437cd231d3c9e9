//! The two caches behind one small interface, so every measurement runs the exact same harness
//! code (monomorphised: no dynamic dispatch in the timed loops).

use std::sync::Arc;

use firehose::internals::cache::{Cache, Limits};
use firehose::internals::pin::{Access, Pinner};

/// Resolve-or-register and release, as a communication library calls a registration cache.
pub trait RegCache: Send + Sync {
    /// Short name printed in the `impl` column.
    fn name(&self) -> &'static str;
    /// Register (or find) `[addr, addr + len)`; `None` on failure.
    fn get(&self, addr: usize, len: usize) -> Option<u64>;
    /// Release one `get`.
    fn put(&self, handle: u64);
    /// Unpin every idle cached region (untimed housekeeping between measurements).
    fn flush(&self) {}
}

/// What both caches are asked for: a local-write + remote read/write registration
/// (UCX's side gets PROT_READ | PROT_WRITE, its equivalent).
pub const ACCESS: Access =
    Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0);

/// firehose's pin-down cache.
pub struct Ours {
    cache: Arc<Cache>,
}

impl Ours {
    pub fn new(pinner: Arc<dyn Pinner>, limits: Limits) -> Ours {
        Ours {
            cache: Cache::new(pinner, limits, None),
        }
    }
}

impl RegCache for Ours {
    fn name(&self) -> &'static str {
        "ours"
    }
    #[inline]
    fn get(&self, addr: usize, len: usize) -> Option<u64> {
        self.cache
            .register(addr, len, ACCESS)
            .ok()
            .map(|r| r.handle)
    }
    #[inline]
    fn put(&self, handle: u64) {
        let _ = self.cache.deregister(handle);
    }
    fn flush(&self) {
        self.cache.flush();
    }
}

/// Limits that keep everything (the hit rows): unbounded, like UCX's default.
pub fn unbounded() -> Limits {
    Limits {
        max_pinned: usize::MAX,
        max_regions: usize::MAX,
    }
}

/// Not a cache: a fixed ~15-20 ns of thread-private arithmetic per op and no shared state. Its
/// 2-thread/1-thread ratio is what the (shared, noisy) machine allowed at that moment: the
/// ceiling any cache's scaling should be read against.
pub struct Ceiling;

impl RegCache for Ceiling {
    fn name(&self) -> &'static str {
        "ceil"
    }
    #[inline]
    fn get(&self, addr: usize, _len: usize) -> Option<u64> {
        let mut x = std::hint::black_box(addr as u64);
        // black_box each step: otherwise the affine chain folds into a single multiply-add.
        for _ in 0..32 {
            x = std::hint::black_box(x.wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_add(1);
        }
        Some(x | 1)
    }
    #[inline]
    fn put(&self, handle: u64) {
        std::hint::black_box(handle);
    }
}
