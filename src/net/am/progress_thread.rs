//! The optional progress thread (`FH_PROGRESS_THREAD=1`): sleeps in `Link::wait`, then runs
//! `progress`, so peers get answers while the application computes. It owns an `Arc` of the
//! endpoint's state (nothing it touches can be freed under it) and is stopped and joined by
//! `Am::finalize` or `Am::drop`; the wait is short so a stop takes effect within a tick.

use super::endpoint::Inner;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Longest sleep in `Link::wait` before the thread re-checks its stop flag.
const TICK: Duration = Duration::from_millis(10);

pub(super) struct ProgressThread {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl ProgressThread {
    pub fn start(inner: Arc<Inner>) -> std::io::Result<ProgressThread> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name("fh-progress".into())
            .spawn(move || {
                while !flag.load(Ordering::Acquire) {
                    // A failed wait (link closed) must not become a hot loop.
                    if inner.link.wait(TICK).is_err() {
                        std::thread::sleep(TICK);
                    }
                    if flag.load(Ordering::Acquire) {
                        break;
                    }
                    inner.stats.progress_wakeup();
                    let _ = inner.progress();
                }
            })?;
        Ok(ProgressThread {
            stop,
            handle: Some(handle),
        })
    }

    /// Stops the thread and waits for it, unless called on the thread itself (a handler that
    /// dropped the last `Am`): then it exits on its own after the current round.
    pub fn stop(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

impl Drop for ProgressThread {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}
