//! The library's own background threads (the helper, the progress thread, the revoke worker), made
//! with `pthread_create` rather than `std::thread`.
//!
//! Why: std's thread start and exit take a process-wide mutex of std's (its stack-overflow
//! bookkeeping, `thread_info`) that no atfork handler covers. A child forked while any thread of
//! the parent was starting or ending a std thread inherits it locked, and then every std thread
//! the child starts hangs in its start: a cache made there with a helper never saw its helper
//! run, and freeing it (which joins the helper) waited forever (`tests/fork_thread_start.rs`;
//! the userfaultfd reader had the same bug, `monitor/uffd/`). A plain pthread running a Rust
//! closure takes no such lock.
//!
//! The closure runs inside `catch_unwind`: a panic ends the thread, never the process (nothing
//! unwinds through the `extern "C"` entry).

use std::ffi::{c_void, CStr};

/// A started thread. Dropping it without `join` detaches it (as std's `JoinHandle` does).
pub(crate) struct RawThread {
    t: libc::pthread_t,
    joined: bool,
}

type Job = Box<dyn FnOnce() + Send + 'static>;

extern "C" fn start(arg: *mut c_void) -> *mut c_void {
    // SAFETY: `arg` is the `Box<Job>` leaked by `spawn` for this thread alone.
    let job = unsafe { Box::from_raw(arg as *mut Job) };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
    std::ptr::null_mut()
}

/// Start `f` on a new thread named `name` (at most 15 bytes shown; longer is cut by the kernel's
/// limit, and a failure to name it is ignored).
pub(crate) fn spawn(name: &CStr, f: impl FnOnce() + Send + 'static) -> std::io::Result<RawThread> {
    let job: Box<Job> = Box::new(Box::new(f));
    let arg = Box::into_raw(job) as *mut c_void;
    let mut t: libc::pthread_t = 0;
    // SAFETY: `start` takes ownership of `arg` and never unwinds.
    let rc = unsafe { libc::pthread_create(&mut t, std::ptr::null(), start, arg) };
    if rc != 0 {
        // SAFETY: the thread was not made, so `arg` is still ours.
        drop(unsafe { Box::from_raw(arg as *mut Job) });
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    let mut short = [0u8; 16];
    let bytes = name.to_bytes();
    let n = bytes.len().min(15);
    short[..n].copy_from_slice(&bytes[..n]);
    // SAFETY: a live thread of ours and a NUL-terminated name of at most 16 bytes.
    unsafe { libc::pthread_setname_np(t, short.as_ptr().cast()) };
    Ok(RawThread { t, joined: false })
}

impl RawThread {
    /// Whether the calling thread is this one (it must not join itself).
    pub(crate) fn is_current(&self) -> bool {
        // SAFETY: pthread_equal only compares the two ids.
        unsafe { libc::pthread_equal(self.t, libc::pthread_self()) != 0 }
    }

    /// Wait for the thread to end. Never call it on the thread itself (see `is_current`).
    pub(crate) fn join(mut self) {
        self.joined = true;
        // SAFETY: a joinable thread of ours, joined once (`joined` keeps Drop from detaching).
        unsafe { libc::pthread_join(self.t, std::ptr::null_mut()) };
    }
}

impl Drop for RawThread {
    fn drop(&mut self) {
        if !self.joined {
            // SAFETY: a joinable thread of ours, detached once.
            unsafe { libc::pthread_detach(self.t) };
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::sync::Arc;

    #[test]
    fn runs_joins_and_survives_a_panic() {
        let n = Arc::new(AtomicUsize::new(0));
        let m = n.clone();
        let t = super::spawn(c"fh-test", move || {
            m.fetch_add(1, SeqCst);
        })
        .unwrap();
        assert!(!t.is_current());
        t.join();
        assert_eq!(n.load(SeqCst), 1, "the closure ran before join returned");
        let t = super::spawn(c"fh-test-panics-with-a-long-name", || panic!("contained")).unwrap();
        t.join();
    }

    #[test]
    fn knows_its_own_thread() {
        let (tx, rx) = std::sync::mpsc::channel::<bool>();
        let slot: Arc<std::sync::Mutex<Option<super::RawThread>>> = Default::default();
        let s = slot.clone();
        let t = super::spawn(c"fh-test", move || {
            // Wait until the handle is stored, then ask whether it is us.
            loop {
                if let Some(h) = s.lock().unwrap().as_ref() {
                    tx.send(h.is_current()).unwrap();
                    return;
                }
                std::thread::yield_now();
            }
        })
        .unwrap();
        *slot.lock().unwrap() = Some(t);
        assert!(rx.recv().unwrap(), "is_current on the thread itself");
        slot.lock().unwrap().take().unwrap().join();
    }
}
