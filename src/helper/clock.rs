//! The helper's one clock: CLOCK_MONOTONIC in nanoseconds (a vDSO call, ~20 ns, no system call).
//! Everything else in `helper/` takes times as plain `u64` arguments, so the predictor, the
//! queues and the planner run on a simulated clock in tests.

/// Nanoseconds since an arbitrary fixed point (boot), never going backwards.
#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    #[test]
    fn monotonic() {
        let a = super::now_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = super::now_ns();
        assert!(b >= a + 1_000_000, "{a} {b}");
    }
}
