//! `CLOCK_MONOTONIC` in nanoseconds: one reader for the hooks (`helper/pins_ahead.rs`) and the
//! helper's clock (`helper/clock.rs`). Hook-safe: the vDSO (or one system call), no allocation.

/// Nanoseconds since an arbitrary fixed point (boot), never going backwards.
#[inline]
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}
