//! The `Am` endpoint: what callers use (register, request/wait/test, one-way, progress,
//! finalize), and the shared state (`Inner`) that the progress thread and `Replier`s also reach.

use super::handlers::{Handler, Handlers};
use super::peer::{Out, Peer};
use super::progress_thread::ProgressThread;
use super::tickets::Tickets;
use crate::net::credits::PeerFlow;
use crate::net::settings::NetSettings;
use crate::net::stats::{Stats, StatsSnapshot};
use crate::net::wire::{Header, Kind, HEADER_LEN};
use crate::net::{Link, LinkError, Rank};
use crate::status::{fh_status, FhResult};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// `wait` reads the clock once per this many empty polls.
const CLOCK_EVERY: u32 = 16;

/// An outstanding request: pass it to `Am::wait` (or poll it with `Am::test`).
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a request's reply is only collected through its ticket"]
pub struct Ticket {
    pub(super) token: u32,
    pub(super) peer: Rank,
}

impl Ticket {
    /// The rank the request went to.
    pub fn peer(&self) -> Rank {
        self.peer
    }
}

/// The way back to a requester, handed to a request handler. It may be kept and used after the
/// handler returned (a reply that needs other messages first). Dropped without `reply`, the
/// requester's ticket ends in `FH_ERR_TIMEOUT` (or `PEER_LOST`/`FINALIZED`).
#[derive(Debug)]
pub struct Replier {
    pub(super) inner: Weak<Inner>,
    pub(super) peer: Rank,
    pub(super) token: u32,
}

impl Replier {
    /// The requester.
    pub fn peer(&self) -> Rank {
        self.peer
    }

    /// Sends the reply (non-blocking: queued if no credit is free). `FH_ERR_FINALIZED` if the
    /// endpoint is finalized or gone.
    pub fn reply(self, payload: &[u8]) -> FhResult<()> {
        let inner = self.inner.upgrade().ok_or(fh_status::FH_ERR_FINALIZED)?;
        inner.send_msg(self.peer, Kind::Reply, 0, self.token, payload)
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
    pub rank: Rank,
    pub size: u32,
    pub settings: NetSettings,
    pub max_payload: usize,
    pub handlers: Handlers,
    pub tickets: Tickets,
    /// Indexed by rank; the own rank's entry is unused (loopback needs no credits).
    pub peers: Vec<Mutex<Peer>>,
    pub loopback: Mutex<VecDeque<Loopback>>,
    pub finalized: AtomicBool,
    pub stats: Stats,
    pub me: Weak<Inner>,
}

pub(super) fn map_link_err(e: &LinkError) -> fh_status {
    match e {
        LinkError::BadRank(_) => fh_status::FH_ERR_BAD_RANK,
        LinkError::TooLong { .. } => fh_status::FH_ERR_MSG_TOO_LONG,
        LinkError::Closed => fh_status::FH_ERR_FINALIZED,
        // A device error on one connection (verbs: the QP went to error) loses that peer.
        LinkError::PeerLost(_) | LinkError::Device(_) => fh_status::FH_ERR_PEER_LOST,
    }
}

impl Inner {
    pub fn peer(&self, r: Rank) -> MutexGuard<'_, Peer> {
        self.peers[r as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    pub fn out(&self, to: Rank) -> Out<'_> {
        Out {
            link: &*self.link,
            stats: &self.stats,
            to,
        }
    }

    /// Sends a request, reply or one-way message (or queues it for a credit, or for the own rank).
    pub fn send_msg(
        &self,
        peer: Rank,
        kind: Kind,
        handler: u16,
        token: u32,
        payload: &[u8],
    ) -> FhResult<()> {
        if self.finalized.load(Ordering::Acquire) {
            return Err(fh_status::FH_ERR_FINALIZED);
        }
        if peer >= self.size {
            return Err(fh_status::FH_ERR_BAD_RANK);
        }
        if payload.len() > self.max_payload {
            return Err(fh_status::FH_ERR_MSG_TOO_LONG);
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
            self.stats.sent(kind, HEADER_LEN + payload.len());
            return Ok(());
        }
        let mut p = self.peer(peer);
        if p.closed() {
            return Err(fh_status::FH_ERR_PEER_LOST);
        }
        match p.send_data(&self.out(peer), header, payload) {
            Ok(true) => Ok(()),
            Ok(false) => {
                self.stats.credit_stall();
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
    pub fn lose(&self, peer: Rank) {
        let mut p = self.peer(peer);
        let first = !p.lost;
        p.lost = true;
        p.flow.drain_pending().for_each(drop);
        drop(p);
        if first {
            self.stats.peer_lost();
        }
        self.tickets
            .fail_peer(Some(peer), fh_status::FH_ERR_PEER_LOST);
    }

    fn wait(&self, t: &Ticket, timeout: Option<Duration>) -> FhResult<Vec<u8>> {
        let start = Instant::now();
        let deadline = timeout.or(self.settings.timeout).map(|d| start + d);
        let probe = self.settings.probe;
        let mut next_probe = start + probe;
        let mut idle = 0u32;
        // When the current run of empty polls began (read at its first clock check).
        let mut idle_since: Option<Instant> = None;
        loop {
            if let Some(out) = self.tickets.take(t.token) {
                return out;
            }
            if self.progress()? > 0 {
                idle = 0;
                idle_since = None;
                continue;
            }
            // The clock is read only every few empty polls: under emulation (Soft-RoCE in a TCG
            // VM) one read is a system call of several microseconds, as long as a poll itself.
            idle += 1;
            if idle % CLOCK_EVERY != 0 {
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                self.tickets.forget(t.token);
                return Err(fh_status::FH_ERR_TIMEOUT);
            }
            if now >= next_probe && t.peer != self.rank {
                // A silent peer shows up as PeerLost from a later poll, failing the ticket.
                self.stats.probe();
                let _ = self.link.probe(t.peer);
                next_probe = now + probe;
            }
            // Spin for up to `FH_AM_SPIN_US` (a reply is microseconds away on a fast link, and a
            // sleep costs a scheduler wake-up that can exceed the round trip), then sleep
            // briefly so that many waiting threads do not all spin on one link.
            if now - *idle_since.get_or_insert(now) >= self.settings.spin {
                self.tickets.sleep(t.token, Duration::from_micros(200));
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
    /// per peer (`FH_ERR_BAD_CONFIG` otherwise). Starts the progress thread if the settings say so.
    pub fn new(link: Arc<dyn Link>, settings: NetSettings) -> FhResult<Am> {
        let (rank, size) = (link.rank(), link.size());
        let max_size = settings.max_size.min(link.max_msg());
        if max_size <= HEADER_LEN || rank >= size {
            return Err(fh_status::FH_ERR_BAD_CONFIG);
        }
        let peers = (0..size)
            .map(|_| {
                PeerFlow::new(link.recv_slots())
                    .map(|f| Mutex::new(Peer::new(f, max_size)))
                    .ok_or(fh_status::FH_ERR_BAD_CONFIG)
            })
            .collect::<FhResult<Vec<_>>>()?;
        let inner = Arc::new_cyclic(|me| Inner {
            link,
            rank,
            size,
            settings,
            max_payload: max_size - HEADER_LEN,
            handlers: Handlers::default(),
            tickets: Tickets::default(),
            peers,
            loopback: Mutex::new(VecDeque::new()),
            finalized: AtomicBool::new(false),
            stats: Stats::default(),
            me: me.clone(),
        });
        let thread = if settings.progress_thread {
            Some(ProgressThread::start(inner.clone()).map_err(|_| fh_status::FH_ERR_NO_MEMORY)?)
        } else {
            None
        };
        Ok(Am {
            inner,
            thread: Mutex::new(thread),
        })
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

    /// Sends a request to handler `id` at `peer` without waiting (queued if no credit is free).
    pub fn request(&self, peer: Rank, id: u16, payload: &[u8]) -> FhResult<Ticket> {
        if peer >= self.inner.size {
            return Err(fh_status::FH_ERR_BAD_RANK);
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
    pub fn send_oneway(&self, peer: Rank, id: u16, payload: &[u8]) -> FhResult<()> {
        self.inner.send_msg(peer, Kind::OneWay, id, 0, payload)
    }

    /// Progresses once, then: `Ok(Some(reply))` (the ticket is spent), `Ok(None)` if still
    /// outstanding, or the request's error. A spent ticket is `FH_ERR_UNKNOWN_HANDLE`.
    pub fn test(&self, t: &Ticket) -> FhResult<Option<Vec<u8>>> {
        self.inner.progress()?;
        self.inner.tickets.take(t.token).transpose()
    }

    /// Progresses until the reply arrives. `timeout` `None` means `FH_AM_TIMEOUT_MS`; on timeout
    /// the request is forgotten (a late reply is rejected as stale) and `FH_ERR_TIMEOUT` returned.
    /// Waits longer than `FH_AM_PROBE_MS` probe the peer, so a dead peer is `FH_ERR_PEER_LOST`.
    pub fn wait(&self, t: Ticket, timeout: Option<Duration>) -> FhResult<Vec<u8>> {
        self.inner.wait(&t, timeout)
    }

    /// `request` then `wait` with the default timeout.
    pub fn call(&self, peer: Rank, id: u16, payload: &[u8]) -> FhResult<Vec<u8>> {
        let t = self.request(peer, id, payload)?;
        self.wait(t, None)
    }

    /// Gives up on a request: its reply, if one still comes, is rejected as stale.
    pub fn cancel(&self, t: Ticket) {
        self.inner.tickets.forget(t.token);
    }

    /// Delivers what arrived (running handlers), sends what credits allow. Returns the number of
    /// events handled. Never blocks.
    pub fn progress(&self) -> FhResult<usize> {
        self.inner.progress()
    }

    /// Finishes: stops the progress thread, sends what waits for credits (for up to one probe
    /// interval), says bye to every peer, and fails outstanding requests with
    /// `FH_ERR_FINALIZED`. Afterwards every send is `FH_ERR_FINALIZED` and every message that
    /// still arrives is rejected. Idempotent. Must not be called from a handler.
    pub fn finalize(&self) -> FhResult<()> {
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            t.stop();
        }
        self.inner.finalize()
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
