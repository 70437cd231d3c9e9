//! The host tests' lock (a leaf, so that any module's tests can take it without importing the
//! dispatch tests): the shim's counters, wrappers and domain map are process-wide, so tests that
//! read or change them run one at a time.

use std::sync::{Mutex, MutexGuard};

static SERIAL: Mutex<()> = Mutex::new(());

pub(crate) fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}
