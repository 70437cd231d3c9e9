//! `Rma`: puts and gets to any rank, over Firehose. Carries out what the algorithm asks for:
//! its messages go out as one-way active messages (id `FIREHOSE_AM`), its segments become
//! RDMA WRITEs/READs on the link, and the completions come back through the endpoint's RDMA
//! handler. The caller's buffer is registered through the pin-down cache.
//!
//! Locks, in order: `engine` (the algorithm, the target's pins and the op tables) -> the AM
//! endpoint's own locks (Firehose messages are sent *under* `engine`, because the algorithm
//! relies on them leaving in the order it produced them). The op tables share the algorithm's
//! lock: a hit put needs both at its start and at its completion (table entry, then firehose
//! acquire or release), one critical section each; a fast op (below) only at its start. RDMA
//! is posted, events are handled and cache calls are made without the lock; waiters spin on
//! the done board, not on the lock.
//!
//! Fast ops and the parked release: a one-segment hit in the algorithm's front slot, explicit
//! (a blocking put or get, typically), is posted with `FAST` in its RDMA token. Its completion
//! does not take the engine lock: it *parks* the op (`Shared::parked`, one word: a fast op
//! holds the front slot, so there is at most one), publishes the result on the done board,
//! where the waiter takes it, and releases a get's registration (kept in `Shared::fast_reg`
//! meanwhile, not in the entry). The op's table entry and its firehose release are carried out
//! by the next holder of the engine lock, first thing (`Shared::lock`, the only way to the
//! lock; `start` ends it its own way, passing the entry and the firehose reference on to the
//! new op when it can): every critical section (a start, a message, a revoke, an invalidation,
//! `quiet`, a lost peer, the table checks of a wait) sees the table and the references as if
//! the completion had taken the lock itself, and each parked op is ended exactly once (the
//! holder that finds it clears the word). Deferring is only safe while nothing waits for that
//! release (blocked ops, a quota cut, acks, a revoked firehose: `Firehose::front_awaited`): a
//! start makes an op fast only when nothing does, and every critical section that may change
//! it says it again in `Shared::eager` (`settle`); while it is set a fast completion takes the
//! lock itself, as before. (`settle` sets it, then ends a parked op; a completion parks, then reads it; both
//! sequentially consistent, so one of the two sees the other.)
//!
//! Remote invalidation (`super::revoke`): the `fh-revoke` worker drives the algorithm through
//! `RmaDriver` (invalidate, progress, `invalidation_done`); every public entry and `with_core`
//! mark the thread as inside the library, so a memory hook firing there never waits for that
//! worker (which needs these locks).

use std::num::NonZeroU64;
use std::sync::atomic::{
    AtomicBool, AtomicU64,
    Ordering::{AcqRel, Relaxed, Release, SeqCst},
};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use super::agree::{self, Agreed};
use super::bounce::{self, Bounce};
use super::done_board::{self, DoneBoard, Slot};
use super::expose::{ExposeMode, Exposed, Exposure};
use super::ops::{Chunk, Finished, Ops, Request, FAST, OWN};
use super::probe::{Due, IdlePolls, WaitClock};
use super::revoke::{self, Revocation, RevokeSettings, RevokeStats};
use super::self_copy::{self, Dir};
use super::target_pins::TargetPins;
use super::windows::{WindowCounters, WindowMode, WindowStats, Windows};
use crate::cache::Cache;
use crate::net::{LinkError, Peers, Rank, RdmaKind, RdmaOp};
use crate::pin::Access;
use crate::rma::RmaError;
use crate::rt::inside::Inside;
use crate::rt::lock::{Lock, LockGuard};
use firehose_proto::{
    Acquire, Event, FhError, Firehose, FirehoseConfig, InvalId, RegionPins, RemoteError, Rights,
    Seg,
};

/// The active-message id of every Firehose message.
pub const FIREHOSE_AM: u16 = 0xFE00;

/// Most segments of one chunk posted in one `Link::rdma_batch` (an op usually has one or two:
/// one per region it covers).
const POST_BATCH: usize = 4;

/// Counters of the driver itself (the algorithm counts the rest).
#[derive(Debug, Default)]
struct Counters {
    puts: AtomicU64,
    gets: AtomicU64,
    self_ops: AtomicU64,
    rejected: AtomicU64,
    rdma_posted: AtomicU64,
}

/// A snapshot of `Rma::stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RmaStats {
    pub fh: firehose_proto::FirehoseStats,
    pub puts: u64,
    pub gets: u64,
    /// Operations on this rank's own memory (copied, no network).
    pub self_ops: u64,
    /// Firehose messages from peers that were malformed or out of protocol (dropped).
    pub rejected: u64,
    pub rdma_posted: u64,
    /// Remote invalidation (all zero when it is off or in a job of one).
    pub revoke: RevokeStats,
    /// Memory windows (`FH_MW`; all zero when off).
    pub windows: WindowStats,
    /// Short gets that read into a bounce slot (no local registration), and short gets that
    /// found every slot taken (their buffer was registered instead).
    pub gets_bounced: u64,
    pub gets_bounce_full: u64,
}

struct Engine {
    fh: Firehose,
    /// Requests and chunks (see `ops`).
    ops: Ops,
    /// `None` in a job of one (nothing is ever pinned for a peer). `TargetPins` (verbs) from
    /// `new`, whatever `with_pins` was given otherwise.
    pins: Option<Box<dyn RegionPins + Send>>,
}

/// `FH_MW` against what the device offers: whether this rank's pins give each holder a
/// memory window of its own (`super::windows`).
fn windows_wanted(peers: &Peers) -> Result<bool, RmaError> {
    let mode = WindowMode::from_env().map_err(|e| {
        crate::fh_error!("firehose: {e}");
        RmaError::BadConfig
    })?;
    let has = match peers.pd() {
        Some(pd) if peers.verbs().is_some() => pd.context().has_type2_windows().unwrap_or(false),
        _ => false,
    };
    mode.decide(has).map_err(|e| {
        crate::fh_error!("firehose: rank {}: {e}", peers.rank());
        RmaError::BadConfig
    })
}

/// Pins for a job of one: never called (the algorithm has no peers), refuse if it is.
struct NoPins;
impl RegionPins for NoPins {
    fn pin(
        &mut self,
        _: u64,
        _: usize,
        _: firehose_proto::Rights,
    ) -> Result<u32, firehose_proto::PinFailure> {
        Err(firehose_proto::PinFailure::Other)
    }
    fn unpin(&mut self, _: u64, _: usize, _: u32) {}
    fn write(&mut self, _: u64, _: &[u8]) -> Result<(), firehose_proto::PinFailure> {
        Err(firehose_proto::PinFailure::Other)
    }
}

/// Puts and gets of one context. Build with `Rma::new` (registers the endpoint handlers), or
/// `Rma::with_pins` over a simulated link.
pub struct Rma {
    peers: Arc<Peers>,
    /// The engine, counters and local cache, shared with the endpoint's RDMA handler.
    sh: Arc<Shared>,
    /// Drops the engine's pins where the engine itself used to drop, right after `peers` (the
    /// handler keeps the rest of the engine until the endpoint goes).
    _pins: PinsGo,
    /// `engine.ops.board`: what `wait` spins on without the lock.
    done: Arc<DoneBoard>,
    /// The key of a request whose result a wait collected from the board (0: none): its table
    /// entry is removed by the next `start`, in the critical section it takes anyway, so a
    /// blocking op takes the engine lock twice (start, completion), not a third time to collect.
    reap: AtomicU64,
    rank: Rank,
    size: u32,
    /// Longest chunk: Firehose's `max_op_len`, capped by the link's longest RDMA.
    max_chunk: usize,
    /// Puts up to this long are posted inline, with no local registration (0: none).
    inline_max: usize,
    small_put_max: usize,
    counters: Counters,
    /// Peers the endpoint declared lost, not yet told to the algorithm (a leaf lock).
    lost: Mutex<Vec<Rank>>,
    /// Set after a push to `lost`: `progress` looks at `lost` only then (its lock would
    /// otherwise be taken on every poll of every waiter and of the progress thread).
    lost_any: AtomicBool,
    /// Remote invalidation (`None`: off, or a job of one). Stopped first when the `Rma` goes.
    revoke: Mutex<Option<Revocation>>,
    /// What peers may reach here (`FH_EXPOSE`, `fh_expose`): checked by the pins (`Exposed`).
    exposure: Arc<Exposure>,
    /// The memory windows' counters (set by `new` when `FH_MW` put windows on).
    windows: std::sync::OnceLock<Arc<WindowCounters>>,
}

/// What a completion needs, shared with the endpoint's RDMA handler: the handler holds it
/// strongly, so a completion touches no reference count (the endpoint holds the handler and the
/// `Rma` holds the endpoint: the handler reaches the `Rma` itself only weakly, and only for a
/// completion that leaves messages to send or events to handle). Holds nothing of the endpoint.
struct Shared {
    engine: Lock<Engine>,
    /// Releases (`Firehose::release`, the cache's `deregister`) that failed: a chunk or a
    /// registration released twice (a bug; `check_idle` reports it), or a cache that was
    /// quarantined by a fork.
    bad_releases: AtomicU64,
    /// Registers the caller's buffers (`None` in a job of one: every op is a local copy).
    local: Option<Arc<Cache>>,
    /// `engine.ops.board`: a fast completion publishes its result there without the lock.
    board: Arc<DoneBoard>,
    /// The parked fast op (module docs): its Firehose op id once its segment completed, until
    /// the next holder of the engine lock ends it (`unpark`); 0: none.
    parked: AtomicU64,
    /// The parked op's result (`done_board::encode`), written before `parked`.
    parked_err: AtomicU64,
    /// The registration of the fast op when it is a get (0: none, or a put): it leaves the
    /// op's table entry at the start and is released by the completion, after the result is
    /// published, as `seg_done` releases an entry's (taken before the op is parked: the next
    /// fast op may set it once the parked op is passed on).
    fast_reg: AtomicU64,
    /// Something waits for the front slot's release (`Firehose::front_awaited`, as the last
    /// critical section that could change it found it: `settle`): a fast completion then ends
    /// its op under the lock at once.
    eager: AtomicBool,
    /// Bounce slots for short gets (`bounce`; `None` in a job of one or if the pool could not
    /// be registered). The table's copy (`Ops::bounce`) is the same pool.
    bounce: Option<Arc<Bounce>>,
}

impl Shared {
    /// The engine lock, the parked op (if any) ended first: the one way to the lock (`start`
    /// takes it directly and ends the parked op its own way).
    #[inline(always)]
    fn lock(&self) -> LockGuard<'_, Engine> {
        let mut g = self.engine.lock();
        self.unpark(&mut g);
        g
    }

    /// Ends the parked op, if any (under the engine lock, `e` its content). Once: the word is
    /// cleared (`take_parked`).
    #[inline]
    fn unpark(&self, e: &mut Engine) {
        let op = self.take_parked();
        if op != 0 {
            self.end(&mut e.fh, &mut e.ops, op);
        }
    }

    /// The parked op, taken out of its word (0: none); under the engine lock, whose holder
    /// then ends it (`end`, or `start`'s own way).
    #[inline(always)]
    fn take_parked(&self) -> u64 {
        // Sequentially consistent: `settle`'s side of the exchange with `fast_done`.
        let op = self.parked.load(SeqCst);
        if op != 0 {
            // A plain store (no exchange): nothing else writes a non-zero word back to 0
            // (holders of the lock only), and no completion writes it until a start has taken
            // this op (the next fast op needs the front slot this one holds).
            self.parked.store(0, Relaxed);
        }
        op
    }

    /// Ends parked op `op` (taken): its table entry as its completion would have ended it,
    /// and its firehose release.
    #[inline]
    fn end(&self, fh: &mut Firehose, ops: &mut Ops, op: u64) {
        let r = done_board::decode_code(self.parked_err.load(Relaxed));
        ops.finish_parked(op, r.err());
        self.release(fh, op);
    }

    /// `start`'s way to its entry when it does not take over the parked op's: ends the parked
    /// op `parked` (0: none), then `Ops::begin` (out of line: a blocking op takes over).
    #[inline(never)]
    fn end_and_begin<'a>(
        &self,
        fh: &mut Firehose,
        ops: &'a mut Ops,
        parked: u64,
        collected: u64,
    ) -> (u64, &'a mut Request) {
        if parked != 0 {
            self.end(fh, ops, parked);
        }
        ops.begin(collected)
    }

    /// `start`'s hit when the parked op's reference could not pass to it: the parked op's
    /// release, then `acquire_hit` (out of line).
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn release_then_hit(
        &self,
        fh: &mut Firehose,
        parked: u64,
        op: u64,
        peer: Rank,
        raddr: u64,
        len: usize,
        rights: Rights,
    ) -> Option<Seg> {
        self.release(fh, parked);
        fh.acquire_hit(op, peer, raddr, len, rights)
    }

    /// The firehose release of parked op `op`. Cannot fail: the op holds its reference until
    /// here (counted if it ever does, for `check_idle`).
    #[inline]
    fn release(&self, fh: &mut Firehose, op: u64) {
        if fh.release(op).is_err() {
            self.bad_releases.fetch_add(1, Relaxed);
        }
    }

    /// After a critical section that may have changed what waits for the front slot's release
    /// (a message, an acquire past the hit, a lost peer, an invalidation, a release): `eager`
    /// says it again; when set, a parked op is ended now (its completion may have parked before
    /// it could see `eager`).
    #[inline]
    fn settle(&self, e: &mut Engine) {
        if e.fh.front_awaited() {
            self.eager.store(true, SeqCst);
            self.unpark(e);
        } else if self.eager.load(Relaxed) {
            self.eager.store(false, Relaxed);
        }
    }

    /// The completion of fast op `op` (`FAST` was in its token): parks it and publishes its
    /// result on the board, without the engine lock (module docs); if something waits for its
    /// release (`eager`), ends it under the lock at once. A get's completion, which also has
    /// its registration to release (and a bounced get's bytes to copy first), goes out of line
    /// (`fast_get_done`): nothing of it is live across a call in a put's.
    #[inline(always)]
    fn fast_done(&self, op: u64, err: Option<RmaError>, drain: impl FnOnce(LockGuard<'_, Engine>)) {
        // Empty: a fast op holds the front slot, which only the end of the op parked before it
        // frees (each start takes the parked op first).
        debug_assert_eq!(self.parked.load(Relaxed), 0, "two fast ops parked");
        // Only this completion clears it (or a refused post, which has none), and no start sets
        // it before this op is parked: a load and a store, no exchange.
        let reg = self.fast_reg.load(std::sync::atomic::Ordering::Acquire);
        match NonZeroU64::new(reg) {
            None => self.park(op, err, drain),
            Some(h) => self.fast_get_done(op, err, h, drain),
        }
    }

    /// `fast_done` of a get holding registration `h` (out of line: see there).
    #[inline(never)]
    fn fast_get_done(
        &self,
        op: u64,
        err: Option<RmaError>,
        h: NonZeroU64,
        drain: impl FnOnce(LockGuard<'_, Engine>),
    ) {
        self.fast_reg.store(0, Relaxed);
        // A bounced get's bytes reach the caller before anyone can see the result (the parked
        // op's end publishes it too).
        if let Some(b) = &self.bounce {
            b.finish(h, err.is_none());
        }
        self.park(op, err, drain);
        self.dereg(h);
    }

    /// Parks fast op `op` with its result and publishes it (`fast_done`).
    #[inline(always)]
    fn park(&self, op: u64, err: Option<RmaError>, drain: impl FnOnce(LockGuard<'_, Engine>)) {
        let code = done_board::encode(err.map_or(Ok(()), Err));
        self.parked_err.store(code, Relaxed);
        self.parked.store(op, SeqCst);
        // After parking: a waiter that took the result and starts again finds it parked.
        self.board.publish(op & !OWN, code);
        if self.eager.load(SeqCst) {
            self.end_parked(drain);
        }
    }

    /// `fast_done` while something waits for the release (out of line, rare).
    #[cold]
    #[inline(never)]
    fn end_parked(&self, drain: impl FnOnce(LockGuard<'_, Engine>)) {
        let _inside = crate::rt::inside::enter();
        let mut g = self.lock();
        self.settle(&mut g);
        if g.fh.has_output() {
            drain(g);
        }
    }

    /// One RDMA segment of chunk `chunk` completed: `Rma::finish` written out for the hit
    /// path's completion, the one critical section of a put or get after its start. `drain`
    /// gets the lock when the algorithm left output (it must send under it, then release it).
    #[inline(always)]
    fn seg_done(
        &self,
        chunk: u64,
        err: Option<RmaError>,
        drain: impl FnOnce(LockGuard<'_, Engine>),
    ) {
        let _inside = crate::rt::inside::enter();
        let mut g = self.lock();
        let Engine { fh, ops, .. } = &mut *g;
        let done = ops.seg_done(chunk, err);
        if let Some(Finished { release: true, .. }) = done {
            // Cannot fail for an op that holds references (see `Rma::finish`).
            if fh.release(chunk).is_err() {
                self.bad_releases.fetch_add(1, Relaxed);
            }
        }
        if fh.has_output() {
            drain(g);
        } else {
            drop(g);
        }
        if let Some(Finished { dereg: Some(h), .. }) = done {
            self.dereg(h);
        }
    }

    /// Releases a request's registration: a bounce slot back to its pool, else the cache's.
    fn dereg(&self, h: NonZeroU64) {
        let ok = match (&self.bounce, &self.local) {
            (Some(b), _) if Bounce::owns(h) => b.put_back(h),
            (_, Some(c)) => c.deregister(h.get()).is_ok(),
            (_, None) => true,
        };
        if !ok {
            self.bad_releases.fetch_add(1, Relaxed);
        }
    }
}

/// `Rma::_pins`: the pins go with the context (a late completion needs none).
struct PinsGo(Arc<Shared>);

impl Drop for PinsGo {
    fn drop(&mut self) {
        let pins = self.0.lock().pins.take();
        drop(pins);
    }
}

/// The RDMA handler's completion of a segment that is not a fast op's (out of line: the fast
/// completion stays small).
#[inline(never)]
fn locked_done(sh: &Shared, w: &Weak<Rma>, token: u64, err: Option<RmaError>) {
    sh.seg_done(token, err, |g| drain_weak(w, g));
}

/// The RDMA handler's way to the output of a completion (out of line, rare): through the `Rma`
/// while it lives; once it is gone, nobody waits for what it would send or report.
#[cold]
#[inline(never)]
fn drain_weak(w: &Weak<Rma>, mut g: LockGuard<'_, Engine>) {
    match w.upgrade() {
        Some(r) => r.drain_unlock(g),
        None => {
            while g.fh.poll_transmit().is_some() {}
            while g.fh.poll_event().is_some() {}
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The error of a failed op (the Firehose core knows nothing of this library's errors).
fn status_of(e: FhError) -> RmaError {
    use RmaError::*;
    match e {
        FhError::ZeroLength => ZeroLength,
        FhError::Overflow => Overflow,
        FhError::BadRank(_) | FhError::SelfRank => BadRank,
        FhError::TooLong { .. } => TooLarge,
        FhError::PutLength | FhError::BadRights => BadAccess,
        FhError::DuplicateOp | FhError::UnknownOp => UnknownHandle,
        FhError::PeerLost(_) => PeerLost,
        FhError::Remote(RemoteError::NoMemory) => NoMemory,
        FhError::Remote(RemoteError::Unmapped) => RemoteFault,
        FhError::Remote(RemoteError::Denied) => RemoteDenied,
        // `PinFailed`, and `Refused` (the target's settings do not take the move).
        FhError::Remote(_) => PinFailed,
    }
}

fn link_status(e: &LinkError) -> RmaError {
    match e {
        LinkError::ZeroLength => RmaError::ZeroLength,
        LinkError::Overflow => RmaError::Overflow,
        LinkError::BadRank(_) => RmaError::BadRank,
        LinkError::TooLong { .. } => RmaError::TooLarge,
        LinkError::Closed => RmaError::Finalized,
        // A remote access error breaks the connection (RC); so does a device error. A post the
        // device refused (`Device` from `rdma`, the connection possibly still up) is reported
        // the same: no status says "this transfer failed, the peer is fine", and the caller's
        // remedy is the same (the transfer did not complete; tests/rma_seg_fail.rs).
        _ => RmaError::PeerLost,
    }
}

/// What every rank must share, compared at a collective start (`agree`): the peer layer's
/// settings, whether this rank's own are valid, the algorithm's, and the exposure mode.
fn must_agree(
    peers: &Peers,
    valid: bool,
    cfg: Option<&FirehoseConfig>,
    mode: Option<ExposeMode>,
) -> Vec<Agreed> {
    let mut agreed = agree::net_settings(peers);
    agreed.push(Agreed::new("valid FH_* settings", u64::from(valid)));
    if let Some(c) = cfg {
        agreed.extend(c.must_agree().iter().map(|&(v, x)| Agreed::new(v, x)));
    }
    if let Some(m) = mode {
        agreed.push(agree::exposure(m));
    }
    agreed
}

impl Rma {
    /// Puts and gets over `peers`. `local` registers the caller's buffers on the link's
    /// protection domain (required with more than one rank). Registers the Firehose message
    /// handler, the RDMA completion handler and the peer-loss handler on the endpoint.
    /// Settings from the environment (`FH_M`, ..., `FH_REMOTE_INVALIDATION`); the target's pins
    /// are verbs memory regions on `peers.pd()`. Collective: compares the settings every rank
    /// must share (`super::agree`) and fails on every rank if they differ.
    pub fn new(peers: Arc<Peers>, local: Option<Arc<Cache>>) -> Result<Arc<Rma>, RmaError> {
        let (rank, size) = (peers.rank(), peers.size());
        let cfg = FirehoseConfig::from_env(rank, size).map_err(|e| {
            crate::fh_error!("firehose: {}: {}", e.var, e.msg);
            RmaError::BadConfig
        });
        let rs = RevokeSettings::from_env();
        let mode = ExposeMode::from_env().map_err(|e| {
            crate::fh_error!("firehose: {e}");
            RmaError::BadConfig
        });
        // Every rank takes part in the comparison, also one whose own settings are invalid (the
        // others then fail at once instead of after FH_AM_TIMEOUT_MS).
        let windows = windows_wanted(&peers);
        let valid = cfg.is_ok() && rs.is_ok() && mode.is_ok() && windows.is_ok();
        let agreed = must_agree(
            &peers,
            valid,
            cfg.as_ref().ok(),
            mode.as_ref().ok().copied(),
        );
        agree::exchange_or_fail(&peers, &agreed)?;
        let (cfg, rs, mode, windows) = (cfg?, rs?, mode?, windows?);
        let revocation =
            (size > 1 && rs.enabled).then(|| Revocation::new(rs, revoke::queue::DEFAULT_SLOTS));
        let mut counters = None;
        let pins = match peers.pd() {
            Some(pd) if size > 1 => {
                let pins = TargetPins::new(pd.clone(), revocation.as_ref().map(|r| r.pinned()));
                let pins = match (windows, peers.verbs()) {
                    (true, Some(link)) => pins.with_windows(Windows::new(link.clone(), pd.clone())),
                    _ => pins,
                };
                counters = pins.window_counters();
                Some(Box::new(pins) as Box<dyn RegionPins + Send>)
            }
            _ => None,
        };
        let rma = Self::build(peers, local, cfg, pins, revocation, mode)?;
        if let Some(c) = counters {
            let _ = rma.windows.set(c);
        }
        rma.barrier_after_handlers()?;
        Ok(rma)
    }

    /// The collective start over a simulated link, for tests: the settings exchange, `build`
    /// and the barrier after it, as `new` does with a device.
    #[cfg(any(test, feature = "test-support"))]
    pub fn with_pins_collective(
        peers: Arc<Peers>,
        local: Option<Arc<Cache>>,
        cfg: FirehoseConfig,
        pins: Box<dyn RegionPins + Send>,
    ) -> Result<Arc<Rma>, RmaError> {
        let agreed = must_agree(&peers, true, Some(&cfg), Some(ExposeMode::All));
        agree::exchange_or_fail(&peers, &agreed)?;
        let rma = Self::with_pins(peers, local, cfg, pins)?;
        rma.barrier_after_handlers()?;
        Ok(rma)
    }

    /// The last step of a collective start: returns on no rank before every rank has installed
    /// its handlers. Why: a peer that has left `agree::exchange` may send its first Firehose
    /// message at once, while this rank still polls in its own exchange (waiting for a third
    /// rank's settings). Delivered before `install_handlers`, that message would find no handler,
    /// be rejected and lost, and the peer's put would wait out `FH_AM_TIMEOUT_MS` (seen at 4
    /// ranks without progress threads). Bounded like every barrier.
    fn barrier_after_handlers(&self) -> Result<(), RmaError> {
        if self.size > 1 {
            self.peers.barrier()?;
        }
        Ok(())
    }

    /// For simulation and tests: puts and gets over `peers` with the algorithm's settings
    /// given (`cfg`, for this rank and size; `max_msg` is capped by the endpoint as in `new`)
    /// and the target's pins carried out by `pins` (e.g. `super::sim_pins::SimPins` over a
    /// `net::sim::SimNet`), no device needed. Remote invalidation is off (nothing watches this
    /// rank's unmaps). `local` registers the caller's buffers (any backend whose keys the link
    /// accepts: the simulator does not check lkeys).
    pub fn with_pins(
        peers: Arc<Peers>,
        local: Option<Arc<Cache>>,
        cfg: FirehoseConfig,
        pins: Box<dyn RegionPins + Send>,
    ) -> Result<Arc<Rma>, RmaError> {
        Self::with_pins_exposed(peers, local, cfg, pins, ExposeMode::All)
    }

    /// `with_pins` with the exposure policy given (`FH_EXPOSE`; every rank must pass the same).
    pub fn with_pins_exposed(
        peers: Arc<Peers>,
        local: Option<Arc<Cache>>,
        cfg: FirehoseConfig,
        pins: Box<dyn RegionPins + Send>,
        mode: ExposeMode,
    ) -> Result<Arc<Rma>, RmaError> {
        if cfg.rank != peers.rank() || cfg.size != peers.size() {
            crate::fh_error!(
                "firehose: config for rank {} of {}, peers are rank {} of {}",
                cfg.rank,
                cfg.size,
                peers.rank(),
                peers.size()
            );
            return Err(RmaError::BadConfig);
        }
        Self::build(peers, local, cfg, Some(pins), None, mode)
    }

    fn build(
        peers: Arc<Peers>,
        local: Option<Arc<Cache>>,
        mut cfg: FirehoseConfig,
        pins: Option<Box<dyn RegionPins + Send>>,
        mut revocation: Option<Revocation>,
        mode: ExposeMode,
    ) -> Result<Arc<Rma>, RmaError> {
        let (rank, size) = (peers.rank(), peers.size());
        // Every pin and small put a peer asks for passes the policy first; the link's own
        // buffers are never a target.
        let exposure = Exposure::new(mode);
        for (a, l) in peers.link().own_buffers() {
            exposure.add_library(a, l);
        }
        let pins = pins.map(|inner| {
            Box::new(Exposed {
                inner,
                policy: exposure.clone(),
            }) as Box<dyn RegionPins + Send>
        });
        cfg.max_msg = cfg.max_msg.min(peers.am().max_payload());
        let fh = Firehose::new(cfg).map_err(|e| {
            crate::fh_error!("firehose: {}: {}", e.var, e.msg);
            RmaError::BadConfig
        })?;
        let pins = if size > 1 { pins } else { None };
        if size > 1 && (pins.is_none() || local.is_none()) {
            return Err(RmaError::NoDevice);
        }
        let max_rdma = peers.link().max_rdma();
        let max_chunk = if size > 1 {
            fh.config().max_op_len().min(max_rdma).max(1)
        } else {
            usize::MAX
        };
        // Short gets' bounce slots: the library's own memory, never a peer's target.
        let bounce = match &local {
            Some(c) if size > 1 => Bounce::new(c.pinner().clone()).map(Arc::new),
            _ => None,
        };
        if let Some(b) = &bounce {
            let (a, l) = b.range();
            exposure.add_library(a, l);
        }
        let ops = Ops::with_bounce(bounce.clone());
        let done = ops.board.clone();
        let small_put_max = fh.config().small_put_max;
        let sh = Arc::new(Shared {
            engine: Lock::new(Engine { fh, ops, pins }),
            bad_releases: AtomicU64::new(0),
            local,
            board: done.clone(),
            parked: AtomicU64::new(0),
            parked_err: AtomicU64::new(0),
            fast_reg: AtomicU64::new(0),
            bounce,
            eager: AtomicBool::new(false),
        });
        let rma = Arc::new(Rma {
            small_put_max,
            windows: std::sync::OnceLock::new(),
            done,
            reap: AtomicU64::new(0),
            _pins: PinsGo(sh.clone()),
            sh,
            rank,
            size,
            max_chunk,
            inline_max: if size > 1 {
                peers.link().max_inline_write().min(max_chunk)
            } else {
                0
            },
            counters: Counters::default(),
            lost: Mutex::new(Vec::new()),
            lost_any: AtomicBool::new(false),
            revoke: Mutex::new(None),
            exposure,
            peers,
        });
        rma.install_handlers();
        if let Some(r) = revocation.as_mut() {
            r.start(Box::new(RmaDriver(Arc::downgrade(&rma))))?;
        }
        *lock(&rma.revoke) = revocation;
        Ok(rma)
    }

    /// The endpoint keeps the handlers; they hold the `Rma` weakly (it holds the endpoint).
    fn install_handlers(self: &Arc<Self>) {
        let am = self.peers.am();
        let w: Weak<Rma> = Arc::downgrade(self);
        am.register_oneway(FIREHOSE_AM, move |from, data| {
            if let Some(r) = w.upgrade() {
                r.on_message(from, data);
            }
        });
        let w: Weak<Rma> = Arc::downgrade(self);
        let sh = self.sh.clone();
        am.set_rdma_handler(Some(Box::new(move |_peer, token, result| {
            let err = result.err().map(|e| link_status(&e));
            if token & FAST != 0 {
                sh.fast_done(token & !FAST, err, |g| drain_weak(&w, g));
            } else {
                locked_done(&sh, &w, token, err);
            }
        })));
        // Only recorded here (the endpoint may call it inside a send made under `engine`);
        // `progress` tells the algorithm.
        let w: Weak<Rma> = Arc::downgrade(self);
        am.set_peer_lost_handler(Some(Box::new(move |peer| {
            if let Some(r) = w.upgrade() {
                lock(&r.lost).push(peer);
                r.lost_any.store(true, Release);
            }
        })));
    }

    pub fn peers(&self) -> &Arc<Peers> {
        &self.peers
    }

    /// The exposure policy of this context (`FH_EXPOSE`).
    pub fn exposure(&self) -> &Arc<Exposure> {
        &self.exposure
    }

    /// `fh_expose`: peers may reach `[addr, addr + len)` with `rights` (`FH_EXPOSE=declared`;
    /// recorded, and without effect, with `all`).
    pub fn expose(&self, addr: u64, len: usize, rights: Rights) -> Result<(), RmaError> {
        if len == 0 {
            return Err(RmaError::ZeroLength);
        }
        if addr.checked_add(len as u64).is_none() {
            return Err(RmaError::Overflow);
        }
        if !rights.is_valid() {
            return Err(RmaError::BadAccess);
        }
        self.exposure.expose(addr, len, rights);
        Ok(())
    }

    /// `fh_unexpose`: withdraws the exposure of exactly `[addr, addr + len)`, then revokes the
    /// peers' firehoses on regions overlapping it (so no key granted while it was exposed
    /// outlives it) and waits until every holder let go (bounded by `FH_AM_TIMEOUT_MS`: a
    /// holder that stays silent is given up on, `RmaError::Timeout`). Regions that another
    /// exposure still allows are pinned again by the next miss there.
    pub fn unexpose(&self, addr: u64, len: usize) -> Result<(), RmaError> {
        let _inside = crate::rt::inside::enter();
        if !self.exposure.unexpose(addr, len) {
            return Err(RmaError::UnknownHandle);
        }
        if self.size == 1 || self.exposure.mode() == ExposeMode::All {
            return Ok(());
        }
        let id = self.with_core(|fh, pins| fh.invalidate(addr, len, pins));
        let s = self.peers.settings();
        let mut clock = WaitClock::new(s.probe, s.timeout);
        loop {
            if self.sh.lock().fh.invalidation_done(id) {
                return Ok(());
            }
            let n = self.progress()?;
            if let Due::Expired = clock.tick(Instant::now) {
                let late = self.sh.lock().fh.invalidation_holders(id);
                for p in late {
                    self.peers.am().give_up(p);
                }
                // The loss is told to the algorithm here: the holders count as having acked.
                self.progress()?;
                return Err(RmaError::Timeout);
            }
            if n == 0 {
                std::thread::yield_now();
            }
        }
    }

    /// Runs `f` on the algorithm under the engine lock, sends the messages it produced (still
    /// under the lock: they must leave in order), then handles its events without the lock.
    fn with_core<R>(&self, f: impl FnOnce(&mut Firehose, &mut dyn RegionPins) -> R) -> R {
        self.with_core_ops(|fh, pins, _| f(fh, pins))
    }

    /// `with_core` with the op tables too (same lock).
    fn with_core_ops<R>(
        &self,
        f: impl FnOnce(&mut Firehose, &mut dyn RegionPins, &mut Ops) -> R,
    ) -> R {
        let _inside = crate::rt::inside::enter();
        let mut g = self.sh.lock();
        let Engine { fh, ops, pins } = &mut *g;
        let r = match pins {
            Some(p) => f(fh, p.as_mut(), ops),
            None => f(fh, &mut NoPins, ops),
        };
        self.sh.settle(&mut g);
        // A hit or a release usually leaves nothing to send or handle.
        if g.fh.has_output() {
            self.drain_unlock(g);
        }
        r
    }

    /// Sends the algorithm's messages and takes its events under the lock `g`, then releases
    /// it and handles the events (out of line: a hit or a release usually has none).
    #[cold]
    #[inline(never)]
    fn drain_unlock(&self, mut g: LockGuard<'_, Engine>) {
        let events = self.drain(&mut g.fh);
        drop(g);
        for ev in events {
            self.on_event(ev);
        }
    }

    /// Sends the algorithm's messages (under the engine lock, `fh` is its content: they must
    /// leave in order) and takes its events, to be handled once the lock is released.
    fn drain(&self, fh: &mut Firehose) -> Vec<Event> {
        while let Some((to, msg)) = fh.poll_transmit() {
            // A failed send means the peer is lost (or we finalized): the loss handler tells
            // the algorithm, which fails what waited on it.
            let _ = self.peers.am().send_oneway(to, FIREHOSE_AM, &msg);
        }
        let mut events = Vec::new();
        while let Some(ev) = fh.poll_event() {
            events.push(ev);
        }
        events
    }

    fn on_message(&self, from: Rank, data: &[u8]) {
        if self
            .with_core(|fh, pins| fh.handle_message(from, data, pins))
            .is_err()
        {
            self.counters.rejected.fetch_add(1, Relaxed);
        }
    }

    fn on_event(&self, ev: Event) {
        match ev {
            Event::Ready { op, segs } => self.post_segs(op, &segs),
            Event::Failed { op, error } => {
                self.finish(op, |ops| ops.finish_chunk(op, Some(status_of(error))))
            }
            Event::PutDone { op } => self.finish(op, |ops| ops.finish_chunk(op, None)),
        }
    }

    /// Records in the table that chunk `op` progressed (`f`); if that finished it, releases its
    /// firehoses in the same critical section, then (without the lock) the local buffer.
    fn finish(&self, op: u64, f: impl FnOnce(&mut Ops) -> Option<Finished>) {
        let done = self.with_core_ops(|fh, _, ops| {
            let done = f(ops)?;
            // Cannot fail for an op that holds references (the table says it does); counted if
            // it ever does (a double release), for `check_idle`.
            if done.release && fh.release(op).is_err() {
                self.sh.bad_releases.fetch_add(1, Relaxed);
            }
            Some(done)
        });
        if let Some(Finished { dereg: Some(h), .. }) = done {
            self.dereg(h);
        }
    }

    /// One RDMA segment of chunk `chunk` completed (`Shared::seg_done`; the endpoint's RDMA
    /// handler calls that directly), or failed to post.
    fn seg_done(&self, chunk: u64, err: Option<RmaError>) {
        self.sh.seg_done(chunk, err, |g| self.drain_unlock(g));
    }

    fn dereg(&self, h: NonZeroU64) {
        self.sh.dereg(h);
    }

    /// Posts one RDMA per segment of chunk `op` (its firehoses are held until the last ends):
    /// a `Ready` event, the chunk waited in the table.
    fn post_segs(&self, op: u64, segs: &[Seg]) {
        let c = {
            let mut g = self.sh.lock();
            let Some(c) = g.ops.chunk_mut(op) else {
                return; // cannot happen: a chunk leaves the table only when it is over
            };
            c.holds_refs = true;
            c.segs_left = segs.len() as u32;
            *c
        };
        self.post(op, &c, segs);
    }

    /// Posts the segments of chunk `op`, already recorded in the table (`holds_refs`,
    /// `segs_left`); `c` is its copy (the fields a post reads never change).
    fn post(&self, op: u64, c: &Chunk, segs: &[Seg]) {
        if segs.is_empty() {
            self.seg_done_empty(op);
            return;
        }
        // An op over several regions goes out as one batch (verbs: one chain of work requests,
        // one doorbell; on Soft-RoCE one system call instead of one per region).
        let mut from = 0;
        while from < segs.len() {
            let group = &segs[from..segs.len().min(from + POST_BATCH)];
            let mut batch = [RdmaOp {
                kind: c.kind,
                local_addr: 0,
                lkey: c.lkey,
                len: 0,
                remote_addr: 0,
                rkey: 0,
                token: op,
            }; POST_BATCH];
            for (b, s) in batch.iter_mut().zip(group) {
                b.local_addr = c.local + (s.raddr - c.raddr);
                b.len = s.len;
                b.remote_addr = s.raddr;
                b.rkey = s.rkey;
            }
            // Counted as handed to the link, before the post (a completion, and the waiter it
            // wakes, may come before the next line), a refused one too (as on the hit path).
            let n = group.len();
            self.counters.rdma_posted.fetch_add(n as u64, Relaxed);
            // SAFETY: each local range lies in the caller's buffer, registered under `lkey` by
            // the cache until the request ends (after this op's last completion); the caller
            // does not touch it until then (fh_put_nb/fh_get_nb contract). Each remote range is
            // inside a region the target pinned for us, held until `release`.
            let r = unsafe { self.peers.link().rdma_batch(c.peer, &batch[..n]) };
            let tried = match r {
                Ok(()) => n,
                Err((posted, e)) => {
                    // Those after the refused one were not handed over (yet): uncounted first.
                    let tried = posted + 1;
                    let untried = (n - tried) as u64;
                    self.counters.rdma_posted.fetch_sub(untried, Relaxed);
                    // The segment at `posted` (the one refused; the first, when the link
                    // refused the whole batch) is done with the error, no completion comes for
                    // it; the segments after it are still posted, as they would be one by one.
                    self.seg_failed(op, e);
                    tried
                }
            };
            from += tried;
        }
    }

    /// `start`'s post refused: as `seg_failed`; a fast op's registration (`fast_reg`, if it is
    /// a get) is released here, its completion will not come (out of line).
    #[cold]
    #[inline(never)]
    fn post_failed(&self, op: u64, fast: bool, e: LinkError) {
        let h = if fast {
            self.sh.fast_reg.swap(0, AcqRel)
        } else {
            0
        };
        self.seg_failed(op, e);
        if let Some(h) = NonZeroU64::new(h) {
            self.dereg(h);
        }
    }

    /// A post the link refused: the segment is done with its error (out of line).
    #[cold]
    #[inline(never)]
    fn seg_failed(&self, op: u64, e: LinkError) {
        self.seg_done(op, Some(link_status(&e)));
    }

    fn seg_done_empty(&self, op: u64) {
        self.finish(op, |ops| ops.finish_chunk(op, None));
    }

    /// Starts a put (`local` -> `raddr` at `peer`) or a get (`raddr` at `peer` -> `local`).
    /// Returns the request id (non-zero). `implicit`: no handle, `quiet` collects it.
    ///
    /// # Safety
    /// `local` is valid for `len` bytes (readable for a put, writable for a get) and is not
    /// touched by the caller until the request is done.
    pub unsafe fn start(
        &self,
        kind: RdmaKind,
        peer: Rank,
        raddr: u64,
        local: *mut u8,
        len: usize,
        implicit: bool,
    ) -> Result<u64, RmaError> {
        let inside = crate::rt::inside::enter();
        // SAFETY: forwarded contract.
        unsafe { self.start_in(&inside, kind, peer, raddr, local, len, implicit) }
    }

    /// `start` for a caller that marked the thread as inside the library already (the C
    /// exports: their guard), which spares a thread-local lookup per call.
    ///
    /// # Safety
    /// As `start`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn start_in(
        &self,
        _inside: &Inside,
        kind: RdmaKind,
        peer: Rank,
        raddr: u64,
        local: *mut u8,
        len: usize,
        implicit: bool,
    ) -> Result<u64, RmaError> {
        if local.is_null() {
            return Err(RmaError::Null);
        }
        if len == 0 {
            return Err(RmaError::ZeroLength);
        }
        if raddr.checked_add(len as u64).is_none() || (local as usize).checked_add(len).is_none() {
            return Err(RmaError::Overflow);
        }
        if peer >= self.size {
            return Err(RmaError::BadRank);
        }
        match kind {
            RdmaKind::Write => self.counters.puts.fetch_add(1, Relaxed),
            RdmaKind::Read => self.counters.gets.fetch_add(1, Relaxed),
        };
        if peer == self.rank {
            // SAFETY: forwarded contract on `local`.
            return Ok(unsafe { self.start_self(kind, raddr, local, len, implicit) });
        }
        // A short put goes inline (the link copies it at post time): nothing to register, the
        // pin-down cache's lookup and release leave its hit path. A put's source is only read
        // by the device (no LOCAL_WRITE: a read-only buffer registers), a get's destination
        // is written. (`inline_max` is 0 without a cache: a job of one, where every op is a
        // local copy; with more ranks `build` insists on one.)
        // A short get reads into a bounce slot (`bounce`): nothing to register either; the
        // completion copies the bytes over. `local` is then the slot for everything below.
        let mut local = local;
        let (reg, lkey) = if kind == RdmaKind::Write && len <= self.inline_max {
            (None, 0)
        // SAFETY: `local` is the caller's buffer of `len` (> 0) bytes (this function's contract).
        } else if let Some((h, slot, lkey)) = unsafe { self.bounce_slot(kind, local, len) } {
            local = slot as *mut u8;
            (Some(h), lkey)
        } else {
            let cache = self.sh.local.as_ref().ok_or(RmaError::NoDevice)?;
            let access = match kind {
                RdmaKind::Write => Access(0),
                RdmaKind::Read => Access::LOCAL_WRITE,
            };
            let r = cache.register(local as usize, len, access)?;
            // A live handle is never 0 (the cache's handles count slots from 1).
            (NonZeroU64::new(r.handle), r.lkey)
        };
        let rights = match kind {
            RdmaKind::Write => Rights::WRITE,
            RdmaKind::Read => Rights::READ,
        };
        if len <= self.max_chunk {
            // One chunk, kept in the request's own entry (`Request::own`, op id `req | OWN`):
            // one table entry, and one critical section that records it, acquires its firehoses
            // and reuses the entry a previous wait collected.
            //
            // The parked op (module docs) is ended here as `Shared::lock` would, unless its
            // result was collected (`reap`): then its entry goes to this op as it is, and its
            // firehose reference too if this op hits the same firehose (`pass_front`).
            let mut g = self.sh.engine.lock();
            let collected = self.reap.swap(0, AcqRel);
            let mut parked = self.sh.take_parked();
            let Engine { fh, ops, .. } = &mut *g;
            let (req, entry) = if parked != 0 && parked & !OWN == collected {
                ops.renew_parked(collected)
            } else {
                let parked = std::mem::take(&mut parked);
                self.sh.end_and_begin(fh, ops, parked, collected)
            };
            let op = req | OWN;
            // The entry as a hit holds it, written while the values are at hand (nothing reads
            // the table before the lock is given back; past the hit, `start_one` rewrites it).
            // The parked op's holds it already but for what this op changes.
            match &mut entry.own {
                Some(c) if parked != 0 => {
                    debug_assert!(entry.chunks_left == 1 && entry.error.is_none() && !entry.done);
                    debug_assert!(c.segs_left == 1 && c.holds_refs && c.error.is_none());
                    entry.reg = reg;
                    entry.implicit = implicit;
                    (c.req, c.peer, c.kind, c.local, c.lkey, c.raddr) =
                        (req, peer, kind, local as u64, lkey, raddr);
                }
                _ => {
                    *entry = Request {
                        chunks_left: 1,
                        reg,
                        error: None,
                        implicit,
                        done: false,
                        own: Some(Chunk {
                            req,
                            peer,
                            kind,
                            local: local as u64,
                            lkey,
                            raddr,
                            segs_left: 1,
                            holds_refs: true,
                            error: None,
                        }),
                    }
                }
            }
            // The common hit (one firehose covers the op) without the general acquire's
            // result: its one segment, posted at once.
            // `passed`: the parked op's reference passed to this op, which `pass_front` does
            // only when nothing waits for its release.
            let hit = if parked == 0 {
                fh.acquire_hit(op, peer, raddr, len, rights)
                    .map(|s| (s, false))
            } else {
                match fh.pass_front(parked, op, peer, raddr, len, rights) {
                    Some(seg) => Some((seg, true)),
                    None => self
                        .sh
                        .release_then_hit(fh, parked, op, peer, raddr, len, rights)
                        .map(|s| (s, false)),
                }
            };
            let Some((seg, passed)) = hit else {
                let one = One {
                    req,
                    kind,
                    peer,
                    raddr,
                    local,
                    len,
                    implicit,
                    reg,
                    lkey,
                };
                // SAFETY: forwarded contract on `local`.
                unsafe { self.start_one(g, one) };
                return Ok(req);
            };
            // Fast (its completion parks: module docs) when nothing waits for its release. A
            // fast get's registration goes from its entry to `fast_reg`.
            // (Passed on: its slot has a word, the parked op's had.)
            let fast = !implicit && (passed || (DoneBoard::covers(req) && !fh.front_awaited()));
            if fast {
                if let Some(h) = reg {
                    entry.reg = None;
                    self.sh.fast_reg.store(h.get(), Release);
                }
            }
            if fh.has_output() {
                self.drain_unlock(g);
            } else {
                drop(g);
            }
            let rop = RdmaOp {
                kind,
                local_addr: local as u64,
                lkey,
                len: seg.len,
                remote_addr: seg.raddr,
                rkey: seg.rkey,
                token: if fast { op | FAST } else { op },
            };
            self.counters.rdma_posted.fetch_add(1, Relaxed);
            // SAFETY: as in `post` (the segment is the whole op).
            if let Err(e) = unsafe { self.peers.am().link_obj().rdma(peer, rop) } {
                self.post_failed(op, fast, e);
            }
            return Ok(req);
        }
        // SAFETY: forwarded contract on `local`.
        unsafe { self.start_chunks(kind, peer, raddr, local, len, implicit, (reg, lkey)) }
    }

    /// A bounce slot for a get of at most `bounce::SLOT` bytes into `local` (`None`: a put, a
    /// longer get, no pool, or every slot taken: the buffer is registered instead).
    ///
    /// # Safety
    /// As `start` (`local` is the get's destination, `len > 0`).
    #[inline(always)]
    unsafe fn bounce_slot(
        &self,
        kind: RdmaKind,
        local: *mut u8,
        len: usize,
    ) -> Option<(NonZeroU64, u64, u32)> {
        if kind != RdmaKind::Read || len > bounce::SLOT {
            return None;
        }
        // SAFETY: `local` is this get's destination of `len` (> 0) bytes (`start`'s contract).
        unsafe { self.sh.bounce.as_ref()?.take(local, len) }
    }

    /// `start` of one chunk past the common hit (out of line): the general acquire (a miss, a
    /// hit over several regions, a put that rides in the move, an error), in the critical
    /// section `g` that began the request's entry (`Ops::begin`, under key `one.req`).
    ///
    /// # Safety
    /// As `start`.
    #[inline(never)]
    unsafe fn start_one(&self, mut g: LockGuard<'_, Engine>, one: One) {
        let One {
            req,
            kind,
            peer,
            raddr,
            local,
            len,
            implicit,
            reg,
            lkey,
        } = one;
        let (rights, small_max) = match kind {
            RdmaKind::Write => (Rights::WRITE, self.small_put_max),
            RdmaKind::Read => (Rights::READ, 0),
        };
        let small = (len <= small_max).then(|| {
            // SAFETY: the caller's buffer, readable for a put (contract).
            unsafe { std::slice::from_raw_parts(local, len) }
        });
        let op = req | OWN;
        let Engine { fh, ops, .. } = &mut *g;
        let r = fh.acquire_for(op, peer, raddr, len, rights, small);
        let (segs_left, holds_refs) = match &r {
            Ok(Acquire::Hit(segs)) => (segs.len() as u32, true),
            _ => (0, false),
        };
        let chunk = Chunk {
            req,
            peer,
            kind,
            local: local as u64,
            lkey,
            raddr,
            segs_left,
            holds_refs,
            error: None,
        };
        *ops.reqs.get_mut(req).expect("begun") = Request {
            chunks_left: 1,
            reg,
            error: None,
            implicit,
            done: false,
            own: Some(chunk),
        };
        self.sh.settle(&mut g);
        if g.fh.has_output() {
            self.drain_unlock(g);
        } else {
            drop(g);
        }
        match r {
            Ok(Acquire::Hit(segs)) => self.post(op, &chunk, &segs),
            Ok(Acquire::Pending) | Ok(Acquire::DoneInMove) => {}
            Err(e) => self.finish(op, |ops| ops.finish_chunk(op, Some(status_of(e)))),
        }
    }

    /// `start` of a request longer than a chunk: one table entry per chunk, each acquired in
    /// its own critical section (out of line: the one-chunk path stays short).
    ///
    /// # Safety
    /// As `start`.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    unsafe fn start_chunks(
        &self,
        kind: RdmaKind,
        peer: Rank,
        raddr: u64,
        local: *mut u8,
        len: usize,
        implicit: bool,
        (reg, lkey): (Option<NonZeroU64>, u32),
    ) -> Result<u64, RmaError> {
        let rights = match kind {
            RdmaKind::Write => Rights::WRITE,
            RdmaKind::Read => Rights::READ,
        };
        let small_max = match kind {
            RdmaKind::Write => self.small_put_max,
            RdmaKind::Read => 0,
        };
        let n = len.div_ceil(self.max_chunk);
        let mut req = 0;
        for i in 0..n {
            let off = i * self.max_chunk;
            let clen = (len - off).min(self.max_chunk);
            let mut chunk = Chunk {
                req,
                peer,
                kind,
                local: local as u64 + off as u64,
                lkey,
                raddr: raddr + off as u64,
                segs_left: 0,
                holds_refs: false,
                error: None,
            };
            let small = (clen <= small_max).then(|| {
                // SAFETY: inside the caller's buffer, readable for a put (contract).
                unsafe { std::slice::from_raw_parts(local.add(off), clen) }
            });
            // The chunk (with the first, the request) enters the table in the engine's
            // critical section that acquires it (engine -> ops, ops a leaf): no event or
            // completion about it can be handled before it is there, and a hit is recorded
            // with its segments by the same table lock. Its key is its Firehose op id.
            let (id, r) = self.with_core_ops(|fh, _, ops| {
                if i == 0 {
                    req = ops.add_request(Request {
                        chunks_left: n as u32,
                        reg,
                        error: None,
                        implicit,
                        done: false,
                        own: None,
                    });
                }
                chunk.req = req;
                let id = ops.chunks.insert(chunk);
                let r = fh.acquire_for(id, peer, chunk.raddr, clen, rights, small);
                if let Ok(Acquire::Hit(segs)) = &r {
                    let c = ops.chunks.get_mut(id).expect("inserted above");
                    c.holds_refs = true;
                    c.segs_left = segs.len() as u32;
                }
                (id, r)
            });
            match r {
                Ok(Acquire::Hit(segs)) => self.post(id, &chunk, &segs),
                Ok(Acquire::Pending) | Ok(Acquire::DoneInMove) => {}
                Err(e) => self.finish(id, |ops| ops.finish_chunk(id, Some(status_of(e)))),
            }
        }
        Ok(req)
    }

    /// `start` on this rank's own memory: a copy, done at once (out of line, cold).
    ///
    /// # Safety
    /// As `start`.
    #[cold]
    #[inline(never)]
    unsafe fn start_self(
        &self,
        kind: RdmaKind,
        raddr: u64,
        local: *mut u8,
        len: usize,
        implicit: bool,
    ) -> u64 {
        self.counters.self_ops.fetch_add(1, Relaxed);
        let dir = if kind == RdmaKind::Write {
            Dir::Put
        } else {
            Dir::Get
        };
        // SAFETY: forwarded contract on `local`; `raddr` is checked by the kernel.
        let r = unsafe { self_copy::copy(dir, local, raddr, len) };
        self.done_request(r, implicit)
    }

    /// A request that finished at once (a local copy).
    fn done_request(&self, r: Result<(), RmaError>, implicit: bool) -> u64 {
        let mut g = self.sh.lock();
        let ops = &mut g.ops;
        if implicit {
            if let Err(e) = r {
                ops.implicit_error.get_or_insert(e);
            }
            // No handle: any non-zero value does (the caller asked for none).
            return u64::MAX;
        }
        ops.add_request(Request {
            chunks_left: 0,
            reg: None,
            error: r.err(),
            implicit: false,
            done: true,
            own: None,
        })
    }

    /// Progresses once; the request's result if it is done (its handle is then spent).
    pub fn test(&self, req: u64) -> Result<Option<Result<(), RmaError>>, RmaError> {
        let _inside = crate::rt::inside::enter();
        // A loop of tests polls as a wait does: the progress thread leaves it the completions.
        let _polling = self.peers.am().polling();
        if let Some(Some(r)) = self.done.collect(req) {
            self.reap_later(req);
            return Ok(Some(r));
        }
        if let Some(r) = self.sh.lock().ops.take_if_done(req)? {
            return Ok(Some(r));
        }
        self.progress_inside()?;
        if let Some(Some(r)) = self.done.collect(req) {
            self.reap_later(req);
            return Ok(Some(r));
        }
        self.sh.lock().ops.take_if_done(req)
    }

    /// After `DoneBoard::collect` handed this thread the result of `req`: its table entry goes
    /// at the next `start` (or now, for the one this replaces in the reap cell).
    #[inline(always)]
    fn reap_later(&self, req: u64) {
        let old = self.reap.swap(req, AcqRel);
        if old != 0 {
            self.reap_now(old);
        }
    }

    /// `reap_later`'s removal of the entry it replaced in the cell (out of line: a blocking
    /// op's start empties the cell before its wait fills it).
    #[cold]
    #[inline(never)]
    fn reap_now(&self, old: u64) {
        self.sh.lock().ops.reap(old);
    }

    /// Progresses until the request is done; returns its result (the handle is then spent).
    /// Bounded (`FH_AM_TIMEOUT_MS`): see `Bounded`.
    ///
    /// While the request runs the wait spins on its own word of the done board (progressing),
    /// not on the operation table, whose lock every completion takes; the word also carries
    /// the result, which the wait collects without the lock (`reap_later`). Every `RECHECK`
    /// polls it asks the table (a handle that is not a running request, spent or made up, has a
    /// word that never says done: the table then says what it is).
    pub fn wait(&self, req: u64) -> Result<(), RmaError> {
        let inside = crate::rt::inside::enter();
        self.wait_in(&inside, req)
    }

    /// `wait` for a caller that marked the thread as inside the library already (as
    /// `start_in`).
    pub fn wait_in(&self, _inside: &Inside, req: u64) -> Result<(), RmaError> {
        // This thread reaps the op's completion: the progress thread need not wake for it.
        let _polling = self.peers.am().polling();
        // The first poll usually completes a blocking put or get: it runs before the bound is
        // set up, which happens only if a second poll is needed (the bound's clock reads the
        // time only every `CHECK_EVERY` polls anyway: it starts one poll later, nothing else
        // changes). The board is asked after it only: a request done already (by another
        // thread's poll, or a post that failed) costs that one poll, which finds nothing; if the
        // poll fails, a done request's result still comes first.
        if let Some(slot) = self.done.slot(req) {
            let n = match self.progress_inside() {
                Ok(n) => n,
                Err(e) => return self.wait_failed(req, slot, e),
            };
            if let Some(r) = DoneBoard::take(slot) {
                self.reap_later(req);
                return r;
            }
            if n == 0 {
                // The completion is due any moment: spin, as `Bounded`'s first empty polls do.
                std::hint::spin_loop();
            }
        }
        self.wait_rest(req)
    }

    /// `wait`'s first poll failed with `e`: the request's result if it is done, else `e`.
    #[cold]
    #[inline(never)]
    fn wait_failed(&self, req: u64, slot: Slot<'_>, e: RmaError) -> Result<(), RmaError> {
        match DoneBoard::take(slot) {
            Some(r) => {
                self.reap_later(req);
                r
            }
            None => Err(e),
        }
    }

    /// `wait` past its first poll (out of line): bounded polls on the board's word, the table
    /// every `RECHECK` polls.
    #[inline(never)]
    fn wait_rest(&self, req: u64) -> Result<(), RmaError> {
        const RECHECK: u32 = 64;
        let mut b: Option<Bounded> = None;
        loop {
            let mut polls = 0;
            while polls < RECHECK {
                match self.done.collect(req) {
                    Some(Some(r)) => {
                        self.reap_later(req);
                        // Not set up: never gave up on anyone, the result stands.
                        return b.as_ref().map_or(r, |b| b.result(r));
                    }
                    Some(None) => {}
                    None => break,
                }
                b.get_or_insert_with(|| Bounded::new(self))
                    .poll(self, Some(req))?;
                polls += 1;
            }
            if let Some(r) = self.sh.lock().ops.take_if_done(req)? {
                return b.as_ref().map_or(r, |b| b.result(r));
            }
            if polls == 0 {
                // No word for this slot: poll here.
                b.get_or_insert_with(|| Bounded::new(self))
                    .poll(self, Some(req))?;
            }
        }
    }

    /// Progresses until every request of this context is done; returns the first error of an
    /// implicit (handle-less) request since the last `quiet`. Bounded as `wait`.
    pub fn quiet(&self) -> Result<(), RmaError> {
        let _inside = crate::rt::inside::enter();
        let _polling = self.peers.am().polling();
        let mut b = Bounded::new(self);
        loop {
            {
                let mut g = self.sh.lock();
                let ops = &mut g.ops;
                if ops.running() == 0 {
                    return b.result(ops.implicit_error.take().map_or(Ok(()), Err));
                }
            }
            b.poll(self, None)?;
        }
    }

    /// Progresses the endpoint (handlers, completions), then tells the algorithm about peers
    /// lost meanwhile (their ops fail).
    pub fn progress(&self) -> Result<usize, RmaError> {
        let _inside = crate::rt::inside::enter();
        // As in `test`: a caller's polling loop reaps its own completions.
        let _polling = self.peers.am().polling();
        self.progress_inside()
    }

    /// `progress` for a caller that marked the thread as inside the library already (`test`,
    /// the waits).
    #[inline(always)]
    fn progress_inside(&self) -> Result<usize, RmaError> {
        let n = self.peers.am().progress()?;
        // A push whose flag this swap misses is taken by the `take` below (the lock orders it),
        // or its flag is seen by the next call.
        if !(self.lost_any.load(Relaxed) && self.lost_any.swap(false, AcqRel)) {
            return Ok(n);
        }
        let lost = std::mem::take(&mut *lock(&self.lost));
        for p in &lost {
            self.with_core(|fh, pins| fh.peer_lost(*p, pins));
        }
        Ok(n + lost.len())
    }

    /// Peers that running chunks wait on.
    fn waited_peers(&self) -> Vec<Rank> {
        let g = self.sh.lock();
        let ops = &g.ops;
        let mut v: Vec<Rank> = ops.chunks().map(|c| c.peer).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Peers whose answer chunks of request `req` (of every request: `None`) still wait for: the
    /// chunks with no RDMA posted (a move unanswered, or blocked behind one). A chunk with RDMA
    /// posted waits for the link, not for the peer's CPU: its completion comes by itself.
    fn silent_peers(&self, req: Option<u64>) -> Vec<Rank> {
        let g = self.sh.lock();
        let ops = &g.ops;
        let mut v: Vec<Rank> = ops
            .chunks()
            .filter(|c| c.segs_left == 0 && req.map_or(true, |r| c.req == r))
            .map(|c| c.peer)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The firehoses this rank holds on `peer` (start, length, key, rights); for diagnostics
    /// and tests, e.g. to replay a key from another rank.
    #[doc(hidden)]
    pub fn firehoses_on(&self, peer: Rank) -> Vec<(u64, u64, u32, Rights)> {
        self.sh.lock().fh.firehoses_on(peer)
    }

    /// For tests: `Ok` when nothing is left of past operations (call once every request is
    /// done and no thread starts more): no chunk or running request in the table, no Firehose
    /// op unreleased, no reference held on a firehose, no release that failed (a double
    /// release), and the algorithm's own bookkeeping consistent. Otherwise what is left.
    #[doc(hidden)]
    pub fn check_idle(&self) -> Result<(), String> {
        let g = self.sh.lock();
        let (chunks, running) = (g.ops.chunks().count(), g.ops.running());
        let (fh_ops, refs) = (g.fh.ops_in_flight(), g.fh.refs_held());
        let bad = self.sh.bad_releases.load(Relaxed);
        let bounced = self.sh.bounce.as_ref().map_or(0, |b| b.in_use());
        if chunks + running + fh_ops > 0 || refs > 0 || bad > 0 || bounced > 0 {
            return Err(format!(
                "chunks {chunks}, running requests {running}, Firehose ops {fh_ops}, \
                 firehose refs {refs}, failed releases {bad}, bounce slots taken {bounced}"
            ));
        }
        g.fh.check_invariants()
    }

    pub fn stats(&self) -> RmaStats {
        let fh = self.sh.lock().fh.stats();
        let (gets_bounced, gets_bounce_full) =
            self.sh.bounce.as_ref().map_or((0, 0), |b| b.counts());
        RmaStats {
            gets_bounced,
            gets_bounce_full,
            fh,
            puts: self.counters.puts.load(Relaxed),
            gets: self.counters.gets.load(Relaxed),
            self_ops: self.counters.self_ops.load(Relaxed),
            rejected: self.counters.rejected.load(Relaxed),
            rdma_posted: self.counters.rdma_posted.load(Relaxed),
            revoke: lock(&self.revoke)
                .as_ref()
                .map_or_else(RevokeStats::default, |r| r.stats()),
            windows: self
                .windows
                .get()
                .map_or_else(WindowStats::default, |c| WindowStats {
                    on: true,
                    bound: c.bound.load(Relaxed),
                    dropped: c.dropped.load(Relaxed),
                    failed: c.failed.load(Relaxed),
                    unknown: c.unknown.load(Relaxed),
                }),
        }
    }
}

impl Drop for Rma {
    fn drop(&mut self) {
        // Before the engine (and its pins) go: no waiter, no listener call, no worker left.
        if let Some(mut r) = lock(&self.revoke).take() {
            r.stop();
        }
    }
}

/// A one-chunk request on its way past the common hit (`Rma::start_one`).
struct One {
    req: u64,
    kind: RdmaKind,
    peer: Rank,
    raddr: u64,
    local: *mut u8,
    len: usize,
    implicit: bool,
    reg: Option<NonZeroU64>,
    lkey: u32,
}

/// The `fh-revoke` worker's way into the `Rma` (weak: the worker never keeps a context alive).
struct RmaDriver(Weak<Rma>);

impl revoke::Driver for RmaDriver {
    fn invalidate(&self, addr: u64, len: u64) -> Option<InvalId> {
        let r = self.0.upgrade()?;
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        Some(r.with_core(|fh, pins| fh.invalidate(addr, len, pins)))
    }

    fn is_done(&self, id: InvalId) -> Option<bool> {
        let r = self.0.upgrade()?;
        let done = r.sh.lock().fh.invalidation_done(id);
        Some(done)
    }

    fn progress(&self) -> Option<usize> {
        let r = self.0.upgrade()?;
        match r.progress() {
            Ok(n) => Some(n),
            Err(RmaError::Finalized) => None,
            Err(_) => Some(0),
        }
    }

    fn wait_link(&self, d: Duration) {
        if let Some(r) = self.0.upgrade() {
            let _ = r.peers.link().wait(d);
        }
    }

    fn probe_peers(&self) {
        if let Some(r) = self.0.upgrade() {
            for p in (0..r.size).filter(|&p| p != r.rank) {
                let _ = r.peers.link().probe(p);
            }
        }
    }

    fn probe_every(&self) -> Duration {
        self.0
            .upgrade()
            .map_or(Duration::from_secs(1), |r| r.peers.settings().probe)
    }

    fn holder_bound(&self) -> Option<Duration> {
        self.0.upgrade().and_then(|r| r.peers.settings().timeout)
    }

    fn give_up_holders(&self, id: InvalId) -> Option<usize> {
        let r = self.0.upgrade()?;
        let late = r.sh.lock().fh.invalidation_holders(id);
        // Not under `engine`: a loss is recorded and told to the algorithm by the next progress
        // (the holder then counts as having acked).
        for &p in &late {
            r.peers.am().give_up(p);
        }
        Some(late.len())
    }
}

/// What bounds a blocking wait (`wait`, `quiet`): every probe interval (`FH_AM_PROBE_MS`) it
/// probes the peers it waits on, so a dead one turns into `RmaError::PeerLost`; once
/// `FH_AM_TIMEOUT_MS` has passed it gives up on the peers that still owe an answer (a live peer
/// that never progresses: computing, inside another library, hung). Those are declared lost
/// (`Am::give_up`: told with a goodbye, counted): the algorithm fails their ops at once, which
/// releases the ops' pins, reservations and queued messages, and the wait ends with
/// `RmaError::Timeout`. Only a peer given up on is affected; the context goes on with the others.
/// Why not leave the op running and just return: its reply or RDMA could still come and write
/// the caller's buffer after the caller took it back.
struct Bounded {
    clock: WaitClock,
    gave_up: bool,
    idle: IdlePolls,
}

impl Bounded {
    fn new(rma: &Rma) -> Self {
        let s = rma.peers.settings();
        Bounded {
            clock: WaitClock::new(s.probe, s.timeout),
            gave_up: false,
            idle: IdlePolls::default(),
        }
    }

    /// One round of a wait for request `req` (every request: `None`) that is not done yet.
    fn poll(&mut self, rma: &Rma, req: Option<u64>) -> Result<(), RmaError> {
        // Its callers (`wait`, `quiet`) marked the thread as inside.
        let n = rma.progress_inside()?;
        if !self.gave_up {
            match self.clock.tick(Instant::now) {
                Due::Nothing => {}
                Due::Probe => {
                    for p in rma.waited_peers() {
                        let _ = rma.peers.link().probe(p);
                    }
                }
                Due::Expired => {
                    self.gave_up = true;
                    for p in rma.silent_peers(req) {
                        rma.peers.am().give_up(p);
                    }
                }
            }
        }
        if n == 0 {
            self.idle.pause(std::thread::yield_now);
        }
        Ok(())
    }

    /// The wait's result: after giving up, what failed for the loss is a timeout.
    fn result(&self, r: Result<(), RmaError>) -> Result<(), RmaError> {
        match r {
            Err(RmaError::PeerLost) if self.gave_up => Err(RmaError::Timeout),
            r => r,
        }
    }
}
