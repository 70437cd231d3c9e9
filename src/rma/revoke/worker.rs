//! The `fh-revoke` thread: takes the ranges the hooks queued, starts their revocation in the
//! Firehose core (REVOKE to every holder, victims unpinned at once), progresses the network
//! until every holder acked (the core then unpins: the verbs MRs are deregistered), and wakes
//! the threads waiting in their `munmap`. Several revocations run at once; a new range is
//! taken while older ones still wait for acks.
//!
//! A holder that never acks costs only its own firehoses: a revocation nobody waits for any more
//! (detached, or its waiter's `FH_REVOKE_TIMEOUT` passed) gives its queue slot back at once and
//! is tracked here alone, so such revocations never fill the slots (which would turn every later
//! unmap of peer-pinned memory into a sweep waiting for that holder too); and a revocation still
//! unacknowledged after [`Driver::holder_bound`] (`FH_AM_TIMEOUT_MS`) gives up on the holders it
//! waits for (declared lost, as a silent peer in `fh_wait`: they count as having acked), which
//! ends it and unpins the memory. Counted: `RevokeStats::written_off`, `holders_given_up`.
//!
//! It reaches the driver through [`Driver`] (the `Rma`, held weakly: the worker never keeps a
//! context alive), so the loop is tested with a fake driver. It is marked as inside the library
//! (its own frees never wait for itself).

use super::shared::Shared;
use firehose_proto::InvalId;
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
    /// How long a holder may leave a revoke unacknowledged before it is given up on
    /// (`FH_AM_TIMEOUT_MS`, the bound on any live peer's silence); `None` (the default): never.
    fn holder_bound(&self) -> Option<Duration> {
        None
    }
    /// Gives up on the holders that have not acknowledged revoke `id` yet (each is declared
    /// lost, so it counts as having acked); how many.
    fn give_up_holders(&self, _id: InvalId) -> Option<usize> {
        Some(0)
    }
}

/// Sleep between looks at the queue when nothing is being revoked (pushes wake it earlier).
const IDLE: Duration = Duration::from_millis(100);
/// Empty progress rounds spent yielding before sleeping on the link.
const SPIN_ROUNDS: u32 = 200;
/// Longest sleep on the link while revokes wait (new pushes are seen after at most this).
const LINK_NAP: Duration = Duration::from_millis(1);
/// While progress keeps finding events, the holders' bound is looked at every this many turns
/// (at every empty one otherwise).
const BUSY_CLOCK_EVERY: u32 = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Job {
    Slot(usize),
    Sweep(u32),
    /// Nobody waits for it any more: its slot was released ([`super::queue::RevokeQueue::release_orphan`]).
    Background,
}

/// A revocation under way.
struct Active {
    job: Job,
    id: InvalId,
    since: Instant,
    /// Its late holders were given up on already.
    written_off: bool,
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
    crate::rt::inside::mark_thread();
    let _close = CloseOnExit(&sh);
    let bound = drv.holder_bound();
    let mut active: Vec<Active> = Vec::new();
    let mut fresh: Vec<(Job, u64, u64)> = Vec::new();
    let mut sweeping = false;
    let mut empty_rounds = 0u32;
    let mut last_probe = Instant::now();
    let mut turns = 0u32;
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
            active.push(Active {
                job,
                id,
                since: Instant::now(),
                written_off: false,
            });
        }
        if active.is_empty() {
            empty_rounds = 0;
            sh.queue.sleep(seen, IDLE);
            continue;
        }
        // A revoke nobody waits for (detached, or its waiter timed out) gives its slot back now,
        // not when its last holder acks: a holder that never acks must not fill the queue, or
        // every later unmap of peer-pinned memory would become a sweep that waits for it too.
        for a in active.iter_mut() {
            if let Job::Slot(i) = a.job {
                if sh.queue.release_orphan(i) {
                    a.job = Job::Background;
                }
            }
        }
        let Some(n) = drv.progress() else { return };
        let mut gone = false;
        active.retain(|a| match drv.is_done(a.id) {
            None => {
                gone = true;
                true
            }
            Some(false) => true,
            Some(true) => {
                // Counted before the waiter is woken (it may read the stats at once).
                sh.stats.completed.fetch_add(1, Relaxed);
                match a.job {
                    Job::Slot(i) => sh.queue.complete(i),
                    Job::Sweep(req) => {
                        sh.queue.sweep_finished(req);
                        sweeping = false;
                    }
                    Job::Background => {}
                }
                false
            }
        });
        if gone {
            return;
        }
        turns = turns.wrapping_add(1);
        if let Some(bound) = bound.filter(|_| n == 0 || turns % BUSY_CLOCK_EVERY == 0) {
            // Holders silent past the bound are given up on: they count as having acked, so
            // the revoke ends (the memory is unpinned) and costs nobody else anything.
            let now = Instant::now();
            for a in active.iter_mut() {
                if !a.written_off && now.duration_since(a.since) >= bound {
                    a.written_off = true;
                    let Some(k) = drv.give_up_holders(a.id) else {
                        return;
                    };
                    if k > 0 {
                        sh.stats.written_off.fetch_add(1, Relaxed);
                        sh.stats.holders_given_up.fetch_add(k as u64, Relaxed);
                    }
                }
            }
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
