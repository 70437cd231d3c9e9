//! The `fh-revoke` thread: takes the ranges the hooks queued, starts their revocation in the
//! Firehose core (REVOKE to every holder, victims unpinned at once), progresses the network
//! until every holder acked (the core then unpins: the verbs MRs are deregistered), and wakes
//! the threads waiting in their `munmap`. Several revocations run at once; a new range is
//! taken while older ones still wait for acks.
//!
//! It reaches the driver through [`Driver`] (the `Rma`, held weakly: the worker never keeps a
//! context alive), so the loop is tested with a fake driver. It is marked as inside the library
//! (its own frees never wait for itself).

use super::Shared;
use crate::firehose::InvalId;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the worker needs from the driver. Every call returns `None` once the driver is gone
/// (the worker then ends).
pub trait Driver: Send + 'static {
    /// Starts revoking `[addr, addr + len)`.
    fn invalidate(&self, addr: u64, len: u64) -> Option<InvalId>;
    fn is_done(&self, id: InvalId) -> Option<bool>;
    /// Runs what arrived; the number of events.
    fn progress(&self) -> Option<usize>;
    /// Sleeps until something may have arrived, at most `d`.
    fn wait_link(&self, d: Duration);
    /// Checks the peers are alive (a dead holder then counts as having acked).
    fn probe_peers(&self);
    /// How often to probe while revokes wait.
    fn probe_every(&self) -> Duration;
}

/// Sleep between looks at the queue when nothing is being revoked (pushes wake it earlier).
const IDLE: Duration = Duration::from_millis(100);
/// Empty progress rounds spent yielding before sleeping on the link.
const SPIN_ROUNDS: u32 = 200;
/// Longest sleep on the link while revokes wait (new pushes are seen after at most this).
const LINK_NAP: Duration = Duration::from_millis(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Job {
    Slot(usize),
    Sweep(u32),
}

/// Closes the queue when the worker ends, however it ends (its driver gone, or finalized): no
/// unmapping thread may then wait for it.
struct CloseOnExit<'a>(&'a Shared);

impl Drop for CloseOnExit<'_> {
    fn drop(&mut self) {
        self.0.queue.close();
    }
}

pub(crate) fn run(sh: Arc<Shared>, drv: Box<dyn Driver>) {
    crate::inside::mark_thread();
    let _close = CloseOnExit(&sh);
    let mut active: Vec<(Job, InvalId)> = Vec::new();
    let mut fresh: Vec<(Job, u64, u64)> = Vec::new();
    let mut sweeping = false;
    let mut empty_rounds = 0u32;
    let mut last_probe = Instant::now();
    loop {
        // A sign of life at every turn: a thread waiting in an unmap libc made itself gives up
        // once these stop (this thread may be blocked on a malloc arena that call holds).
        sh.queue.beat();
        let seen = sh.queue.work_seq();
        if sh.queue.is_closed() {
            return;
        }
        sh.queue
            .take(|slot, addr, len| fresh.push((Job::Slot(slot), addr, len)));
        if !sweeping {
            if let Some(req) = sh.queue.sweep_wanted() {
                sweeping = true;
                sh.stats.sweeps.fetch_add(1, Relaxed);
                fresh.push((Job::Sweep(req), 0, u64::MAX));
            }
        }
        for (job, addr, len) in fresh.drain(..) {
            let Some(id) = drv.invalidate(addr, len) else {
                return;
            };
            sh.stats.started.fetch_add(1, Relaxed);
            active.push((job, id));
        }
        if active.is_empty() {
            empty_rounds = 0;
            sh.queue.sleep(seen, IDLE);
            continue;
        }
        let Some(n) = drv.progress() else { return };
        let mut gone = false;
        active.retain(|&(job, id)| match drv.is_done(id) {
            None => {
                gone = true;
                true
            }
            Some(false) => true,
            Some(true) => {
                // Counted before the waiter is woken (it may read the stats at once).
                sh.stats.completed.fetch_add(1, Relaxed);
                match job {
                    Job::Slot(i) => sh.queue.complete(i),
                    Job::Sweep(req) => {
                        sh.queue.sweep_finished(req);
                        sweeping = false;
                    }
                }
                false
            }
        });
        if gone {
            return;
        }
        if active.is_empty() || n != 0 {
            empty_rounds = 0;
            continue;
        }
        if last_probe.elapsed() >= drv.probe_every() {
            last_probe = Instant::now();
            drv.probe_peers();
        }
        empty_rounds += 1;
        if empty_rounds < SPIN_ROUNDS {
            std::thread::yield_now();
        } else {
            drv.wait_link(LINK_NAP);
        }
    }
}
