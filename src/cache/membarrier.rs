//! Asymmetric fence for the reader indicators: readers publish "I am reading" with a plain store
//! and only a compiler fence before checking the writer flag; the writer, after raising its flag,
//! issues `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`, which runs a full memory barrier on every
//! CPU currently running a thread of this process (threads not running passed one at their last
//! context switch). So either the writer then sees the reader's store, or the reader's later load
//! sees the writer's flag: the Dekker guarantee without a locked instruction on the read side.
//!
//! Registration (`MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED`) happens once per process, when the
//! first cache is created; if the kernel refuses, `available()` stays false and readers keep the
//! symmetric scheme (a locked exchange). Registration does not survive fork: a child's first
//! barrier fails with EPERM, re-registers and retries.

use std::sync::atomic::{AtomicU8, Ordering};

const CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
const CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

const UNKNOWN: u8 = 0;
const YES: u8 = 1;
const NO: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);

fn membarrier(cmd: libc::c_int) -> libc::c_long {
    // SAFETY: membarrier takes plain integers and touches no user memory.
    unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            cmd,
            0 as libc::c_uint,
            0 as libc::c_int,
        )
    }
}

/// Register once (idempotent). Call before any reader may rely on `available()`.
pub(super) fn init() {
    if STATE.load(Ordering::Acquire) != UNKNOWN {
        return;
    }
    let ok = !force_off() && membarrier(CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
    // First decision wins: a cache created earlier may already have readers relying on it.
    let _ = STATE.compare_exchange(
        UNKNOWN,
        if ok { YES } else { NO },
        Ordering::AcqRel,
        Ordering::Acquire,
    );
}

/// `FH_NO_MEMBARRIER` set: use the symmetric (locked) reader scheme (for comparison and tests).
fn force_off() -> bool {
    std::env::var_os("FH_NO_MEMBARRIER").is_some()
}

/// True when readers may use the plain-store protocol.
#[inline]
pub(super) fn available() -> bool {
    STATE.load(Ordering::Relaxed) == YES
}

/// Full barrier on every running thread of this process. Only called when `available()`.
pub(super) fn heavy() {
    if membarrier(CMD_PRIVATE_EXPEDITED) == 0 {
        return;
    }
    // After fork the child's mm is not registered: register and retry.
    if membarrier(CMD_REGISTER_PRIVATE_EXPEDITED) == 0 && membarrier(CMD_PRIVATE_EXPEDITED) == 0 {
        return;
    }
    // Readers already skip their fence; continuing would allow a stale hit.
    crate::fh_error!("firehose: membarrier failed after it had worked; aborting");
    std::process::abort();
}
