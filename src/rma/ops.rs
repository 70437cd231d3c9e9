//! Unfinished operations. A *request* is what the caller started (`fh_put_nb`, ...) and holds a
//! handle to; it is cut into *chunks* of at most Firehose's `max_op_len`, each one Firehose op
//! (its `OpId` is the chunk id) that becomes one or more RDMA segments. A request is done when
//! its last chunk is; its first error is its result.
//!
//! A request of one chunk (every put and get up to `max_op_len`) keeps that chunk in its own
//! entry (`Request::own`): one table entry per op, whose Firehose op id is the request's key
//! with `OWN` set. Longer requests keep theirs in `chunks`, keyed by their op ids.

use super::bounce::Bounce;
use super::done_board::DoneBoard;
use super::slab::{Key, Slab};
use crate::net::{Rank, RdmaKind};
use crate::rma::RmaError;
use std::num::NonZeroU64;
use std::sync::Arc;

/// The bit that marks an op id as a request's own chunk (`Request::own`); `Slab` indices stay
/// below it.
pub(super) const OWN: u64 = 1 << 31;

/// The bit that marks an RDMA token as a fast op's (`engine`: a one-segment hit in the
/// Firehose front slot, explicit, with no local registration), whose completion parks instead
/// of taking the engine lock. Never part of a Firehose op id.
pub(super) const FAST: u64 = 1 << 30;

/// One Firehose op: a piece of a request.
#[derive(Debug, Clone, Copy)]
pub(super) struct Chunk {
    pub req: u64,
    pub peer: Rank,
    pub kind: RdmaKind,
    /// Local buffer of this chunk and its key (from the request's registration).
    pub local: u64,
    pub lkey: u32,
    pub raddr: u64,
    /// RDMA segments posted and not yet completed.
    pub segs_left: u32,
    /// Holds firehose references (a `Hit`/`Ready`): `release` it when the segments are done.
    pub holds_refs: bool,
    pub error: Option<RmaError>,
}

/// What the caller started.
#[derive(Debug)]
pub(super) struct Request {
    pub chunks_left: u32,
    /// The pin-down cache handle of the local buffer (released when the request is done; a
    /// live handle is never 0).
    pub reg: Option<NonZeroU64>,
    pub error: Option<RmaError>,
    /// No handle was given out: `fh_quiet` collects it.
    pub implicit: bool,
    pub done: bool,
    /// The request's only chunk, while it runs (op id: the request's key | `OWN`).
    pub own: Option<Chunk>,
}

impl Request {
    /// A new entry before its start fills it in: one chunk to go, nothing held.
    fn blank() -> Request {
        Request {
            chunks_left: 1,
            reg: None,
            error: None,
            implicit: false,
            done: false,
            own: None,
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct Ops {
    // Slabs, not hash maps: a put or get of one chunk touches `reqs` at its start and at its
    // completion (its chunk lives in its entry); a request's key is the caller's handle and a
    // chunk's the Firehose op id. A made-up or spent handle finds nothing.
    pub reqs: Slab<Request>,
    pub chunks: Slab<Chunk>,
    /// Requests not yet done (explicit and implicit).
    running: usize,
    /// First error of an implicit request since the last `fh_quiet`.
    pub implicit_error: Option<RmaError>,
    /// Which explicit requests are done, readable without this table's lock (waiters spin on
    /// it); written here, when a request ends.
    pub board: Arc<DoneBoard>,
    /// The bounce slots of short gets: a request that holds one has its bytes copied to the
    /// caller's buffer where it ends, before its result is published.
    pub bounce: Option<Arc<Bounce>>,
}

/// What finishing a chunk left to do outside the table's lock.
pub(super) struct Finished {
    /// The chunk held firehose references: release its op.
    pub release: bool,
    /// The request is done and this registration must be released in the cache.
    pub dereg: Option<NonZeroU64>,
}

impl Ops {
    /// An empty table whose short gets use `bounce`'s slots.
    pub(super) fn with_bounce(bounce: Option<Arc<Bounce>>) -> Ops {
        Ops {
            bounce,
            ..Ops::default()
        }
    }

    /// The running chunk of op id `op`.
    #[inline]
    pub(super) fn chunk_mut(&mut self, op: Key) -> Option<&mut Chunk> {
        if op & OWN != 0 {
            self.reqs.get_mut(op & !OWN)?.own.as_mut()
        } else {
            self.chunks.get_mut(op)
        }
    }

    /// Every running chunk.
    pub(super) fn chunks(&self) -> impl Iterator<Item = &Chunk> {
        let own = self.reqs.values().filter_map(|r| r.own.as_ref());
        self.chunks.values().chain(own)
    }

    /// Record one completed segment of `chunk`; `Some` when it was the chunk's last.
    #[inline(always)]
    pub(super) fn seg_done(&mut self, chunk: Key, err: Option<RmaError>) -> Option<Finished> {
        if chunk & OWN == 0 {
            let c = self.chunks.get_mut(chunk)?;
            if c.error.is_none() {
                c.error = err;
            }
            c.segs_left = c.segs_left.saturating_sub(1);
            if c.segs_left > 0 {
                return None;
            }
            return self.finish_chunk(chunk, None);
        }
        // A request's own chunk: `finish_chunk` in place, with one lookup (its last chunk: the
        // request is over).
        let key = chunk & !OWN;
        let req = self.reqs.get_mut(key)?;
        let c = req.own.as_mut()?;
        if c.segs_left > 1 {
            if c.error.is_none() {
                c.error = err;
            }
            c.segs_left -= 1;
            return None;
        }
        let (release, cerr) = (c.holds_refs, c.error.or(err));
        req.own = None;
        if req.error.is_none() {
            req.error = cerr;
        }
        debug_assert_eq!(req.chunks_left, 1);
        let implicit = req.implicit;
        let dereg = end_request(req, key, &mut self.running, &self.bounce, &self.board);
        if implicit {
            self.drop_implicit(key);
        }
        Some(Finished { release, dereg })
    }

    /// A parked fast op's end (`engine`: its one segment completed with `err`, its firehose
    /// released by the caller): `seg_done` of its own chunk, for a request that is explicit and
    /// holds no registration, its result published on the board once (the completion publishes
    /// it too, whichever comes first: `DoneBoard::publish`).
    #[inline]
    pub(super) fn finish_parked(&mut self, op: Key, err: Option<RmaError>) {
        let key = op & !OWN;
        let Some(req) = self.reqs.get_mut(key) else {
            return; // cannot happen: the entry stays until its result is collected
        };
        debug_assert!(req.own.is_some() && !req.implicit && req.reg.is_none());
        req.own = None;
        if req.error.is_none() {
            req.error = err;
        }
        req.chunks_left = 0;
        req.done = true;
        self.running -= 1;
        self.board.publish(
            key,
            super::done_board::encode(req.error.map_or(Ok(()), Err)),
        );
    }

    /// Chunk `chunk` is over (all its segments done, or failed before any was posted).
    #[inline]
    pub(super) fn finish_chunk(&mut self, chunk: Key, err: Option<RmaError>) -> Option<Finished> {
        let (c, req) = if chunk & OWN != 0 {
            let req = self.reqs.get_mut(chunk & !OWN)?;
            (req.own.take()?, req)
        } else {
            let c = self.chunks.remove(chunk)?;
            let req = self.reqs.get_mut(c.req)?;
            (c, req)
        };
        let err = c.error.or(err);
        if req.error.is_none() {
            req.error = err;
        }
        req.chunks_left -= 1;
        let mut dereg = None;
        if req.chunks_left == 0 {
            let implicit = req.implicit;
            dereg = end_request(req, c.req, &mut self.running, &self.bounce, &self.board);
            if implicit {
                self.drop_implicit(c.req);
            }
        }
        Some(Finished {
            release: c.holds_refs,
            dereg,
        })
    }

    /// The result of a done request, removing it; `None` while it runs; unknown: an error.
    /// A request whose result a wait already collected from the board is spent (its entry
    /// only waits for the reap).
    #[inline]
    pub(super) fn take_if_done(
        &mut self,
        req: Key,
    ) -> Result<Option<Result<(), RmaError>>, RmaError> {
        match self.reqs.get(req) {
            None => Err(RmaError::UnknownHandle),
            Some(r) if r.implicit => Err(RmaError::UnknownHandle),
            Some(r) if !r.done => Ok(None),
            Some(_) => {
                let r = self.reqs.remove(req).expect("present");
                match self.board.collect(req) {
                    Some(Some(res)) => Ok(Some(res)),
                    Some(None) => Err(RmaError::UnknownHandle),
                    None => Ok(Some(r.error.map_or(Ok(()), Err))),
                }
            }
        }
    }

    /// Removes the entry of a request whose result was collected from the board.
    #[inline]
    pub(super) fn reap(&mut self, req: Key) {
        if self.reqs.get(req).is_some_and(|r| r.done) {
            self.reqs.remove(req);
        }
    }

    /// The entry of a new running request of one chunk, for the caller to fill in (in the same
    /// critical section): the entry of `collected` (a request whose result a wait collected
    /// from the board; 0: none) if it is still there, under a new key, else a new one. Its key.
    #[inline(always)]
    pub(super) fn begin(&mut self, collected: Key) -> (Key, &mut Request) {
        self.running += 1;
        let (key, entry, fresh) = self
            .reqs
            .renew_or_insert(collected, |r| r.done, Request::blank);
        if fresh {
            self.board.ensure(key);
        }
        (key, entry)
    }

    /// `begin` for the entry of parked op `op` whose result a wait collected (`engine`): the
    /// entry goes to the new request as it is, under a new key, its end skipped (its result was
    /// published and taken; it stays counted as running, now for the new request). For the
    /// caller to fill in, in the same critical section, and to release the parked op's
    /// firehose.
    #[inline(always)]
    pub(super) fn renew_parked(&mut self, op: Key) -> (Key, &mut Request) {
        let (key, entry, fresh) = self
            .reqs
            .renew_or_insert(op & !OWN, |_| true, Request::blank);
        debug_assert!(!fresh, "a parked op keeps its entry");
        if fresh {
            self.running += 1;
            self.board.ensure(key);
        }
        (key, entry)
    }

    /// Records a request; its key is the caller's handle.
    #[inline]
    pub(super) fn add_request(&mut self, r: Request) -> Key {
        let done = r.done;
        if !done {
            self.running += 1;
        }
        let res = r.error.map_or(Ok(()), Err);
        let key = self.reqs.insert(r);
        self.board.ensure(key);
        if done {
            self.board.set_done(key, res);
        }
        key
    }

    /// Requests not yet done (explicit and implicit).
    pub(super) fn running(&self) -> usize {
        self.running
    }

    /// Removes ended implicit request `key`; its error stays for the next `fh_quiet`.
    #[inline]
    fn drop_implicit(&mut self, key: Key) {
        let r = self.reqs.remove(key).expect("present");
        if self.implicit_error.is_none() {
            self.implicit_error = r.error;
        }
    }
}

/// The end of request `key` (entry `req`, its error final), which both of `Ops`' chunk ends
/// reach when they end its last chunk: it is done; a bounced get's bytes go to the caller's
/// buffer, only if it succeeded, before anyone can see the result; an explicit request's
/// result is published on `board`. Returns the registration to release. An implicit
/// request's entry is the caller's to drop (`Ops::drop_implicit`): `req` borrows the table.
/// (A parked fast op ends in `Ops::finish_parked`: no registration, no slot, explicit.)
#[inline(always)]
fn end_request(
    req: &mut Request,
    key: Key,
    running: &mut usize,
    bounce: &Option<Arc<Bounce>>,
    board: &DoneBoard,
) -> Option<NonZeroU64> {
    req.chunks_left = 0;
    req.done = true;
    *running -= 1;
    if let (Some(b), Some(h)) = (bounce, req.reg) {
        b.finish(h, req.error.is_none());
    }
    if !req.implicit {
        board.set_done(key, req.error.map_or(Ok(()), Err));
    }
    req.reg.take()
}
