//! The `Am` endpoint: what callers use (register, request/wait/test, one-way, progress,
//! finalize), and the shared state (`Inner`) that the progress thread and `Replier`s also reach.

use super::handlers::{Handler, Handlers, LostFn, RdmaFn};
use super::peer::{Out, Peer};
use super::progress_thread::{Progress, ProgressThread};
use super::replier::{Replier, SendReply};
use super::tickets::Tickets;
use crate::net::credits::PeerFlow;
use crate::net::settings::NetSettings;
use crate::net::stats::{Stats, StatsSnapshot};
use crate::net::wire::{Header, Kind, HEADER_LEN};
use crate::net::NetError;
use crate::net::{Link, LinkError, Rank};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// `wait` reads the clock once per this many empty polls. Under emulation (Soft-RoCE in a TCG
/// VM, clocksource hpet) a read costs 1-3 µs, and a round trip of ~30 µs is a few dozen polls:
/// at 16, a reply waited for one or two reads; at 64, for none.
const CLOCK_EVERY: u32 = 64;
/// A spinning `wait` starts yielding the CPU (at each clock check) after this many empty polls.
const YIELD_AFTER: u32 = 4 * CLOCK_EVERY;

/// An outstanding request: pass it to `Am::wait` (or poll it with `Am::test`).
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a request's reply is only collected through its ticket"]
pub struct Ticket {
    pub(super) token: u32,
    pub(super) peer: Rank,
}

impl SendReply for Inner {
    fn send_reply(&self, peer: Rank, token: u32, payload: &[u8]) -> Result<(), NetError> {
        self.send_msg(peer, Kind::Reply, 0, token, payload)
    }
}

impl Progress for Inner {
    fn progress(&self) -> Result<usize, NetError> {
        Inner::progress(self)
    }
    fn link(&self) -> &Arc<dyn Link> {
        &self.link
    }
    fn spin(&self) -> Option<Duration> {
        self.settings.progress_spin
    }
    fn woke(&self) {
        self.stats.progress_wakeup();
    }
    fn waits(&self) -> (u64, u64) {
        // Begun first: a wait that begins and ends between the two loads reads as running.
        let begun = self.waits_begun.load(Ordering::Acquire);
        (begun, self.waits_ended.load(Ordering::Acquire))
    }
    fn handled(&self, events: usize) {
        self.stats.progress_thread_events(events);
    }
}

/// Marks an application thread as polling in a wait (`Am::polling`) while it lives.
pub struct Polling<'a>(&'a AtomicU64);

impl Drop for Polling<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Release);
    }
}

/// A message to the own rank: delivered by `progress`, never through the link.
pub(super) struct Loopback {
    pub header: Header,
    pub payload: Vec<u8>,
}

/// Everything the endpoint, its progress thread and its repliers share.
pub(super) struct Inner {
    pub link: Arc<dyn Link>,
    /// `link`'s object, for the poll of every progress (`LinkObj`).
    pub link_obj: LinkObj,
    pub rank: Rank,
    pub size: u32,
    pub settings: NetSettings,
    pub max_payload: usize,
    pub handlers: Handlers,
    pub tickets: Tickets,
    /// Indexed by rank; the own rank's entry is unused (loopback needs no credits).
    pub peers: Vec<Mutex<Peer>>,
    pub loopback: Mutex<VecDeque<Loopback>>,
    /// Messages in `loopback` (bumped after a push): `progress` takes its lock only when non-zero.
    pub loopback_len: AtomicUsize,
    pub finalized: AtomicBool,
    /// A message for an unregistered handler was logged (once per endpoint).
    pub warned_no_handler: AtomicBool,
    /// `FH_AM_MAX_QUEUED`: bytes that may wait for credits toward one peer.
    pub max_queued: AtomicUsize,
    /// Waits of application threads (`Am::polling`) begun and ended: while one runs,
    /// or while they keep coming, the waiters reap the completions of their own sends and RDMA,
    /// and the progress thread sleeps for messages only.
    pub waits_begun: AtomicU64,
    pub waits_ended: AtomicU64,
    pub stats: Stats,
    pub me: Weak<Inner>,
}

/// The object of an `Arc<dyn Link>`, its address taken once: a call through the `Arc` works it
/// out from the vtable's alignment every time, and every progress polls.
pub(super) struct LinkObj(*const dyn Link);

// SAFETY: a shared pointer to a `dyn Link`, which is `Send + Sync`; it is only dereferenced
// while the `Arc` it came from lives (`Inner` holds both).
unsafe impl Send for LinkObj {}
// SAFETY: as above.
unsafe impl Sync for LinkObj {}

impl LinkObj {
    pub(super) fn of(link: &Arc<dyn Link>) -> LinkObj {
        LinkObj(Arc::as_ptr(link))
    }

    /// # Safety
    /// The `Arc` it was taken from lives for `'a`.
    #[inline(always)]
    pub(super) unsafe fn get<'a>(&self) -> &'a dyn Link {
        // SAFETY: the caller's contract.
        unsafe { &*self.0 }
    }
}

pub(super) fn map_link_err(e: &LinkError) -> NetError {
    match e {
        LinkError::BadRank(_) => NetError::BadRank,
        LinkError::TooLong { .. } => NetError::MsgTooLong,
        LinkError::Closed => NetError::Finalized,
        // A device error on one connection (verbs: the QP went to error) loses that peer.
        LinkError::PeerLost(_) | LinkError::Device(_) => NetError::PeerLost,
        // Refused before posting.
        LinkError::ZeroLength => NetError::ZeroLength,
        LinkError::Overflow => NetError::Overflow,
        // The target refused the access, and the connection broke with it (RC).
        LinkError::RemoteAccess(_) => NetError::PeerLost,
    }
}

impl Inner {
    pub(super) fn peer(&self, r: Rank) -> MutexGuard<'_, Peer> {
        self.peers[r as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn out(&self, to: Rank) -> Out<'_> {
        Out {
            link: &*self.link,
            stats: &self.stats,
            to,
        }
    }

    /// Sends a request, reply or one-way message (or queues it for a credit, or for the own rank).
    pub(super) fn send_msg(
        &self,
        peer: Rank,
        kind: Kind,
        handler: u16,
        token: u32,
        payload: &[u8],
    ) -> Result<(), NetError> {
        if self.finalized.load(Ordering::Acquire) {
            return Err(NetError::Finalized);
        }
        if peer >= self.size {
            return Err(NetError::BadRank);
        }
        if payload.len() > self.max_payload {
            return Err(NetError::MsgTooLong);
        }
        let header = Header {
            kind,
            handler,
            credits: 0,
            token,
            len: payload.len() as u32,
        };
        if peer == self.rank {
            self.loopback
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push_back(Loopback {
                    header,
                    payload: payload.to_vec(),
                });
            self.loopback_len.fetch_add(1, Ordering::AcqRel);
            self.stats.sent(kind, HEADER_LEN + payload.len());
            return Ok(());
        }
        let mut p = self.peer(peer);
        if p.closed() {
            return Err(NetError::PeerLost);
        }
        match p.send_data(&self.out(peer), header, payload) {
            Ok(true) => Ok(()),
            Ok(false) => {
                self.stats.credit_stall();
                if p.queued_bytes > self.max_queued.load(Ordering::Relaxed) {
                    // The peer withholds credits while we keep queuing (`queue_bound`).
                    drop(p);
                    self.stats.queue_overflow();
                    self.give_up(peer);
                    return Err(NetError::PeerLost);
                }
                Ok(())
            }
            Err(e) => {
                drop(p);
                if matches!(e, LinkError::PeerLost(_)) {
                    self.lose(peer);
                }
                Err(map_link_err(&e))
            }
        }
    }

    /// The connection to `peer` is gone: fail everything waiting on it, queued messages too.
    pub(super) fn lose(&self, peer: Rank) {
        let mut p = self.peer(peer);
        let first = !p.lost;
        p.lost = true;
        p.drop_queued();
        drop(p);
        if first {
            self.stats.peer_lost();
        }
        self.tickets.fail_peer(Some(peer), NetError::PeerLost);
        self.tell_lost(peer);
    }

    /// Tells the peer-loss handler about `peer`, once whatever the cause (a loss, a goodbye,
    /// giving up on it).
    pub(super) fn tell_lost(&self, peer: Rank) {
        let first = !std::mem::replace(&mut self.peer(peer).told_lost, true);
        if first {
            if let Some(f) = self.handlers.lost() {
                f(peer);
            }
        }
    }

    /// Declares a live `peer` lost (see `Am::give_up`).
    pub(super) fn give_up(&self, peer: Rank) {
        if peer >= self.size || peer == self.rank {
            return;
        }
        {
            let mut p = self.peer(peer);
            if p.lost {
                return;
            }
            p.drop_queued();
            if !p.closed() {
                // Best effort, on the slot reserved for it: the peer then fails what it waits
                // on us for at once instead of after its own bound.
                let _ = p.send_control(&self.out(peer), Kind::Bye);
            }
            p.said_bye = true;
        }
        self.stats.peer_given_up();
        self.lose(peer);
    }

    fn wait(&self, t: &Ticket, timeout: Option<Duration>) -> Result<Vec<u8>, NetError> {
        let timeout = timeout.or(self.settings.timeout);
        let probe = self.settings.probe;
        // The clock is first read at the first check after some empty polls, not here: under
        // emulation (Soft-RoCE in a TCG VM) one read is a system call of several microseconds,
        // a good part of a round trip. The timeout counts from that first check (CLOCK_EVERY
        // polls late at most).
        let mut clock: Option<(Option<Instant>, Instant)> = None; // (deadline, next probe)
        let mut idle = 0u32;
        // When the current run of empty polls began (read at its first clock check).
        let mut idle_since: Option<Instant> = None;
        // The ticket table is looked at only when some outcome was set since the last look.
        let mut seen = None;
        loop {
            let settled = self.tickets.settled();
            if seen != Some(settled) {
                if let Some(out) = self.tickets.take(t.token) {
                    return out;
                }
                seen = Some(settled);
            }
            if self.progress()? > 0 {
                idle = 0;
                idle_since = None;
                continue;
            }
            // The clock is read only every few empty polls (see above).
            idle += 1;
            if idle % CLOCK_EVERY != 0 {
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            let (deadline, np) = clock
                .get_or_insert_with(|| (timeout.and_then(|d| now.checked_add(d)), now + probe));
            if deadline.is_some_and(|d| now >= d) {
                self.tickets.forget(t.token);
                return Err(NetError::Timeout);
            }
            if now >= *np && t.peer != self.rank {
                // A silent peer shows up as PeerLost from a later poll, failing the ticket.
                self.stats.probe();
                let _ = self.link.probe(t.peer);
                *np = now + probe;
            }
            // Spin for up to `FH_AM_SPIN_US` (a reply is microseconds away on a fast link, and a
            // sleep costs a scheduler wake-up that can exceed the round trip), then sleep
            // briefly so that many waiting threads do not all spin on one link.
            if now - *idle_since.get_or_insert(now) >= self.settings.spin {
                self.tickets.sleep(t.token, Duration::from_micros(200));
            } else if idle >= YIELD_AFTER {
                // Still spinning, but give the CPU away for a moment: kernel work queued on this
                // CPU must not wait for a scheduler tick to preempt us. Soft-RoCE (Linux 6.1)
                // delivers completion events from a tasklet, run by ksoftirqd on the CPU that
                // posted the send, i.e. this one: a peer's progress thread sleeping for our
                // request is woken only once that runs (measured in the VM: 1-8 ms per request
                // with a spinning requester). Not in the first polls: a yield is a system call
                // (1.4-4 µs under TCG), and a polled reply comes within them.
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

/// An active-message endpoint over a `Link`. Thread-safe: share it (`Arc<Am>`) and call
/// everything from any thread. Handlers must not capture an `Arc<Am>` of their own endpoint
/// (that cycle would keep it alive forever); they reply through their `Replier`.
pub struct Am {
    inner: Arc<Inner>,
    thread: Mutex<Option<ProgressThread>>,
}

impl Am {
    /// An endpoint over `link`. The link must keep at least `credits::RESERVED + 1` receive slots
    /// per peer (`NetError::BadConfig` otherwise). Starts the progress thread if the settings say so.
    pub fn new(link: Arc<dyn Link>, settings: NetSettings) -> Result<Am, NetError> {
        let am = Self::new_paused(link, settings)?;
        am.start_progress_thread()?;
        Ok(am)
    }

    /// Like [`Am::new`], but the progress thread (if the settings want one) starts only at
    /// [`Am::start_progress_thread`]. Why: a progress thread delivers what arrives at once, and
    /// a message whose handler is not registered yet is rejected and lost. A peer may send as
    /// soon as the link is up (e.g. its first barrier round), so the owner registers its
    /// handlers first, then starts the thread. Without a thread nothing is delivered before the
    /// owner's first call, which comes after its registrations.
    pub(crate) fn new_paused(link: Arc<dyn Link>, settings: NetSettings) -> Result<Am, NetError> {
        let (rank, size) = (link.rank(), link.size());
        let max_size = settings.max_size.min(link.max_msg());
        if max_size <= HEADER_LEN || rank >= size {
            return Err(NetError::BadConfig);
        }
        let peers = (0..size)
            .map(|_| {
                PeerFlow::new(link.recv_slots())
                    .map(|f| Mutex::new(Peer::new(f, max_size)))
                    .ok_or(NetError::BadConfig)
            })
            .collect::<Result<Vec<_>, NetError>>()?;
        let inner = Arc::new_cyclic(|me| Inner {
            link_obj: LinkObj::of(&link),
            link,
            rank,
            size,
            settings,
            max_payload: max_size - HEADER_LEN,
            handlers: Handlers::default(),
            tickets: Tickets::default(),
            peers,
            loopback: Mutex::new(VecDeque::new()),
            loopback_len: AtomicUsize::new(0),
            finalized: AtomicBool::new(false),
            warned_no_handler: AtomicBool::new(false),
            max_queued: AtomicUsize::new(settings.max_queued),
            waits_begun: AtomicU64::new(0),
            waits_ended: AtomicU64::new(0),
            stats: Stats::default(),
            me: me.clone(),
        });
        Ok(Am {
            inner,
            thread: Mutex::new(None),
        })
    }

    /// Starts the progress thread if the settings want one and it is not running yet (nor
    /// finalized). Idempotent.
    pub(crate) fn start_progress_thread(&self) -> Result<(), NetError> {
        let mut t = self.thread.lock().unwrap_or_else(|e| e.into_inner());
        if !self.inner.settings.progress_thread
            || t.is_some()
            || self.inner.finalized.load(Ordering::Acquire)
        {
            return Ok(());
        }
        *t = Some(ProgressThread::start(self.inner.clone()).map_err(|_| NetError::NoMemory)?);
        Ok(())
    }

    pub fn rank(&self) -> Rank {
        self.inner.rank
    }
    pub fn size(&self) -> u32 {
        self.inner.size
    }
    /// The largest payload `request`, `send_oneway` and `reply` accept.
    pub fn max_payload(&self) -> usize {
        self.inner.max_payload
    }

    /// Registers (or replaces) the request handler of `id`. It runs inside `progress` (of any
    /// thread, or of the progress thread) with no endpoint lock held.
    pub fn register_request<F>(&self, id: u16, f: F)
    where
        F: Fn(Rank, &[u8], Replier) + Send + Sync + 'static,
    {
        self.inner.handlers.set(id, Handler::Request(Arc::new(f)));
    }

    /// Registers (or replaces) the one-way handler of `id`.
    pub fn register_oneway<F>(&self, id: u16, f: F)
    where
        F: Fn(Rank, &[u8]) + Send + Sync + 'static,
    {
        self.inner.handlers.set(id, Handler::OneWay(Arc::new(f)));
    }

    /// Sets the handler that receives every RDMA completion this endpoint's `progress` polls
    /// off the link (`LinkEvent::RdmaDone`: peer, the op's token, its result), or removes it with
    /// `None` (completions are then counted in `stats` and dropped). This is how the layer above
    /// AM (Firehose's driver) learns that a `Link::rdma` it posted finished: it runs inside
    /// `progress` of whatever thread (or the progress thread) polled, with no endpoint lock held,
    /// so it may post more RDMA or send messages. A peer's completions come in posting order (as
    /// one poll takes them: see `net::link`) and before that peer's loss fails the AM requests
    /// waiting on it.
    pub fn set_rdma_handler(&self, f: Option<Box<RdmaFn>>) {
        self.inner.handlers.set_rdma(f.map(Arc::from));
    }

    /// The RDMA completion handler set now, if any. A second user of the link (a benchmark's
    /// baseline next to Firehose's driver) takes it, installs its own handler that keeps the
    /// tokens it posted and passes every other completion on to this one.
    pub fn rdma_handler(&self) -> Option<Arc<RdmaFn>> {
        self.inner.handlers.rdma()
    }

    /// Sets the handler told (once per peer) that a peer is lost (its connection broke, it said
    /// goodbye, or this rank gave up on it), or removes it with `None`. It
    /// may run on any thread, possibly inside a `send` that found the peer gone, so it must only
    /// record the fact (it must not send or take locks its caller may hold).
    pub(crate) fn set_peer_lost_handler(&self, f: Option<Box<LostFn>>) {
        self.inner.handlers.set_lost(f.map(Arc::from));
    }

    /// The link under this endpoint: post RDMA through it (`Link::rdma`); completions come back
    /// through `set_rdma_handler`.
    pub fn link(&self) -> &Arc<dyn Link> {
        &self.inner.link
    }

    /// `link` as the object itself (for a post on a hot path: no `Arc` to look through).
    #[inline(always)]
    pub(crate) fn link_obj(&self) -> &dyn Link {
        // SAFETY: `link_obj` is `self.inner.link`'s object, which lives as long as `self.inner`,
        // which lives as long as `self`.
        unsafe { self.inner.link_obj.get() }
    }

    /// Sends a request to handler `id` at `peer` without waiting (queued if no credit is free).
    pub fn request(&self, peer: Rank, id: u16, payload: &[u8]) -> Result<Ticket, NetError> {
        if peer >= self.inner.size {
            return Err(NetError::BadRank);
        }
        let token = self.inner.tickets.open(peer);
        match self.inner.send_msg(peer, Kind::Request, id, token, payload) {
            Ok(()) => Ok(Ticket { token, peer }),
            Err(e) => {
                self.inner.tickets.forget(token);
                Err(e)
            }
        }
    }

    /// Sends a message to one-way handler `id` at `peer` (no reply; queued if no credit).
    pub fn send_oneway(&self, peer: Rank, id: u16, payload: &[u8]) -> Result<(), NetError> {
        self.inner.send_msg(peer, Kind::OneWay, id, 0, payload)
    }

    /// Progresses once, then: `Ok(Some(reply))` (the ticket is spent), `Ok(None)` if still
    /// outstanding, or the request's error. A spent ticket is `NetError::UnknownHandle`.
    pub fn test(&self, t: &Ticket) -> Result<Option<Vec<u8>>, NetError> {
        self.inner.progress()?;
        self.inner.tickets.take(t.token).transpose()
    }

    /// Progresses until the reply arrives. `timeout` `None` means `FH_AM_TIMEOUT_MS`; on timeout
    /// the request is forgotten (a late reply is rejected as stale) and `NetError::Timeout` returned.
    /// Waits longer than `FH_AM_PROBE_MS` probe the peer, so a dead peer is `NetError::PeerLost`.
    pub fn wait(&self, t: Ticket, timeout: Option<Duration>) -> Result<Vec<u8>, NetError> {
        let _polling = self.polling();
        self.inner.wait(&t, timeout)
    }

    /// Says, while the guard lives, that the calling thread polls this endpoint in a wait
    /// (`wait` here; `rma`'s `wait`, `quiet`, `test`, `progress`): the progress thread then
    /// sleeps for incoming messages only (`Link::wait_messages`) and leaves the completions of
    /// this rank's own sends and RDMA to the waiter. Without this, each completion a waiter spins for also woke the progress
    /// thread, and the two threads shared the CPU with the device's kernel work: in the
    /// Soft-RoCE VM an 8-byte put took twice as long (see docs/benchmarks.md).
    #[inline]
    pub fn polling(&self) -> Polling<'_> {
        self.inner.waits_begun.fetch_add(1, Ordering::AcqRel);
        Polling(&self.inner.waits_ended)
    }

    /// `request` then `wait` with the default timeout.
    pub fn call(&self, peer: Rank, id: u16, payload: &[u8]) -> Result<Vec<u8>, NetError> {
        let t = self.request(peer, id, payload)?;
        self.wait(t, None)
    }

    /// Gives up on a request: its reply, if one still comes, is rejected as stale.
    pub fn cancel(&self, t: Ticket) {
        self.inner.tickets.forget(t.token);
    }

    /// Delivers what arrived (running handlers), sends what credits allow. Returns the number of
    /// events handled. Never blocks.
    #[inline]
    pub fn progress(&self) -> Result<usize, NetError> {
        self.inner.progress()
    }

    /// Finishes: stops the progress thread, sends what waits for credits (for up to one probe
    /// interval), says bye to every peer, and fails outstanding requests with
    /// `NetError::Finalized`. Afterwards every send is `NetError::Finalized` and every message that
    /// still arrives is rejected. Idempotent. Must not be called from a handler.
    pub fn finalize(&self) -> Result<(), NetError> {
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            t.stop();
        }
        self.inner.finalize()
    }

    /// Declares a live `peer` lost: it stayed silent past a bound (`rma`'s waits), or
    /// misbehaved (see `FH_AM_MAX_QUEUED`). It is told with a goodbye (best effort), everything
    /// queued for it is dropped, its requests fail with `NetError::PeerLost`, the peer-loss handler
    /// is told, and nothing more goes to it or is accepted from it. Counted in
    /// `StatsSnapshot::peers_given_up` (and `peers_lost`). Idempotent.
    pub(crate) fn give_up(&self, peer: Rank) {
        self.inner.give_up(peer)
    }

    /// Sets the bound of `FH_AM_MAX_QUEUED` (bytes waiting for credits toward one peer).
    pub fn set_max_queued(&self, bytes: usize) {
        self.inner.max_queued.store(bytes, Ordering::Relaxed);
    }

    /// Bytes of messages waiting for credits toward `peer` now.
    pub fn queued_bytes(&self, peer: Rank) -> usize {
        self.inner
            .peers
            .get(peer as usize)
            .map_or(0, |_| self.inner.peer(peer).queued_bytes)
    }

    /// Whether a progress thread runs.
    pub fn has_progress_thread(&self) -> bool {
        self.thread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.inner.stats.snapshot()
    }

    /// Requests not yet collected through `wait`/`test`/`cancel`.
    pub fn outstanding(&self) -> usize {
        self.inner.tickets.outstanding()
    }
}

impl Drop for Am {
    fn drop(&mut self) {
        // The thread holds its own Arc<Inner>: stopping it here means no thread outlives the
        // endpoint, and nothing it touches can be freed under it.
        if let Some(t) = self
            .thread
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            t.stop();
        }
    }
}
