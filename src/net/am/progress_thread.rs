//! The optional progress thread (`FH_PROGRESS_THREAD=1`): polls while messages come, keeps
//! polling for `FH_PROGRESS_SPIN_US` after the last one, then sleeps in `Link::wait` until the
//! completion channel fires, so peers get answers while the application computes. It owns an
//! `Arc` of the endpoint's state (nothing it touches can be freed under it) and is stopped and
//! joined by `Am::finalize` or `Am::drop`; the wait is short so a stop takes effect within a tick.
//!
//! Why it spins before sleeping: a wake-up through the completion channel is a kernel event
//! plus a scheduler wake-up. On Soft-RoCE (Linux 6.1) the event itself is delivered from a
//! tasklet, i.e. by ksoftirqd on the CPU that posted the send, which waits for that CPU; under
//! emulation this costs 0.1-2 ms where a polled round trip is ~30 µs (see docs/benchmarks.md, "Peers: active
//! messages"). Requests often come in bursts (a Firehose move and the puts behind it), so after an
//! event the next one is likely soon: polling for a while answers it at polling speed and saves
//! the two re-arm system calls per message. `inf` never sleeps: the thread then needs a core.
//!
//! While an application thread polls (`Am::polling`: `rma`'s `wait`, `quiet`, `test` and
//! `progress`, `Am::wait`), the thread neither spins nor sleeps for completions: it handles what
//! woke it and sleeps in `Link::wait_messages` (verbs: the receive CQ armed, not the send CQ).
//! The waiter reaps its own completions and answers what comes meanwhile. The same holds for a
//! short while after a thread's last wait or post (`Link::signaled_posts`): a thread streaming
//! RDMA is often inside a post rather than a wait. Those sleeps double while the threads stay
//! busy (10 ms up to `RECENT_SLEEP_MAX`), so a stream does not wake the thread ~100 times a
//! second for nothing. Measured in the
//! Soft-RoCE VM (2 ranks, `fh_bench --test rma`, defaults): a thread that spun beside the waiter
//! or woke for each of its completions doubled an 8-byte put (35 us against 18) and cut 64 KiB
//! bandwidth by a fifth; the thread is now what it was for: an answer to peers.
//!
//! While it polls it yields the CPU every `CLOCK_EVERY` empty polls (with `inf`, every
//! `YIELD_EVERY_FOREVER`): kernel work queued on this CPU (Soft-RoCE's deferred completions and
//! event notifications run in ksoftirqd) must not wait for a scheduler tick to preempt a
//! spinning thread.
//!
//! Idle, it costs close to nothing (it is on by default in every job with peers): it spins only
//! after a wake-up that brought something (a timeout or a wake-up another thread's poll already
//! served goes straight back to sleep), and on a link that can interrupt a sleep (`Link::wakes`:
//! verbs, through an eventfd next to the completion channel) it sleeps up to `IDLE_SLEEP`, since
//! `stop` wakes it; elsewhere it looks at its stop flag every `TICK`. Measured in the Soft-RoCE
//! VM: a rank sleeping 10 s had its thread use 3.6-3.9 % of a core with a 10 ms tick and a spin
//! after every wake-up, and ~0 after (`scripts/bench-attentive`).

use crate::net::link::Link;
use crate::net::NetError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest sleep in `Link::wait` before the thread re-checks its stop flag, on a link that
/// cannot be woken (`Link::wakes` false: the simulator).
const TICK: Duration = Duration::from_millis(10);
/// The same on a link that `stop` can wake: only a lost wake-up would wait this long.
const IDLE_SLEEP: Duration = Duration::from_secs(1);
/// The first sleep for messages only while no application thread waits now but some did since
/// the last sleep, or one is inside a post (see the sleep in `start`).
const RECENT_SLEEP: Duration = Duration::from_millis(10);
/// Such sleeps double while they run out with the threads still busy (a stream of posts), up to
/// this: each wake-up is a context switch on a CPU the streaming thread or the device's kernel
/// work needs, and it finds nothing to do.
const RECENT_SLEEP_MAX: Duration = Duration::from_millis(160);
/// Empty polls between two clock reads (and yields) while spinning: a clock read is a system
/// call of about a microsecond under emulation.
const CLOCK_EVERY: u32 = 64;
/// With `inf` the thread yields only every this many empty polls: on a core shared with the
/// application a yield hands the CPU over until the next scheduler tick (~4 ms at HZ=250).
const YIELD_EVERY_FOREVER: u32 = 1024;

/// What the thread polls: the endpoint's shared state (`endpoint.rs`), seen through this so that
/// the thread needs nothing else of the endpoint.
pub(super) trait Progress: Send + Sync + 'static {
    /// Deliver what arrived, send what credits allow; the number of events handled.
    fn progress(&self) -> Result<usize, NetError>;
    /// The link the thread sleeps on.
    fn link(&self) -> &Arc<dyn Link>;
    /// How long to keep polling after an event (`None`: forever).
    fn spin(&self) -> Option<Duration>;
    /// Counts a wake-up.
    fn woke(&self);
    /// Blocking waits of application threads (`Am::polling`) begun and ended so far: the
    /// waiters reap the completions of their own sends and RDMA.
    fn waits(&self) -> (u64, u64);
    /// Counts events the thread handled.
    fn handled(&self, events: usize);
}

pub(super) struct ProgressThread {
    stop: Arc<AtomicBool>,
    /// To end the thread's sleep when stopping it.
    link: Arc<dyn Link>,
    handle: Option<crate::rt::raw_thread::RawThread>,
}

/// Whether an application thread is in a blocking wait now, or inside an RDMA post (whose
/// completion it will reap in its next wait: `Link::posting`).
fn someone_waits(inner: &impl Progress) -> bool {
    let (begun, ended) = inner.waits();
    begun != ended || inner.link().posting()
}

/// What application threads have begun so far: waits (`Progress::waits`) and posts
/// (`Link::signaled_posts`). A change between two looks means a thread is issuing and waiting on
/// its own operations, even if it is between two waits right now: a 64 KiB WRITE on Soft-RoCE
/// spends its whole transfer inside the post's system call, so a thread streaming them is rarely
/// inside a wait.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
struct Begun {
    waits: u64,
    posts: u64,
}

impl Begun {
    fn now(inner: &impl Progress) -> Begun {
        Begun {
            waits: inner.waits().0,
            posts: inner.link().signaled_posts(),
        }
    }
}

/// Polls until `spin` has passed since the last event (`None`: until stopped). Returns early on
/// a stop or a progress error (the caller's wait then reports a closed link by failing).
/// `busy`: spin even if the first poll finds nothing (the thread's start: requests may be about
/// to come); after a wake-up it is false, so a wake-up that brought nothing sleeps again at once.
fn poll_while_busy(
    inner: &impl Progress,
    stop: &AtomicBool,
    spin: Option<Duration>,
    mut busy: bool,
) {
    let mut idle = 0u32;
    let mut idle_since: Option<Instant> = None;
    while !stop.load(Ordering::Acquire) {
        let Ok(n) = inner.progress() else { return };
        if n > 0 {
            inner.handled(n);
            idle = 0;
            idle_since = None;
            busy = true;
        }
        // An application thread polls in a wait: it handles what comes next (messages too),
        // so this thread does not spin beside it, taking the CPU the device's kernel work needs
        // and reaping the waiter's own completions. (`inf` was given a core: it keeps polling.)
        if spin.is_some() && someone_waits(inner) {
            return;
        }
        if n > 0 {
            continue;
        }
        // Nothing came with this wake-up (a timeout, or another thread's poll took it): no
        // spin, back to sleep. (With `inf` the thread never sleeps, so it keeps polling.)
        if (!busy && spin.is_some()) || spin == Some(Duration::ZERO) {
            return;
        }
        idle += 1;
        let Some(spin) = spin else {
            // Never sleeps: it owns a core, yet lets queued kernel work in now and then.
            if idle % YIELD_EVERY_FOREVER == 0 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            continue;
        };
        if idle % CLOCK_EVERY != 0 {
            std::hint::spin_loop();
            continue;
        }
        std::thread::yield_now();
        let now = Instant::now();
        if now - *idle_since.get_or_insert(now) >= spin {
            return;
        }
    }
}

impl ProgressThread {
    pub(super) fn start(inner: Arc<impl Progress>) -> std::io::Result<ProgressThread> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let spin = inner.spin();
        let sleep = if inner.link().wakes() {
            IDLE_SLEEP
        } else {
            TICK
        };
        let link = inner.link().clone();
        // A plain pthread: see `raw_thread.rs`.
        let handle = crate::rt::raw_thread::spawn(c"fh-progress", move || {
            // A memory hook firing on this thread must never wait for the library.
            crate::rt::inside::mark_thread();
            let mut started = true;
            // What had begun at the last sleep.
            let mut seen = Begun::default();
            // The last sleep was for messages, none came, and threads kept waiting or posting
            // meanwhile: nothing is this thread's to do (see below), so it sleeps again at once.
            let mut skip_poll = false;
            // The next sleep for messages while threads are busy (`RECENT_SLEEP` doubling).
            let mut recent_sleep = RECENT_SLEEP;
            while !flag.load(Ordering::Acquire) {
                if !std::mem::take(&mut skip_poll) {
                    poll_while_busy(&*inner, &flag, spin, std::mem::take(&mut started));
                }
                if flag.load(Ordering::Acquire) {
                    break;
                }
                // While application threads wait on their own operations (one waits now, or
                // some began waiting or posting since the last sleep, or one is inside a post:
                // a loop of blocking puts is between two waits part of the time), their
                // completions must not wake this thread too (see `Am::polling`); else it sleeps
                // for both. The choice holds for one sleep, kept short unless a waiter polls
                // now: a thread that stopped waiting with operations in flight leaves their
                // completions to this thread within the current short sleep (`RECENT_SLEEP`,
                // doubled while threads stay busy, at most `RECENT_SLEEP_MAX`; a revocation can
                // wait on them: their firehoses stay held).
                let (begun, ended) = inner.waits();
                let now = Begun::now(&*inner);
                let recent = now != seen || inner.link().posting();
                seen = now;
                let slept = if begun != ended {
                    inner.link().wait_messages(sleep)
                } else if recent {
                    inner.link().wait_messages(sleep.min(recent_sleep))
                } else {
                    inner.link().wait(sleep).map(|()| true)
                };
                match slept {
                    // A failed wait (link closed) must not become a hot loop.
                    Err(_) => std::thread::sleep(TICK),
                    // A sleep for messages ran out with none: if threads went on waiting or
                    // posting meanwhile, or one is inside a post or a wait now (one post can
                    // outlast the sleep when four ranks share two CPUs under emulation), the
                    // completions waiting now are theirs to reap in their next wait. Polling
                    // would take them (a thread streaming 64 KiB WRITEs on Soft-RoCE is inside a
                    // post most of the time: each 10 ms wake-up took ~5 of its completions,
                    // through the queue for results reaped elsewhere).
                    //
                    // While that goes on, the next such sleep is twice as long (up to
                    // `RECENT_SLEEP_MAX`): a 10 ms sleep woke the thread ~100 times a second
                    // beside every stream for nothing. What it costs: a thread that stops
                    // posting with operations in flight and does not wait for them leaves their
                    // completions here for up to that long (messages still wake the thread at
                    // once; a revocation polls for itself).
                    Ok(false) => {
                        skip_poll = someone_waits(&*inner) || Begun::now(&*inner) != seen;
                        recent_sleep = if skip_poll {
                            (recent_sleep * 2).min(RECENT_SLEEP_MAX)
                        } else {
                            RECENT_SLEEP
                        };
                    }
                    Ok(true) => recent_sleep = RECENT_SLEEP,
                }
                inner.woke();
            }
        })?;
        Ok(ProgressThread {
            stop,
            link,
            handle: Some(handle),
        })
    }

    /// Stops the thread and waits for it, unless called on the thread itself (a handler that
    /// dropped the last `Am`): then it exits on its own after the current round.
    pub(super) fn stop(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.link.wake();
        if let Some(h) = self.handle.take() {
            if !h.is_current() {
                h.join();
            }
        }
    }
}

impl Drop for ProgressThread {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}
