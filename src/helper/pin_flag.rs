//! `FlaggingPinner`: the cache's backend wrapped so that a thread can tell afterwards whether
//! its last `register` pinned (a miss on its own thread) or not. A thread-local flag, set on a
//! successful pin and read by the helper's `register` front (`thread.rs`): what the caller paid
//! is then known exactly, without asking the cache anything.

use std::cell::Cell;
use std::sync::Arc;

use crate::pin::{Access, PinError, Pinned, Pinner};
use crate::rt::seam::MemoryListener;

thread_local! {
    static PINNED: Cell<bool> = const { Cell::new(false) };
}

/// Clear this thread's flag.
#[inline]
pub fn clear() {
    let _ = PINNED.try_with(|f| f.set(false));
}

/// Whether this thread pinned since `clear`, leaving the flag as it is (so a caller around a
/// nested clear/peek, e.g. the shim around the helper's front, still sees it).
#[inline]
pub(crate) fn peek() -> bool {
    PINNED.try_with(Cell::get).unwrap_or(false)
}

/// Whether this thread pinned since `clear`, and clear it.
#[inline]
pub fn take() -> bool {
    PINNED.try_with(|f| f.replace(false)).unwrap_or(false)
}

pub struct FlaggingPinner(pub Arc<dyn Pinner>);

impl Pinner for FlaggingPinner {
    fn pin(&self, addr: usize, len: usize, access: Access) -> Result<Pinned, PinError> {
        let r = self.0.pin(addr, len, access);
        if r.is_ok() {
            let _ = PINNED.try_with(|f| f.set(true));
        }
        r
    }
    fn unpin(&self, pinned: Pinned, addr: usize, len: usize) {
        self.0.unpin(pinned, addr, len)
    }
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn memory_listener(&self) -> Option<Arc<dyn MemoryListener>> {
        self.0.memory_listener()
    }
}
