//! `VerbsLink`: the `net::Link` over verbs RC. One RC QP per peer, one send CQ and one receive CQ
//! sharing one completion channel, receive slots registered once and pre-posted, sends copied
//! into a registered ring (or inlined), mostly unsignaled.
//!
//! Two CQs rather than one: `send` must sometimes reap send completions itself (when a peer's
//! send queue is full) and it cannot deliver receive completions it would pull out of a shared
//! CQ. With separate CQs it only ever touches send completions, and `poll` drains receives.
//!
//! The message path (`send`, `poll`) allocates nothing and makes no syscall of its own: one lock
//! per send, one `ibv_post_send` (inline up to `max_inline`), CQ polls in batches of 16, one
//! `ibv_post_recv` per delivered message. `wait` is the only place that sleeps.
//!
//! One-sided RDMA (`rdma`; `rdma_batch` posts several as one chain, one doorbell): a WRITE or READ
//! work request on the peer's QP, always signaled, in the same send-queue accounting as sends and
//! probes (so it waits for room like a send, and its completion frees room like a signaled send).
//! Its wr_id is kind `Rdma` with the sequence number; the caller's token waits in the peer's token
//! table (peer.rs). Only `poll` delivers `RdmaDone`s: those it reaps itself straight from its own
//! batch, those `send`/`rdma` reaped while waiting for room (queued in `rdma_done`) before them.
//! One `poll`'s reports keep CQ order, which is posting order per peer (RC); two polls at once (two
//! threads, or a poll nested in a callback) may interleave theirs (nothing above relies on the
//! order across ops). An error completion kills the QP (`RemoteAccess` for REM_ACCESS_ERR, else a
//! device error), later ops on it come back as WR_FLUSH_ERR and are reported `PeerLost`. The peer's
//! own `PeerLost` is held back until all its ops have been reported (at most `RDMA_FLUSH_GRACE`,
//! for a device that never flushes). Ordering (RC): ops and sends to one peer execute in posting
//! order, so a SEND after a WRITE is delivered after the write's data is placed; a READ's data is
//! valid at its `RdmaDone`. `RdmaDone` and `Recv` events come from two CQs and are not ordered
//! against each other.

use std::collections::VecDeque;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::comp_channel::CompChannel;
use super::cq::{Completion, Cq, POLL_BATCH};
use super::peer::Peer;
use super::qp::{ChainWr, SendFlags, Sge, WrOp, MAX_CHAIN};
use super::reg_buf::RegBuf;
use super::wr_id::{self, WrKind};
use crate::net::{Link, LinkError, LinkEvent, Rank, RdmaKind, RdmaOp};
use crate::pin::verbs::{Pd, VerbsError};
use crate::rt::lock::Lock;
use rdma_sys::ibv_wc_status;

/// How long `send`/`probe` wait for room in a full send queue before giving up. A dead peer is
/// detected by the QP retry timer within about a second; this only catches a wedged device.
const SEND_QUEUE_STUCK: Duration = Duration::from_secs(30);
/// At most this many CQ batches per `poll`, so one call cannot run forever under a storm.
const MAX_BATCHES_PER_POLL: usize = 8;
/// `poll` looks at the send CQ at least every this many calls even when no signaled work request
/// is outstanding: a QP that broke flushes error completions for unsignaled ones too. (The same
/// break also flushes the receive queue, which every `poll` drains, so a loss is seen anyway.)
const SEND_CQ_POLL_EVERY: u32 = 32;
/// How long a lost peer's `PeerLost` waits for the flush completions of its outstanding RDMA
/// ops (so they are reported first). A device flushes within milliseconds; past this the loss
/// is reported anyway, and a late flush still reports its op (after the `PeerLost`).
pub(super) const RDMA_FLUSH_GRACE: Duration = Duration::from_secs(5);

/// Of a chain: its signalled requests, and its RDMA ops (`post_batch`'s counts).
fn counts(chain: &[ChainWr]) -> (u64, u32) {
    chain.iter().fold((0, 0), |(s, r), c| {
        (
            s + u64::from(c.flags.signaled),
            r + u32::from(!matches!(c.op, WrOp::Send)),
        )
    })
}

/// A finished RDMA op, reaped and waiting for `poll` to report it.
type RdmaDone = (Rank, u64, Result<(), LinkError>);

/// The verbs RC link. Build it with `VerbsLink::new` (connect.rs).
pub struct VerbsLink {
    // Field order is drop order: the QPs (in `peers`) go first, so no work request can still
    // point into the buffers below when they are unmapped. CQs and the channel are freed after
    // the QPs whatever the order (each QP holds `Arc`s of its CQs, each CQ of its channel).
    pub(super) peers: Vec<Option<Peer>>,
    pub(super) send_cq: Arc<Cq>,
    pub(super) recv_cq: Arc<Cq>,
    pub(super) channel: Arc<CompChannel>,
    /// `size * recv_slots` slots of `max_msg` bytes, slot (peer, i) at `(peer * recv_slots + i)`.
    pub(super) recv_buf: RegBuf,
    /// `size * sq_depth` slots of `max_msg` bytes for copied sends, slot (peer, seq % sq_depth).
    pub(super) send_buf: RegBuf,
    /// `size` words peers write their probes into, then one word our probes are sent from.
    pub(super) probe_buf: RegBuf,
    pub(super) _pd: Arc<Pd>,
    pub(super) rank: Rank,
    pub(super) size: u32,
    pub(super) max_msg: usize,
    pub(super) recv_slots: u32,
    /// Send-queue work requests per peer (messages and probes) not yet known complete.
    pub(super) sq_depth: u32,
    /// Every `signal_every`-th work request is signaled (<= sq_depth, so a full queue always
    /// holds a signaled request whose completion frees room).
    pub(super) signal_every: u64,
    /// Inline limit the QPs actually got (0: every send is copied).
    pub(super) max_inline: usize,
    /// `Link::max_rdma`: the port's maximum message size, capped at 2 GiB.
    pub(super) max_rdma: usize,
    /// RDMA completions reaped but not yet delivered by `poll` (pre-sized for every op that can
    /// be outstanding at once; grows only if a caller posts long without polling).
    pub(super) rdma_done: Mutex<VecDeque<RdmaDone>>,
    /// Entries in `rdma_done` (bumped after a push): `poll` takes its lock only when non-zero.
    pub(super) rdma_queued: AtomicUsize,
    /// Serialises send-CQ polls (the completed counters are written under it).
    pub(super) send_reap: Lock<()>,
    /// Signaled send-queue work requests posted, and send completions reaped: while they are
    /// equal no completion is due, and `poll` skips the send CQ (but for every
    /// `SEND_CQ_POLL_EVERY`-th call, for the error completions a broken QP flushes).
    pub(super) signaled_posted: AtomicU64,
    pub(super) send_reaped: AtomicU64,
    /// `poll` calls, for `SEND_CQ_POLL_EVERY`.
    pub(super) polls: AtomicU32,
    /// The last `poll` left the receive CQ alone (it reported RDMA results): the next one looks.
    pub(super) recv_skipped: AtomicBool,
    /// Receive completions `wait` pulled out of the CQ while checking for work; `poll` delivers
    /// them first. Capacity `POLL_BATCH`, never grows. The lock also serialises receive polls.
    pub(super) recv_stash: Lock<Vec<Completion>>,
    pub(super) lost_unreported: AtomicU32,
    pub(super) len_errors: AtomicU64,
    /// Completions neither delivered nor turned into a lost peer: an undecodable `wr_id`, a rank
    /// or slot out of range, or a receive from a peer already reported lost. Only the last kind
    /// can happen in a correct run, so tests assert 0 while every peer is alive.
    pub(super) dropped: AtomicU64,
}

fn dev(e: VerbsError) -> LinkError {
    LinkError::Device(e.to_string())
}

/// `lock` that treats a poisoned lock as free (the queue stays consistent: every critical
/// section is one push or pop).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl VerbsLink {
    /// Messages up to this many bytes are sent inline (the limit the QPs actually got, capped at
    /// `max_msg`); longer ones are copied into the send ring.
    /// This link's rank (`Link::rank`, without the trait in scope).
    pub(super) fn rank_of(&self) -> Rank {
        self.rank
    }

    pub fn max_inline(&self) -> usize {
        self.max_inline
    }

    /// Receives that completed with a length error or a length above `max_msg` (each one also
    /// lost its peer). Always 0 between two `VerbsLink`s of the same settings.
    pub fn len_errors(&self) -> u64 {
        self.len_errors.load(Ordering::Relaxed)
    }

    /// Completions dropped without delivery (see the field): 0 while every peer is alive.
    pub fn dropped_completions(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn drop_one(&self) -> usize {
        self.dropped.fetch_add(1, Ordering::Relaxed);
        0
    }

    #[inline]
    fn peer(&self, peer: Rank) -> Result<&Peer, LinkError> {
        match self.peers.get(peer as usize) {
            Some(Some(p)) => Ok(p),
            _ => Err(LinkError::BadRank(peer)),
        }
    }

    fn lose(&self, peer: Rank, reason: LinkError) {
        if let Ok(p) = self.peer(peer) {
            if p.mark_lost(reason) {
                self.lost_unreported.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    /// Drain the send CQ: advance completed counters, turn error completions into lost peers,
    /// queue RDMA results on `rdma_done` for the next `poll`. Skips (returns at once) when
    /// another thread is already doing it.
    fn reap_send(&self) -> Result<(), LinkError> {
        self.reap_send_with(|d| self.queue_rdma(d))
    }

    /// `reap_send`, handing each RDMA op's result to `rdma` (called under `send_reap`: it must
    /// not call back into the link).
    fn reap_send_with(&self, mut rdma: impl FnMut(RdmaDone)) -> Result<(), LinkError> {
        let Some(_g) = self.send_reap.try_lock() else {
            return Ok(());
        };
        loop {
            let n = self
                .send_cq
                .poll_each(POLL_BATCH, |c| {
                    if let Some(d) = self.reap_one(c) {
                        rdma(d);
                    }
                })
                .map_err(dev)?;
            if n > 0 {
                // Counted after handling: a poller that sees a completion not yet counted reaps
                // once more for nothing (never the other way round, see `post`).
                // Written only here, under `send_reap`: a load and a store.
                let r = self.send_reaped.load(Ordering::Relaxed);
                self.send_reaped.store(r + n as u64, Ordering::Release);
            }
            if n < POLL_BATCH {
                return Ok(());
            }
        }
    }

    /// One send-queue completion (under `send_reap`): the peer's `completed` counter, or the
    /// peer lost; an RDMA op's result is returned, for its caller to report.
    fn reap_one(&self, c: &Completion) -> Option<RdmaDone> {
        let Some((kind, peer, low)) = wr_id::decode(c.wr_id) else {
            self.drop_one();
            return None;
        };
        let Ok(p) = self.peer(peer) else {
            self.drop_one();
            return None;
        };
        let seq = wr_id::full_seq(p.completed.load(Ordering::Acquire), low);
        if kind == WrKind::Rdma {
            // Read the token before `completed` moves past `seq` (which frees its slot).
            let result = if c.is_success() {
                Ok(())
            } else if c.status == ibv_wc_status::IBV_WC_REM_ACCESS_ERR {
                Err(LinkError::RemoteAccess(peer))
            } else if c.status == ibv_wc_status::IBV_WC_WR_FLUSH_ERR {
                Err(LinkError::PeerLost(peer))
            } else {
                Err(LinkError::Device(format!(
                    "RDMA to rank {peer}: {}",
                    c.status_text()
                )))
            };
            if let Err(e) = &result {
                self.lose(peer, e.clone());
            }
            let done = (peer, p.token(seq), result);
            if c.is_success() {
                p.complete_through(seq);
            }
            return Some(done);
        }
        if c.is_success() {
            p.complete_through(seq);
        } else {
            // RETRY_EXC_ERR (peer gone), then WR_FLUSH_ERR for everything behind it.
            let what = if kind == WrKind::Probe {
                "probe"
            } else {
                "send"
            };
            self.lose(
                peer,
                LinkError::Device(format!("{what} to rank {peer}: {}", c.status_text())),
            );
        }
        None
    }

    /// An RDMA result reaped outside `poll` (or beyond its batch): kept for the next `poll`.
    fn queue_rdma(&self, d: RdmaDone) {
        lock(&self.rdma_done).push_back(d);
        self.rdma_queued.fetch_add(1, Ordering::AcqRel);
    }

    /// Hands one RDMA result to `on_event`, then counts its op as no longer outstanding (only
    /// then: the peer's `PeerLost` must not overtake this report).
    fn report_rdma(&self, d: RdmaDone, on_event: &mut dyn FnMut(LinkEvent<'_>)) {
        let (peer, token, result) = d;
        on_event(LinkEvent::RdmaDone {
            peer,
            token,
            result,
        });
        if let Ok(p) = self.peer(peer) {
            p.rdma_outstanding.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Wait (reaping send completions) until `p` has room for one more send-queue work request.
    fn wait_for_room(&self, peer: Rank, p: &Peer, posted: u64) -> Result<(), LinkError> {
        let start = Instant::now();
        loop {
            self.reap_send()?;
            if posted - p.completed.load(Ordering::Acquire) < u64::from(self.sq_depth) {
                return Ok(());
            }
            if !p.is_alive() {
                return Err(LinkError::PeerLost(peer));
            }
            if start.elapsed() > SEND_QUEUE_STUCK {
                return Err(LinkError::Device(format!(
                    "send queue to rank {peer} made no progress for {SEND_QUEUE_STUCK:?}"
                )));
            }
            // Soft-RoCE completes from kernel work; let it run on small machines.
            std::thread::yield_now();
        }
    }

    /// Post one send-queue work request to `peer` under its lock, once there is room: `post` gets
    /// the peer, the sequence number and whether to signal, and posts.
    pub(super) fn post(
        &self,
        peer: Rank,
        signaled: bool,
        post: impl FnOnce(&Peer, u64, bool) -> Result<(), VerbsError>,
    ) -> Result<(), LinkError> {
        let p = self.peer(peer)?;
        if !p.is_alive() {
            return Err(LinkError::PeerLost(peer));
        }
        let mut posted = p.posted.lock();
        if *posted - p.completed.load(Ordering::Acquire) >= u64::from(self.sq_depth) {
            self.wait_for_room(peer, p, *posted)?;
        }
        let seq = *posted;
        let signaled = signaled || seq % self.signal_every == self.signal_every - 1;
        if signaled {
            // Counted before posting, so a completion can never be reaped before it is counted
            // (a reaper that saw more reaped than posted would skip the CQ wrongly).
            self.signaled_posted.fetch_add(1, Ordering::AcqRel);
        }
        match post(p, seq, signaled) {
            Ok(()) => {
                *posted = seq + 1;
                Ok(())
            }
            Err(e) => {
                if signaled {
                    self.signaled_posted.fetch_sub(1, Ordering::AcqRel);
                }
                Err(if p.is_alive() {
                    dev(e)
                } else {
                    LinkError::PeerLost(peer)
                })
            }
        }
    }

    /// Posts `n` work requests to `peer` in order, as chains of at most `MAX_CHAIN` (one
    /// `ibv_post_send`, one doorbell each), waiting for room as `post` does (`send_batch`,
    /// `rdma_batch`). `entry(i, seq)` builds request `i`, posted as sequence number `seq`; it is
    /// called under the peer's `posted` lock, once there is room for `seq`, and only for requests
    /// about to be posted. Counted before each chain is posted, as in `post`: its signalled
    /// requests (`signaled_posted`) and its RDMA ops (`rdma_outstanding`); those not posted are
    /// uncounted. `Err((k, e))`: the first `k` were posted, the rest were not.
    ///
    /// # Safety
    /// Each request `entry` returns is as `Qp::post_chain` asks: its buffers stay valid (and,
    /// for a READ, untouched) until its completion, or, inline, readable for the call.
    unsafe fn post_batch(
        &self,
        peer: Rank,
        p: &Peer,
        n: usize,
        mut entry: impl FnMut(usize, u64) -> ChainWr,
    ) -> Result<(), (usize, LinkError)> {
        let mut posted = p.posted.lock();
        let mut done = 0;
        while done < n {
            if !p.is_alive() {
                return Err((done, LinkError::PeerLost(peer)));
            }
            let room = u64::from(self.sq_depth) - (*posted - p.completed.load(Ordering::Acquire));
            if room == 0 {
                self.wait_for_room(peer, p, *posted)
                    .map_err(|e| (done, e))?;
                continue;
            }
            let k = (n - done).min(MAX_CHAIN).min(room as usize);
            let mut chain = [ChainWr::EMPTY; MAX_CHAIN];
            for (i, c) in chain[..k].iter_mut().enumerate() {
                *c = entry(done + i, *posted + i as u64);
            }
            let (signaled, rdma) = counts(&chain[..k]);
            self.signaled_posted.fetch_add(signaled, Ordering::AcqRel);
            if rdma > 0 {
                p.rdma_outstanding.fetch_add(rdma, Ordering::AcqRel);
                // As in `rdma`: a thread posting WRITEs reaps its own completions.
                p.in_rdma_post.store(true, Ordering::Relaxed);
            }
            // SAFETY: this function's contract, for every request of the chain.
            let r = unsafe { p.qp.post_chain(&chain[..k]) };
            if rdma > 0 {
                p.in_rdma_post.store(false, Ordering::Release);
            }
            match r {
                Ok(()) => {
                    *posted += k as u64;
                    done += k;
                }
                Err((m, e)) => {
                    let (signaled, rdma) = counts(&chain[m..k]);
                    self.signaled_posted.fetch_sub(signaled, Ordering::AcqRel);
                    p.rdma_outstanding.fetch_sub(rdma, Ordering::AcqRel);
                    *posted += m as u64;
                    let e = if p.is_alive() {
                        dev(e)
                    } else {
                        LinkError::PeerLost(peer)
                    };
                    return Err((done + m, e));
                }
            }
        }
        Ok(())
    }

    /// Deliver one receive completion (and post its slot again).
    fn deliver(&self, c: &Completion, on_event: &mut dyn FnMut(LinkEvent<'_>)) -> usize {
        let Some((WrKind::Recv, peer, slot)) = wr_id::decode(c.wr_id) else {
            return self.drop_one();
        };
        let Ok(p) = self.peer(peer) else {
            return self.drop_one();
        };
        if slot >= self.recv_slots {
            return self.drop_one();
        }
        if !c.is_success() {
            if c.status == ibv_wc_status::IBV_WC_LOC_LEN_ERR {
                self.len_errors.fetch_add(1, Ordering::Relaxed);
            }
            // WR_FLUSH_ERR after the QP went to error, or LOC_LEN_ERR (a message longer than a
            // slot: impossible between links of the same settings). Either way the QP is dead.
            self.lose(
                peer,
                LinkError::Device(format!("receive from rank {peer}: {}", c.status_text())),
            );
            return 0;
        }
        if p.is_reported() {
            return self.drop_one(); // already reported lost: nothing more is delivered from it
        }
        let len = c.byte_len as usize;
        if len > self.max_msg {
            self.len_errors.fetch_add(1, Ordering::Relaxed);
            self.lose(
                peer,
                LinkError::Device(format!(
                    "rank {peer} sent {len} bytes > slot {}",
                    self.max_msg
                )),
            );
            return 0;
        }
        let off = (peer as usize * self.recv_slots as usize + slot as usize) * self.max_msg;
        // SAFETY: the slot lies inside `recv_buf` (peer < size, slot < recv_slots, len <=
        // max_msg); its receive completed, so the device no longer writes it, and it is not
        // posted again until the callback has returned and the slice is gone.
        let data = unsafe { std::slice::from_raw_parts(self.recv_buf.ptr().add(off), len) };
        on_event(LinkEvent::Recv { peer, data });
        let sge = Sge {
            addr: self.recv_buf.addr() + off as u64,
            len: self.max_msg as u32,
            lkey: self.recv_buf.lkey(),
        };
        // SAFETY: the slot is registered memory owned by the link, outlives the QP (field order),
        // and nothing reads or writes it until its next receive completion.
        if let Err(e) = unsafe { p.qp.post_recv(c.wr_id, sge) } {
            // A peer whose slots cannot be refilled would run out of them: treat it as lost.
            self.lose(
                peer,
                LinkError::Device(format!("re-posting a receive slot: {e}")),
            );
        }
        1
    }

    /// Deliver the RDMA completions queued when this call began (not those its callbacks'
    /// ops add: a callback that posts again cannot keep one `poll` going forever). The check
    /// for none is inlined into every `poll`; the delivery is not (its call cost ~20
    /// instructions per poll, for the batch's frame, where the queue is almost always empty).
    #[inline(always)]
    fn deliver_rdma(&self, on_event: &mut dyn FnMut(LinkEvent<'_>)) -> usize {
        if self.rdma_queued.load(Ordering::Acquire) == 0 {
            return 0;
        }
        self.deliver_queued(on_event)
    }

    /// `deliver_rdma` past its check.
    #[inline(never)]
    fn deliver_queued(&self, on_event: &mut dyn FnMut(LinkEvent<'_>)) -> usize {
        // Up to a batch taken under one lock (not a lock for the length and one per entry);
        // the rest stays counted in `rdma_queued` for the next poll. Uninitialised slots: the
        // usual batch is one entry, and an array of `Option`s cost ~300 instructions per call
        // to fill, move into its iterator and drop (callgrind, in the VM).
        let mut batch: [MaybeUninit<RdmaDone>; POLL_BATCH] =
            [const { MaybeUninit::uninit() }; POLL_BATCH];
        let mut k = 0;
        {
            let mut q = lock(&self.rdma_done);
            while k < POLL_BATCH {
                let Some(d) = q.pop_front() else { break };
                batch[k].write(d);
                k += 1;
            }
        }
        // SAFETY: the first `k` slots were written above, and `batch` is not read again.
        unsafe { self.report_batch(&batch[..k], true, on_event) }
    }

    /// Reports a batch of RDMA results in order; `queued`: they came off the `rdma_done`
    /// queue, whose count drops as each is reported. Returns how many.
    ///
    /// # Safety
    /// Every slot of `batch` is initialised, and the caller never reads them again (each
    /// result is moved out here once; if a callback panics, the rest are leaked, not dropped
    /// twice).
    #[inline(always)]
    unsafe fn report_batch(
        &self,
        batch: &[MaybeUninit<RdmaDone>],
        queued: bool,
        on_event: &mut dyn FnMut(LinkEvent<'_>),
    ) -> usize {
        for slot in batch {
            // SAFETY: initialised and read once (this function's contract).
            let d = unsafe { slot.assume_init_read() };
            if queued {
                self.rdma_queued.fetch_sub(1, Ordering::AcqRel);
            }
            self.report_rdma(d, on_event);
        }
        batch.len()
    }

    /// Reaps the send CQ (`poll`'s look) and reports the RDMA results it finds from this call's
    /// own batch, not through the `rdma_done` queue: no lock and no queue for the usual one
    /// result per op. Past a batch, the rest are queued and reported after it. The results are
    /// reported even if the CQ poll then fails (its error comes after them).
    fn reap_and_report(&self, on_event: &mut dyn FnMut(LinkEvent<'_>)) -> Result<usize, LinkError> {
        let mut batch: [MaybeUninit<RdmaDone>; POLL_BATCH] =
            [const { MaybeUninit::uninit() }; POLL_BATCH];
        let mut k = 0;
        let reaped = self.reap_send_with(|d| {
            if k < POLL_BATCH {
                batch[k].write(d);
                k += 1;
            } else {
                self.queue_rdma(d);
            }
        });
        // SAFETY: the first `k` slots were written above, and `batch` is not read again.
        let mut n = unsafe { self.report_batch(&batch[..k], false, on_event) };
        if k == POLL_BATCH {
            n += self.deliver_rdma(on_event);
        }
        reaped.map(|()| n)
    }

    /// Where the send-ring slot of work request `seq` to `peer` starts in `send_buf`.
    fn ring_offset(&self, peer: Rank, seq: u64) -> usize {
        let slot =
            peer as usize * self.sq_depth as usize + (seq % u64::from(self.sq_depth)) as usize;
        slot * self.max_msg
    }

    /// `Link::wait` (`sends`: also woken by send-queue completions) and `Link::wait_messages`.
    fn sleep(&self, timeout: Duration, sends: bool) -> Result<bool, LinkError> {
        // Arm first, then look: a completion that lands after arming raises a channel event; one
        // that landed before is found by the checks below. Checking first and arming after would
        // lose a completion arriving in between and sleep the whole timeout.
        if sends {
            self.send_cq.req_notify().map_err(dev)?;
        }
        self.recv_cq.req_notify().map_err(dev)?;
        if sends {
            self.reap_send()?;
        }
        if self.lost_unreported.load(Ordering::Acquire) > 0
            || (sends && self.rdma_queued.load(Ordering::Acquire) > 0)
        {
            return Ok(true);
        }
        // Another thread polling receives holds the stash lock. Sleeping for everything, the
        // caller goes back to poll (that thread delivers what came before the arming). Sleeping
        // for messages, it is the progress thread beside a waiter that polls all the time: going
        // back would make it poll beside the waiter, taking its completions (measured: up to a
        // fifth of them, at 4 ranks on 2 CPUs); it takes the lock instead (held for one poll)
        // and looks itself.
        let stash = if sends {
            self.recv_stash.try_lock()
        } else {
            Some(self.recv_stash.lock())
        };
        match stash {
            None => return Ok(true),
            Some(mut stash) => {
                if !stash.is_empty() {
                    return Ok(true);
                }
                // At most `POLL_BATCH` into an empty stash of that capacity: no allocation.
                let k = self
                    .recv_cq
                    .poll_each(POLL_BATCH, |c| stash.push(*c))
                    .map_err(dev)?;
                if k > 0 {
                    return Ok(true);
                }
            }
        }
        let readable = self.channel.wait_readable(timeout).map_err(dev)?;
        if readable {
            self.channel.drain_events().map_err(dev)?;
        }
        Ok(readable)
    }

    fn report_lost(&self, on_event: &mut dyn FnMut(LinkEvent<'_>)) -> usize {
        if self.lost_unreported.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let mut n = 0;
        for (r, p) in self.peers.iter().enumerate() {
            let Some(p) = p.as_ref() else { continue };
            let flushing = p.rdma_outstanding.load(Ordering::Acquire) > 0
                && p.lost_at().is_some_and(|t| t.elapsed() < RDMA_FLUSH_GRACE);
            if flushing {
                continue; // its ops' flush completions come first
            }
            if let Some(reason) = p.take_report() {
                self.lost_unreported.fetch_sub(1, Ordering::AcqRel);
                on_event(LinkEvent::PeerLost {
                    peer: r as Rank,
                    reason,
                });
                n += 1;
            }
        }
        n
    }
}

impl Link for VerbsLink {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn size(&self) -> u32 {
        self.size
    }

    fn max_msg(&self) -> usize {
        self.max_msg
    }

    fn recv_slots(&self) -> u32 {
        self.recv_slots
    }

    fn send(&self, peer: Rank, msg: &[u8]) -> Result<(), LinkError> {
        if msg.len() > self.max_msg {
            return Err(LinkError::TooLong {
                len: msg.len(),
                max: self.max_msg,
            });
        }
        let inline = msg.len() <= self.max_inline;
        self.post(peer, false, |p, seq, signaled| {
            let id = wr_id::encode(WrKind::Send, peer, seq as u32);
            let flags = SendFlags { signaled, inline };
            if inline {
                let sge = Sge {
                    addr: msg.as_ptr() as u64,
                    len: msg.len() as u32,
                    lkey: 0,
                };
                // SAFETY: inline: the provider copies `msg` (<= max_inline bytes, readable for
                // the call) into the work request before returning.
                return unsafe { p.qp.post_send(id, sge, flags) };
            }
            let off = self.ring_offset(peer, seq);
            // SAFETY: the ring slot lies inside `send_buf`; it is free: the work request that
            // used it last (seq - sq_depth) has completed (we hold room for `seq`), and only this
            // thread, holding the peer's lock, writes it now. `msg` cannot overlap it (the
            // ring is private to the link).
            unsafe {
                std::ptr::copy_nonoverlapping(msg.as_ptr(), self.send_buf.ptr().add(off), msg.len())
            };
            let sge = Sge {
                addr: self.send_buf.addr() + off as u64,
                len: msg.len() as u32,
                lkey: self.send_buf.lkey(),
            };
            // SAFETY: registered ring memory that stays untouched until this work request
            // completes (the slot is reused only after `completed` passes `seq`).
            unsafe { p.qp.post_send(id, sge, flags) }
        })
    }

    fn send_batch(&self, peer: Rank, msgs: &[&[u8]]) -> Result<(), LinkError> {
        if let Some(m) = msgs.iter().find(|m| m.len() > self.max_msg) {
            return Err(LinkError::TooLong {
                len: m.len(),
                max: self.max_msg,
            });
        }
        let p = self.peer(peer)?;
        let entry = |i: usize, seq: u64| {
            let m = msgs[i];
            let signaled = seq % self.signal_every == self.signal_every - 1;
            let inline = m.len() <= self.max_inline;
            let sge = if inline {
                Sge {
                    addr: m.as_ptr() as u64,
                    len: m.len() as u32,
                    lkey: 0,
                }
            } else {
                let off = self.ring_offset(peer, seq);
                // SAFETY: as in `send`: the ring slot of `seq` is inside `send_buf` and free
                // (`post_batch` calls us with room for `seq`, under the peer's `posted` lock);
                // `m` is not in it.
                unsafe {
                    std::ptr::copy_nonoverlapping(m.as_ptr(), self.send_buf.ptr().add(off), m.len())
                };
                Sge {
                    addr: self.send_buf.addr() + off as u64,
                    len: m.len() as u32,
                    lkey: self.send_buf.lkey(),
                }
            };
            ChainWr {
                wr_id: wr_id::encode(WrKind::Send, peer, seq as u32),
                op: WrOp::Send,
                local: sge,
                flags: SendFlags { signaled, inline },
            }
        };
        // SAFETY: inline entries point at `msgs` (readable for the call, <= max_inline); the
        // others at ring slots left untouched until their request completes (a slot is reused
        // only once `completed` passed its sequence number).
        unsafe { self.post_batch(peer, p, msgs.len(), entry) }.map_err(|(_, e)| e)
    }

    fn poll(&self, on_event: &mut dyn FnMut(LinkEvent<'_>)) -> Result<usize, LinkError> {
        // The send CQ only when a completion is due (or now and then, see SEND_CQ_POLL_EVERY):
        // an empty CQ poll is a lock and a call into the provider on every progress call.
        let due = self.signaled_posted.load(Ordering::Acquire)
            != self.send_reaped.load(Ordering::Acquire);
        // A plain load and store, not an atomic add: racing pollers may lose a count, which only
        // shifts when the periodic look happens.
        let k = self.polls.load(Ordering::Relaxed);
        self.polls.store(k.wrapping_add(1), Ordering::Relaxed);
        // Results queued by other paths (reaped before this poll's) first.
        let mut n = self.deliver_rdma(on_event);
        let mut reported = 0;
        if due || k % SEND_CQ_POLL_EVERY == 0 {
            reported = self.reap_and_report(on_event)?;
            n += reported;
        }
        // A poll that reported RDMA results leaves the receive CQ for the next one, once: the
        // thread that waits on one of them returns now, without the empty receive poll (a lock
        // and a provider call, ~80 instructions of a blocking op's ~1600 on rxe: profile-verbs).
        // Never twice in a row, so receives wait at most one poll longer; a sleeper is woken by
        // the receive CQ's event as before. (Racing pollers may skip one more or one fewer.)
        let skipped = self.recv_skipped.load(Ordering::Relaxed);
        let skip = reported > 0 && !skipped;
        if skip != skipped {
            self.recv_skipped.store(skip, Ordering::Relaxed);
        }
        // The stash lock also serialises receive polls: slots are delivered and re-posted by one
        // thread at a time (a nested `poll` from a callback finds it taken and skips receives).
        let stash = if skip {
            None
        } else {
            self.recv_stash.try_lock()
        };
        if let Some(mut stash) = stash {
            for i in 0..stash.len() {
                let c = stash[i];
                n += self.deliver(&c, on_event);
            }
            stash.clear();
            for _ in 0..MAX_BATCHES_PER_POLL {
                let k = self
                    .recv_cq
                    .poll_each(POLL_BATCH, |c| n += self.deliver(c, on_event))
                    .map_err(dev)?;
                if k < POLL_BATCH {
                    break;
                }
            }
        }
        n += self.report_lost(on_event);
        Ok(n)
    }

    fn wait(&self, timeout: Duration) -> Result<(), LinkError> {
        self.sleep(timeout, true).map(|_| ())
    }

    fn wait_messages(&self, timeout: Duration) -> Result<bool, LinkError> {
        self.sleep(timeout, false)
    }

    fn wake(&self) {
        self.channel.wake();
    }

    fn wakes(&self) -> bool {
        true
    }

    fn signaled_posts(&self) -> u64 {
        // Dips by one only when a post fails (see `post`): a reader comparing two values may
        // miss that one attempt, nothing else.
        self.signaled_posted.load(Ordering::Relaxed)
    }

    fn probe(&self, peer: Rank) -> Result<(), LinkError> {
        let src = Sge {
            addr: self.probe_buf.addr() + 8 * u64::from(self.size),
            len: 8, // never zero-length (rxe mishandles zero-length RDMA)
            lkey: self.probe_buf.lkey(),
        };
        let inline = self.max_inline >= 8;
        let rank = self.rank;
        self.post(peer, true, |p, seq, signaled| {
            let id = wr_id::encode(WrKind::Probe, peer, seq as u32);
            let flags = SendFlags { signaled, inline };
            let dst = p.probe_addr + 8 * u64::from(rank);
            // SAFETY: the source word is registered, owned by the link and never written after
            // setup; the destination is the word the peer registered (remote write) for our
            // probes and never reads as data.
            unsafe { p.qp.post_rdma_write(id, src, dst, p.probe_rkey, flags) }
        })
    }

    fn max_rdma(&self) -> usize {
        self.max_rdma
    }

    fn max_inline_write(&self) -> usize {
        self.max_inline
    }

    fn own_buffers(&self) -> Vec<(u64, usize)> {
        [&self.recv_buf, &self.send_buf, &self.probe_buf]
            .iter()
            .map(|b| (b.addr(), b.len()))
            .collect()
    }

    unsafe fn rdma(&self, peer: Rank, op: RdmaOp) -> Result<(), LinkError> {
        if peer == self.rank {
            return Err(LinkError::BadRank(peer));
        }
        self.peer(peer)?;
        op.validate(self.max_rdma)?;
        let local = Sge {
            addr: op.local_addr,
            len: op.len as u32, // <= max_rdma <= 2^31
            lkey: op.lkey,
        };
        self.post(peer, true, |p, seq, _| {
            let id = wr_id::encode(WrKind::Rdma, peer, seq as u32);
            p.set_token(seq, op.token);
            p.rdma_outstanding.fetch_add(1, Ordering::AcqRel);
            let flags = SendFlags {
                signaled: true, // the caller needs every completion
                // A short WRITE's payload is copied into the WQE: no local MR lookup at post
                // or at transmit, and the caller needs no registration for it.
                inline: op.kind == RdmaKind::Write && op.len <= self.max_inline,
            };
            // On Soft-RoCE a WRITE's whole transfer runs inside the post's system call: a thread
            // streaming them is in here most of the time, and its completions are its own to
            // reap (`Link::posting`). Under `posted`: one poster per peer at a time.
            p.in_rdma_post.store(true, Ordering::Relaxed);
            // SAFETY: `Link::rdma`'s contract: the local range is registered under `lkey` (or,
            // inline, readable for this call: the provider copies it) and left alone until the
            // op's `RdmaDone`; the remote range is the target's, named by its rkey (a bad one
            // fails the op at the target, never touches our memory).
            let r = unsafe {
                match op.kind {
                    RdmaKind::Write => {
                        p.qp.post_rdma_write(id, local, op.remote_addr, op.rkey, flags)
                    }
                    RdmaKind::Read => {
                        p.qp.post_rdma_read(id, local, op.remote_addr, op.rkey, flags)
                    }
                }
            };
            p.in_rdma_post.store(false, Ordering::Release);
            if r.is_err() {
                p.rdma_outstanding.fetch_sub(1, Ordering::AcqRel);
            }
            r
        })
    }

    unsafe fn rdma_batch(&self, peer: Rank, ops: &[RdmaOp]) -> Result<(), (usize, LinkError)> {
        if let [op] = ops {
            // SAFETY: forwarded contract.
            return unsafe { self.rdma(peer, *op) }.map_err(|e| (0, e));
        }
        if peer == self.rank {
            return Err((0, LinkError::BadRank(peer)));
        }
        let p = self.peer(peer).map_err(|e| (0, e))?;
        if let Some(e) = ops.iter().find_map(|op| op.validate(self.max_rdma).err()) {
            return Err((0, e));
        }
        let entry = |i: usize, seq: u64| {
            let op = &ops[i];
            p.set_token(seq, op.token);
            let (remote_addr, rkey) = (op.remote_addr, op.rkey);
            ChainWr {
                wr_id: wr_id::encode(WrKind::Rdma, peer, seq as u32),
                op: match op.kind {
                    RdmaKind::Write => WrOp::Write { remote_addr, rkey },
                    RdmaKind::Read => WrOp::Read { remote_addr, rkey },
                },
                local: Sge {
                    addr: op.local_addr,
                    len: op.len as u32, // <= max_rdma <= 2^31
                    lkey: op.lkey,
                },
                // Every op signalled, as in `rdma`; inline as there.
                flags: SendFlags {
                    signaled: true,
                    inline: op.kind == RdmaKind::Write && op.len <= self.max_inline,
                },
            }
        };
        // SAFETY: `Link::rdma_batch`'s contract, as in `rdma` for each op, is `post_batch`'s.
        unsafe { self.post_batch(peer, p, ops.len(), entry) }
    }

    fn posting(&self) -> bool {
        self.peers
            .iter()
            .flatten()
            .any(|p| p.in_rdma_post.load(Ordering::Acquire))
    }
}
