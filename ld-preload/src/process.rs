//! Facts about this process that any module may ask (a leaf: it imports nothing of the crate).

use std::sync::atomic::{AtomicBool, Ordering};

static IN_CHILD: AtomicBool = AtomicBool::new(false);

/// True in a process created by `fork` after the shim was loaded.
pub fn in_child() -> bool {
    IN_CHILD.load(Ordering::Relaxed)
}

/// From the atfork child handler (`fork.rs`): this process is a child. No lock, no allocation.
pub fn mark_child() {
    IN_CHILD.store(true, Ordering::Relaxed);
}
