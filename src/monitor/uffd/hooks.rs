//! The userfaultfd's fork hook (its state's lock held across `fork`) and test hook.

use std::sync::MutexGuard;

use super::state::{lock_state, State};
use crate::rt::fork::{ForkHook, HeldAcrossFork};

/// Place 20 of `rt::fork`'s order (registered by `install`, which takes it under place 10):
/// `STATE` held across `fork`, so a child never inherits it locked by a thread that is gone.
pub(in crate::monitor) static FORK_HOOK: ForkHook = ForkHook {
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

/// Test hook: make the reader fail as if its next `read` had failed, to prove that a dead reader
/// leaves nothing registered (an unmap of a registered range would otherwise wait forever).
/// Userfaultfd stays off in this process afterwards.
#[cfg(any(test, feature = "test-support"))]
pub(crate) fn test_fail_reader() {
    super::state::FAIL_NEXT_READ.store(true, std::sync::atomic::Ordering::SeqCst);
}
