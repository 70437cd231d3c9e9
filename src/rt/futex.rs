//! Futex wait and wake on an `AtomicU32`, as raw system calls: no allocation, no lock, so a
//! thread may sleep in hook context (inside a patched `munmap`) and be woken by the worker
//! (`rma::revoke`); and `lock::Lock`'s sleeps.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Sleeps while `*word == expected`, at most `timeout` (`None`: until woken). Returns on a
/// wake-up, a changed value, the timeout, or a signal; the caller re-checks its condition.
pub(crate) fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: FUTEX_WAIT reads the u32 at `word` (a live atomic: same size and alignment as
    // u32) and the timespec on our stack (or NULL); it changes no memory.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            ts_ptr,
        );
    }
}

/// Wakes up to `n` threads sleeping in [`wait`] on `word`.
pub(crate) fn wake(word: &AtomicU32, n: i32) {
    // SAFETY: FUTEX_WAKE only uses the address as a key; it reads and writes no memory.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            n,
        );
    }
}

/// Wakes every thread sleeping on `word`.
pub(crate) fn wake_all(word: &AtomicU32) {
    wake(word, i32::MAX);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::SeqCst;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn wait_returns_on_mismatch_timeout_and_wake() {
        let w = AtomicU32::new(1);
        let t = Instant::now();
        wait(&w, 2, Some(Duration::from_secs(5)));
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "value differs: no sleep"
        );
        let t = Instant::now();
        wait(&w, 1, Some(Duration::from_millis(30)));
        assert!(
            t.elapsed() >= Duration::from_millis(25),
            "slept until the timeout"
        );
        let w = Arc::new(AtomicU32::new(0));
        let w2 = w.clone();
        let h = std::thread::spawn(move || {
            while w2.load(SeqCst) == 0 {
                wait(&w2, 0, Some(Duration::from_secs(10)));
            }
        });
        std::thread::sleep(Duration::from_millis(20));
        let t = Instant::now();
        w.store(1, SeqCst);
        wake_all(&w);
        h.join().unwrap();
        assert!(t.elapsed() < Duration::from_secs(5), "woken, not timed out");
    }
}
