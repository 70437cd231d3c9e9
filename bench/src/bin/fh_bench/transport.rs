//! The four ways to put that the paper compares, behind one trait, all on the same endpoint:
//! - `Firehose`: `rma::Rma` (fh_put's engine): one-sided when the target bytes are covered by a
//!   firehose, a move (AM) otherwise; the source goes through the pin-down cache.
//! - `Floor`: the target's whole buffer registered once, its rkey exchanged once: a plain RDMA
//!   WRITE per put (nothing can be cheaper on this link).
//! - `Rendezvous { unpin }`: a request AM per put; the target registers the destination and
//!   replies with the rkey, then the RDMA WRITE. No-unpin keeps the target's registrations
//!   forever (keyed by page range); with-unpin registers per put and deregisters when the
//!   initiator's DONE (sent after the write completed) arrives.
//!
//! Firehose and the floor also get (`start` with `RdmaKind::Read`: `--test rma`, rma.rs).
//!
//! Floor and Rendezvous post on `Link::rdma` with their own tokens (`TAG`), seen by the chained
//! completion handler (`Raw`); their source buffers are registered once (`LocalKeys`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use firehose::internals::net::{Am, LinkError, Rank, RdmaKind, RdmaOp, Ticket};
use firehose::internals::pin::verbs::{Mr, Pd};
use firehose::internals::pin::Access;
use firehose::internals::rma::Rma;

use crate::served::{rv_request, Exposed, RV_DONE, RV_REQ};
use crate::{fail, Ctx};

/// Token bit of the bench's own RDMA (Rma's op ids never reach it).
pub const TAG: u64 = 1 << 63;

/// Completions of the bench's own RDMA, fed by the chained handler.
#[derive(Default)]
pub struct Raw {
    pub posted: AtomicU64,
    pub done: AtomicU64,
    pub failed: AtomicU64,
    /// With-unpin: (peer, registration id) of writes that completed, DONE not yet sent.
    pub unpin: Mutex<Vec<(Rank, u32)>>,
}

impl Raw {
    /// Chains onto the endpoint's completion handler (Rma's, installed before): keeps `TAG`
    /// tokens, passes the rest on.
    pub fn install(am: &Am) -> Arc<Raw> {
        let raw = Arc::new(Raw::default());
        let prev = am.rdma_handler();
        let r = raw.clone();
        am.set_rdma_handler(Some(Box::new(
            move |peer, token, res: Result<(), LinkError>| {
                if token & TAG == 0 {
                    if let Some(p) = &prev {
                        p(peer, token, res);
                    }
                    return;
                }
                if res.is_err() {
                    r.failed.fetch_add(1, Relaxed);
                }
                let id = token as u32;
                if id != 0 {
                    r.unpin.lock().unwrap().push((peer, id));
                }
                r.done.fetch_add(1, Relaxed);
            },
        )));
        raw
    }

    fn in_flight(&self) -> u64 {
        self.posted.load(Relaxed) - self.done.load(Relaxed)
    }
}

/// Source buffers registered once (floor and Rendezvous): the lkey of an address.
pub struct LocalKeys(Vec<Mr>);

impl LocalKeys {
    pub fn new(pd: &Arc<Pd>, bufs: &[&[u8]]) -> LocalKeys {
        LocalKeys(
            bufs.iter()
                .map(|b| {
                    Mr::register(pd, b.as_ptr() as usize, b.len(), Access::LOCAL_WRITE)
                        .unwrap_or_else(|e| fail(format!("registering a source buffer: {e}")))
                })
                .collect(),
        )
    }

    fn lkey(&self, addr: usize, len: usize) -> u32 {
        let (a, e) = (addr, addr + len);
        self.0
            .iter()
            .find(|m| m.addr() <= a && e <= m.addr() + m.len())
            .map(|m| m.lkey())
            .unwrap_or_else(|| fail("source outside the registered buffers"))
    }
}

/// A way to put. Sources are `'static` (the bench's buffers live to the end), so a put in
/// flight can never outlive its bytes.
pub trait Transport {
    fn name(&self) -> &'static str;
    /// Starts a put of `src` to `raddr` at `peer`; returns with at most `window` in flight.
    fn put_nb(&mut self, peer: Rank, raddr: u64, src: &'static [u8]);
    /// Returns when every put started is at its destination (`put_nb` + `quiet`: a blocking
    /// put, fh_put's semantics).
    fn quiet(&mut self);
}

pub struct Firehose {
    rma: Arc<Rma>,
    window: usize,
    reqs: VecDeque<u64>,
}

impl Firehose {
    pub fn new(ctx: &Ctx, window: usize) -> Self {
        Firehose {
            rma: ctx.rma.clone(),
            window,
            reqs: VecDeque::new(),
        }
    }

    /// Starts a put (`local` -> `raddr`) or a get (`raddr` -> `local`) of `len` bytes; returns
    /// with at most `window` in flight.
    ///
    /// # Safety
    /// `local` is valid for `len` bytes for the rest of the process (readable for a put,
    /// writable for a get) and nothing else touches it while the op is in flight.
    pub unsafe fn start(
        &mut self,
        kind: RdmaKind,
        peer: Rank,
        raddr: u64,
        local: *mut u8,
        len: usize,
    ) {
        while self.reqs.len() >= self.window {
            self.wait_front();
        }
        // SAFETY: forwarded contract on `local`.
        match unsafe { self.rma.start(kind, peer, raddr, local, len, false) } {
            Ok(req) => self.reqs.push_back(req),
            Err(e) => fail(format!("firehose {kind:?} start: {e:?}")),
        }
    }

    fn wait_front(&mut self) {
        if let Some(r) = self.reqs.pop_front() {
            if let Err(e) = self.rma.wait(r) {
                fail(format!("firehose put: {e:?}"));
            }
        }
    }
}

impl Transport for Firehose {
    fn name(&self) -> &'static str {
        "firehose"
    }

    fn put_nb(&mut self, peer: Rank, raddr: u64, src: &'static [u8]) {
        // SAFETY: `src` is 'static and only read by a put; the bench never writes a source
        // buffer while puts from it are in flight.
        unsafe {
            self.start(
                RdmaKind::Write,
                peer,
                raddr,
                src.as_ptr().cast_mut(),
                src.len(),
            )
        }
    }

    fn quiet(&mut self) {
        while !self.reqs.is_empty() {
            self.wait_front();
        }
    }
}

/// What the floor and Rendezvous share: posting a WRITE (or the floor's READ) with a tag and
/// waiting for them.
struct Poster {
    rma: Arc<Rma>,
    raw: Arc<Raw>,
    am_link: Arc<dyn firehose::internals::net::Link>,
    local: Arc<LocalKeys>,
    window: usize,
}

impl Poster {
    fn new(ctx: &Ctx, window: usize) -> Poster {
        Poster {
            rma: ctx.rma.clone(),
            raw: ctx.raw.clone(),
            am_link: ctx.peers.link().clone(),
            local: ctx.local_keys.clone(),
            window,
        }
    }

    /// Progresses as `Rma::wait` does (yield when nothing happened), so every transport polls
    /// the same way.
    fn progress(&self) {
        match self.rma.progress() {
            Ok(0) => std::thread::yield_now(),
            Ok(_) => {}
            Err(e) => fail(format!("progress: {e:?}")),
        }
        if self.raw.failed.load(Relaxed) != 0 {
            fail("an RDMA WRITE of the bench failed");
        }
    }

    /// Sends the DONEs of with-unpin writes that completed.
    fn send_dones(&self) {
        let done = std::mem::take(&mut *self.raw.unpin.lock().unwrap());
        for (peer, id) in done {
            if let Err(e) = self
                .rma
                .peers()
                .am()
                .send_oneway(peer, RV_DONE, &id.to_le_bytes())
            {
                fail(format!("DONE to rank {peer}: {e:?}"));
            }
        }
    }

    /// Posts `kind` between `local` (registered in `LocalKeys`, 'static, untouched while in
    /// flight) and `raddr`.
    #[allow(clippy::too_many_arguments)]
    fn post(
        &self,
        kind: RdmaKind,
        peer: Rank,
        raddr: u64,
        rkey: u32,
        local: *mut u8,
        len: usize,
        id: u32,
    ) {
        while self.raw.in_flight() >= self.window as u64 {
            self.progress();
            self.send_dones();
        }
        let op = RdmaOp {
            kind,
            local_addr: local as u64,
            lkey: self.local.lkey(local as usize, len),
            len,
            remote_addr: raddr,
            rkey,
            token: TAG | id as u64,
        };
        self.raw.posted.fetch_add(1, Relaxed);
        // SAFETY: `local` is 'static, registered under `lkey` (LocalKeys lives as long as the
        // bench) and not touched by the bench while in flight; the remote range lies in a region the
        // target registered for remote write and keeps until our DONE (with-unpin) or forever.
        if let Err(e) = unsafe { self.am_link.rdma(peer, op) } {
            fail(format!("RDMA {kind:?} to rank {peer}: {e}"));
        }
    }

    fn quiet(&self) {
        while self.raw.in_flight() > 0 {
            self.progress();
        }
        self.send_dones();
    }
}

pub struct Floor {
    p: Poster,
    /// Per peer: what it exposed (registered once).
    remote: Vec<Vec<Exposed>>,
}

impl Floor {
    pub fn new(ctx: &Ctx, window: usize, remote: Vec<Vec<Exposed>>) -> Self {
        Floor {
            p: Poster::new(ctx, window),
            remote,
        }
    }
}

impl Floor {
    /// The floor's put or get (a plain RDMA WRITE or READ under the exposed buffer's rkey).
    ///
    /// # Safety
    /// As `Firehose::start`; `local` also lies in a buffer of `LocalKeys`.
    pub unsafe fn start(
        &mut self,
        kind: RdmaKind,
        peer: Rank,
        raddr: u64,
        local: *mut u8,
        len: usize,
    ) {
        let end = raddr + len as u64;
        let rkey = self.remote[peer as usize]
            .iter()
            .find(|e| e.addr <= raddr && end <= e.addr + e.len)
            .map(|e| e.rkey)
            .unwrap_or_else(|| fail("floor: op outside the target's exposed buffer"));
        self.p.post(kind, peer, raddr, rkey, local, len, 0);
    }
}

impl Transport for Floor {
    fn name(&self) -> &'static str {
        "floor"
    }

    fn put_nb(&mut self, peer: Rank, raddr: u64, src: &'static [u8]) {
        // SAFETY: `src` is 'static and only read by a put (see `Firehose::put_nb`).
        unsafe {
            self.start(
                RdmaKind::Write,
                peer,
                raddr,
                src.as_ptr().cast_mut(),
                src.len(),
            )
        }
    }

    fn quiet(&mut self) {
        self.p.quiet();
    }
}

pub struct Rendezvous {
    p: Poster,
    unpin: bool,
    /// Requests sent, replies not yet used: (ticket, peer, raddr, src).
    pending: VecDeque<(Ticket, Rank, u64, &'static [u8])>,
}

impl Rendezvous {
    pub fn new(ctx: &Ctx, window: usize, unpin: bool) -> Self {
        Rendezvous {
            p: Poster::new(ctx, window),
            unpin,
            pending: VecDeque::new(),
        }
    }

    /// Waits for the oldest request's reply and posts its write.
    fn resolve_front(&mut self) {
        let Some((t, peer, raddr, src)) = self.pending.pop_front() else {
            return;
        };
        let am = self.p.rma.peers().am();
        let r = am
            .wait(t, Some(Duration::from_secs(60)))
            .unwrap_or_else(|e| fail(format!("rendezvous request to rank {peer}: {e:?}")));
        if r.len() != 9 || r[0] != 1 {
            fail(format!(
                "rank {peer} could not register {raddr:#x}+{}",
                src.len()
            ));
        }
        let rkey = u32::from_le_bytes(r[1..5].try_into().unwrap());
        let id = u32::from_le_bytes(r[5..9].try_into().unwrap());
        self.p.post(
            RdmaKind::Write,
            peer,
            raddr,
            rkey,
            src.as_ptr().cast_mut(),
            src.len(),
            id,
        );
    }
}

impl Transport for Rendezvous {
    fn name(&self) -> &'static str {
        if self.unpin {
            "rdv_unpin"
        } else {
            "rdv_nounpin"
        }
    }

    fn put_nb(&mut self, peer: Rank, raddr: u64, src: &'static [u8]) {
        while self.pending.len() >= self.p.window {
            self.resolve_front();
        }
        self.p.send_dones();
        let am = self.p.rma.peers().am();
        let t = am
            .request(peer, RV_REQ, &rv_request(raddr, src.len(), self.unpin))
            .unwrap_or_else(|e| fail(format!("rendezvous request to rank {peer}: {e:?}")));
        self.pending.push_back((t, peer, raddr, src));
    }

    fn quiet(&mut self) {
        while !self.pending.is_empty() {
            self.resolve_front();
        }
        self.p.quiet();
    }
}
