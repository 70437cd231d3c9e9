//! Unit tests of the endpoint on the simulated link (the storms are in `tests/net_sim.rs`).

use super::*;
use crate::net::settings::NetSettings;
use crate::net::sim::{Delivery, SimConfig, SimNet};
use crate::net::wire::{Kind, Reject};
use crate::net::{Link, LinkError, LinkEvent, NetError, Rank, RdmaOp};
use std::sync::Arc;
use std::time::Duration;

fn pair(delivery: Delivery) -> (SimNet, Am, Am) {
    let net = SimNet::new(SimConfig::new(2, 1, delivery));
    let s = NetSettings::default();
    let a = Am::new(net.link(0), s).unwrap();
    let b = Am::new(net.link(1), s).unwrap();
    for am in [&a, &b] {
        am.register_request(1, |_, p, r| r.reply(p).unwrap());
    }
    (net, a, b)
}

#[test]
fn request_reply_round_trip() {
    let (_net, a, b) = pair(Delivery::Auto);
    let t = a.request(1, 1, b"ping").unwrap();
    assert_eq!(a.test(&t).unwrap(), None);
    b.progress().unwrap();
    assert_eq!(a.wait(t, None).unwrap(), b"ping");
    assert_eq!(a.stats().sent(Kind::Request), 1);
    assert_eq!(b.stats().received(Kind::Request), 1);
}

#[test]
fn loopback_to_own_rank() {
    let (net, a, _b) = pair(Delivery::Auto);
    assert_eq!(a.call(0, 1, b"me").unwrap(), b"me");
    assert_eq!(net.delivered(), 0, "never through the link");
}

#[test]
fn argument_errors() {
    let (_net, a, _b) = pair(Delivery::Auto);
    assert_eq!(a.request(2, 1, b"").unwrap_err(), NetError::BadRank);
    let big = vec![0; a.max_payload() + 1];
    assert_eq!(a.send_oneway(1, 1, &big).unwrap_err(), NetError::MsgTooLong);
    a.send_oneway(1, 1, &big[1..]).unwrap();
}

#[test]
fn reply_after_the_handler_returned() {
    let (_net, a, b) = pair(Delivery::Auto);
    let kept = Arc::new(std::sync::Mutex::new(Vec::new()));
    let k = kept.clone();
    b.register_request(2, move |_, _, r| k.lock().unwrap().push(r));
    let t = a.request(1, 2, b"").unwrap();
    b.progress().unwrap();
    assert_eq!(a.test(&t).unwrap(), None);
    kept.lock().unwrap().pop().unwrap().reply(b"later").unwrap();
    assert_eq!(a.wait(t, None).unwrap(), b"later");
}

#[test]
fn spent_ticket_and_stale_reply() {
    let (_net, a, b) = pair(Delivery::Auto);
    let t = a.request(1, 1, b"x").unwrap();
    let token = t.token;
    a.cancel(t);
    b.progress().unwrap();
    a.progress().unwrap();
    assert_eq!(a.stats().rejected(Reject::UnknownToken), 1);
    let spent = Ticket { token, peer: 1 };
    assert_eq!(a.test(&spent).unwrap_err(), NetError::UnknownHandle);
}

#[test]
fn timeout_when_the_peer_never_progresses() {
    let (_net, a, _b) = pair(Delivery::Auto);
    let t = a.request(1, 1, b"x").unwrap();
    let e = a.wait(t, Some(Duration::from_millis(30))).unwrap_err();
    assert_eq!(e, NetError::Timeout);
    assert_eq!(a.outstanding(), 0);
}

#[test]
fn needs_a_data_slot() {
    let net = SimNet::new(SimConfig {
        slots: 3,
        ..SimConfig::new(2, 1, Delivery::Auto)
    });
    let e = Am::new(net.link(0), NetSettings::default()).err();
    assert_eq!(e, Some(NetError::BadConfig));
}

#[test]
fn progress_thread_stops_on_drop_and_finalize() {
    let net = SimNet::new(SimConfig::new(2, 1, Delivery::Auto));
    let s = NetSettings {
        progress_thread: true,
        ..NetSettings::default()
    };
    for _ in 0..20 {
        let a = Am::new(net.link(0), s).unwrap();
        assert!(a.has_progress_thread());
        drop(a);
    }
    let a = Am::new(net.link(0), s).unwrap();
    a.finalize().unwrap();
    assert!(!a.has_progress_thread());
}

/// `FH_PROGRESS_SPIN_US`: the thread answers requests in every mode; with a spin longer than
/// the test (or `inf`) it never sleeps on the link between them (no wake-ups counted), with 0 it
/// sleeps whenever a poll found nothing. `finalize` stops even a thread that never sleeps.
#[test]
fn progress_thread_spin_modes() {
    for (spin, sleeps) in [
        (None, false),
        (Some(Duration::from_secs(20)), false),
        (Some(Duration::ZERO), true),
    ] {
        let net = SimNet::new(SimConfig::new(2, 1, Delivery::Auto));
        let a = Am::new(net.link(0), NetSettings::default()).unwrap();
        let s = NetSettings {
            progress_thread: true,
            progress_spin: spin,
            ..NetSettings::default()
        };
        let b = Am::new(net.link(1), s).unwrap();
        b.register_request(1, |_, p, r| r.reply(p).unwrap());
        for i in 0..50u32 {
            assert_eq!(a.call(1, 1, &i.to_le_bytes()).unwrap(), i.to_le_bytes());
        }
        std::thread::sleep(Duration::from_millis(30));
        let w = b.stats().progress_wakeups;
        assert_eq!(w > 0, sleeps, "spin {spin:?}: {w} wake-ups");
        let t0 = std::time::Instant::now();
        b.finalize().unwrap();
        assert!(t0.elapsed() < Duration::from_secs(5), "spin {spin:?}");
        assert!(!b.has_progress_thread());
    }
}

/// A peer sends as soon as the link is up. An endpoint built paused delivers nothing until its
/// owner has registered the handler and started the thread, so the message is handled, not
/// rejected. With the thread started at once (`Am::new`, what `Peers::new` did before) the
/// message is rejected as an unknown handler: the first barrier of a 4-rank job with progress
/// threads lost its message that way and timed out.
#[test]
fn a_paused_endpoint_delivers_nothing_before_its_handlers_exist() {
    for paused in [true, false] {
        let net = SimNet::new(SimConfig::new(2, 1, Delivery::Auto));
        let s = NetSettings {
            progress_thread: true,
            ..NetSettings::default()
        };
        let a = if paused {
            Am::new_paused(net.link(0), s).unwrap()
        } else {
            Am::new(net.link(0), s).unwrap()
        };
        let b = Am::new(net.link(1), NetSettings::default()).unwrap();
        b.send_oneway(0, 7, b"early").unwrap();
        // The owner is slow to register (descheduled, say).
        std::thread::sleep(Duration::from_millis(100));
        let got = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let g = got.clone();
        a.register_oneway(7, move |_, p| {
            assert_eq!(p, b"early");
            g.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        a.start_progress_thread().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while got.load(std::sync::atomic::Ordering::SeqCst) == 0
            && a.stats().rejected_total() == 0
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        if paused {
            assert_eq!(got.load(std::sync::atomic::Ordering::SeqCst), 1);
            assert_eq!(a.stats().rejected_total(), 0);
        } else {
            assert_eq!(
                a.stats().rejected_total(),
                1,
                "started at once, the thread rejects the early message"
            );
        }
        a.finalize().unwrap();
        b.finalize().unwrap();
    }
}

/// A link that counts how the progress thread sleeps on it, and its polls.
struct CountingLink {
    inner: Arc<dyn Link>,
    waits: std::sync::atomic::AtomicU64,
    message_waits: std::sync::atomic::AtomicU64,
    polls: std::sync::atomic::AtomicU64,
    /// `wait_messages` as on verbs with no message coming: it sleeps the whole timeout and
    /// says nothing came (the simulator's own wait ends as soon as an RDMA op is in flight).
    /// Like verbs too, `wake` ends a sleep, so the progress thread's sleeps are its long ones
    /// (`Link::wakes`).
    no_messages: bool,
    woken: std::sync::atomic::AtomicBool,
}

impl CountingLink {
    fn over(inner: Arc<dyn Link>, no_messages: bool) -> CountingLink {
        CountingLink {
            inner,
            waits: 0.into(),
            message_waits: 0.into(),
            polls: 0.into(),
            no_messages,
            woken: false.into(),
        }
    }
}

impl Link for CountingLink {
    fn rank(&self) -> Rank {
        self.inner.rank()
    }
    fn size(&self) -> u32 {
        self.inner.size()
    }
    fn max_msg(&self) -> usize {
        self.inner.max_msg()
    }
    fn recv_slots(&self) -> u32 {
        self.inner.recv_slots()
    }
    fn send(&self, peer: Rank, msg: &[u8]) -> Result<(), LinkError> {
        self.inner.send(peer, msg)
    }
    fn poll(&self, on_event: &mut dyn FnMut(LinkEvent<'_>)) -> Result<usize, LinkError> {
        self.polls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.poll(on_event)
    }
    fn wait(&self, timeout: Duration) -> Result<(), LinkError> {
        self.waits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if self.no_messages {
            // The simulator's wait cannot be woken: a short one (a wake-up that finds nothing).
            return self.inner.wait(timeout.min(Duration::from_millis(10)));
        }
        self.inner.wait(timeout)
    }
    fn wait_messages(&self, timeout: Duration) -> Result<bool, LinkError> {
        use std::sync::atomic::Ordering::Relaxed;
        self.message_waits.fetch_add(1, Relaxed);
        if self.no_messages {
            let end = std::time::Instant::now() + timeout;
            while std::time::Instant::now() < end {
                if self.woken.swap(false, Relaxed) {
                    return Ok(true);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            return Ok(false);
        }
        self.inner.wait_messages(timeout)
    }
    fn wakes(&self) -> bool {
        self.no_messages
    }
    fn wake(&self) {
        self.woken.store(true, std::sync::atomic::Ordering::Relaxed);
        self.inner.wake();
    }
    fn signaled_posts(&self) -> u64 {
        self.inner.signaled_posts()
    }
    fn posting(&self) -> bool {
        self.inner.posting()
    }
    fn probe(&self, peer: Rank) -> Result<(), LinkError> {
        self.inner.probe(peer)
    }
    fn max_rdma(&self) -> usize {
        self.inner.max_rdma()
    }
    unsafe fn rdma(&self, peer: Rank, op: crate::net::RdmaOp) -> Result<(), LinkError> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.rdma(peer, op) }
    }
}

/// While an application thread polls in a blocking wait (`Am::polling`), the progress thread
/// sleeps for messages only (`Link::wait_messages`: on verbs the completions of the waiter's own
/// puts then do not wake it); once no one waits, it sleeps for everything again, and it answers
/// requests in both modes.
#[test]
fn progress_thread_sleeps_for_messages_only_while_a_thread_waits() {
    // A spin longer than the test: a thread that handled a request spins, unless someone polls.
    for spin in [Duration::ZERO, Duration::from_secs(20)] {
        sleeps_for_messages_only(spin);
    }
}

fn sleeps_for_messages_only(spin: Duration) {
    use std::sync::atomic::Ordering::Relaxed;
    let net = SimNet::new(SimConfig::new(2, 1, Delivery::Auto));
    let a = Am::new(net.link(0), NetSettings::default()).unwrap();
    let link = Arc::new(CountingLink::over(net.link(1), false));
    let s = NetSettings {
        progress_thread: true,
        progress_spin: Some(spin),
        ..NetSettings::default()
    };
    let b = Am::new(link.clone(), s).unwrap();
    b.register_request(1, |_, p, r| r.reply(p).unwrap());
    let counts = || (link.waits.load(Relaxed), link.message_waits.load(Relaxed));
    // The thread sleeps a tick (10 ms) at most before it looks again: 100 ms covers a sleep that
    // began before the change, with room for a loaded host (30 ms failed once beside a
    // parallel test run on two cores).
    let settle = || std::thread::sleep(Duration::from_millis(100));
    {
        let _polling = b.polling();
        settle();
        let before = counts();
        assert_eq!(a.call(1, 1, b"w").unwrap(), b"w");
        settle();
        let after = counts();
        assert_eq!(
            after.0, before.0,
            "{spin:?}: no full wait while a thread polls"
        );
        assert!(
            after.1 > before.1,
            "{spin:?}: sleeps for messages: {before:?} -> {after:?}"
        );
    }
    settle();
    let before = counts();
    assert_eq!(a.call(1, 1, b"n").unwrap(), b"n");
    settle();
    let after = counts();
    assert_eq!(
        after.1, before.1,
        "{spin:?}: no message-only wait once nobody polls"
    );
    if spin.is_zero() {
        assert!(
            after.0 > before.0,
            "full waits again: {before:?} -> {after:?}"
        );
    } else {
        assert_eq!(
            after.0, before.0,
            "{spin:?}: spinning after the request, not sleeping"
        );
    }
    assert!(
        b.stats().progress_thread_events >= 2,
        "it answered both requests"
    );
    b.finalize().unwrap();
}

/// A thread that keeps posting RDMA without waiting (on Soft-RoCE a thread streaming 64 KiB
/// WRITEs is inside the post's system call most of the time) will reap the completions in its
/// next wait: the progress thread must neither sleep for them (`wait`, which on verbs arms the
/// send CQ and wakes for each) nor poll at its timeouts while the posts go on (it took their
/// completions: 64 KiB put bandwidth 40-47 MB/s against 49-51 without a progress thread), and
/// its sleeps lengthen while the posts go on (10 ms each woke it ~100 times a second beside a
/// stream, for nothing). Once the posts stop, it takes over and every completion is reported.
#[test]
fn progress_thread_leaves_a_posting_threads_completions_to_it() {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    // Written by the simulated WRITEs through a raw pointer (taken from a unique borrow).
    let mut target = [0u8; 64];
    let target_addr = target.as_mut_ptr() as u64;
    let src = [7u8; 8];
    let net = SimNet::new(SimConfig::new(2, 1, Delivery::Auto));
    let _a = Am::new(net.link(0), NetSettings::default()).unwrap();
    let link = Arc::new(CountingLink::over(net.link(1), true));
    let s = NetSettings {
        progress_thread: true,
        progress_spin: Some(Duration::ZERO),
        ..NetSettings::default()
    };
    let b = Am::new(link.clone(), s).unwrap();
    let done = Arc::new(AtomicU64::new(0));
    let d = done.clone();
    b.set_rdma_handler(Some(Box::new(move |_, _, r| {
        r.expect("the WRITE succeeds");
        d.fetch_add(1, Relaxed);
    })));
    // SAFETY: `target` (and `src`) are declared before the ranks, so they outlive every op even
    // when an assert fails.
    let rkey = unsafe { net.register(0, target_addr, target.len()) };
    let counts = || {
        (
            link.waits.load(Relaxed),
            link.message_waits.load(Relaxed),
            link.polls.load(Relaxed),
        )
    };
    std::thread::sleep(Duration::from_millis(100));
    let before = counts();
    let mut posted = 0u64;
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_millis(600) {
        let op = RdmaOp {
            kind: crate::net::RdmaKind::Write,
            local_addr: src.as_ptr() as u64,
            lkey: 0,
            len: src.len(),
            remote_addr: target_addr,
            rkey,
            token: posted,
        };
        // SAFETY: `src` stays readable and `target` registered until every op is reported.
        unsafe { link.rdma(0, op) }.unwrap();
        posted += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    let during = counts();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while done.load(Relaxed) < posted && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        done.load(Relaxed),
        posted,
        "once the posts stop, the progress thread reports every completion"
    );
    let (waits, message_waits, polls) = (
        during.0 - before.0,
        during.1 - before.1,
        during.2 - before.2,
    );
    assert!(
        waits <= 2,
        "no full sleep while posts go on: {waits} full, {message_waits} for messages"
    );
    assert!(message_waits >= 2, "{message_waits} sleeps for messages");
    // 10, 20, 40, 80, 160, 160, ... ms: ~7 in 600 ms; at 10 ms each, ~60.
    assert!(
        message_waits <= 12,
        "the sleeps lengthen while the posts go on: {message_waits} sleeps in 600 ms"
    );
    assert!(
        polls <= 6,
        "no poll at the timeouts of its sleeps while posts go on: {polls} polls over {posted} posts"
    );
    b.finalize().unwrap();
}
