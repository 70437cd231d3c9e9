//! A simulated `Link`: N ranks in one process, for tests of everything above the link.
//!
//! - Per-pair FIFO (as an RC queue pair); across pairs the order is whatever the seeded RNG picks,
//!   so a message can overtake one sent earlier to another rank.
//! - Two ways to move messages: `Manual` (nothing arrives until the test calls `step`, which
//!   delivers one in-flight message of a pair chosen by the RNG: a run is a function of the seed)
//!   or `Auto` (a rank's `poll` first delivers everything in flight to it, senders interleaved by
//!   the RNG: for tests with real threads and the progress thread; `wait` sleeps on a condvar).
//!   One `poll` at a time hands out a rank's arrivals (as verbs serialises receive polls), so
//!   handlers see each pair's messages in order even with many threads polling.
//! - Faults: `drop_connection` (both ends get `PeerLost`, in-flight messages vanish, later sends
//!   fail), `silence` (a rank dies with no event: only a `probe` of it reveals the loss), `inject`
//!   (raw bytes from any rank, for garbage).
//! - The flow-control invariant: a message arriving when its receiver already has `slots`
//!   messages of that sender occupying slots (arrived, or being handled by a `poll` callback) is
//!   an overrun; `overruns()` counts them, and tests assert 0.
//! - One-sided RDMA over a memory model: all ranks live in one process, so a rank's registered
//!   region (`SimNet::register`) is a range of real memory and an rkey names it. An RDMA op rides
//!   the pair's FIFO like a message (a WRITE then a SEND on one pair arrive in that order); when
//!   it arrives it checks that its rkey belongs to the target and covers the range with the
//!   right access, copies the bytes, and queues `RdmaDone` for the initiator. A failed check
//!   reports `RemoteAccess` and loses the connection (as RC does). Lkeys are not checked: the
//!   simulator cannot know the caller's local registrations. In `Auto` mode the initiator's own
//!   `poll` moves its pairs up to their last RDMA op (a one-sided op must not wait for the
//!   target's CPU); in `Manual` mode `step` moves them like messages. An op whose target was
//!   `silence`d fails with `PeerLost` and loses the peer for the initiator, as a probe does.
//! - Refused posts: `fail_rdma_posts` makes chosen `rdma` calls return `LinkError::Device`
//!   synchronously, as a verbs `ibv_post_send` error does: nothing is posted, no `RdmaDone`
//!   follows, the connection stays up (for tests of what the layers above do with a refusal in
//!   the middle of several posts).

use crate::net::{Link, LinkError, LinkEvent, Rank, RdmaKind, RdmaOp};
use crate::pin::Access;
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How in-flight messages arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Only `SimNet::step` delivers (deterministic from the seed).
    Manual,
    /// A rank's `poll` delivers what is in flight to it (real threads).
    Auto,
}

/// Shape of a simulated job.
#[derive(Debug, Clone, Copy)]
pub struct SimConfig {
    pub size: u32,
    /// Receive slots per peer (`Link::recv_slots`).
    pub slots: u32,
    pub max_msg: usize,
    pub seed: u64,
    pub delivery: Delivery,
}

impl SimConfig {
    pub fn new(size: u32, seed: u64, delivery: Delivery) -> Self {
        SimConfig {
            size,
            slots: 8,
            max_msg: 4096,
            seed,
            delivery,
        }
    }
}

/// The longest RDMA op the simulator accepts (as rxe's port maximum).
pub(crate) const SIM_MAX_RDMA: usize = 1 << 31;

/// Which `Link::rdma` posts the simulator refuses (`SimNet::fail_rdma_posts`). Posts are
/// numbered in the order they reach the simulator, on every rank together, counting only those
/// that would otherwise be accepted (arguments valid, connection up).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostFault {
    /// None is refused (the default).
    Off,
    /// The `n`-th post from now (0: the next one) is refused; the fault then turns `Off`.
    Nth(u64),
    /// Each post is refused with probability `1 / n`, drawn from a seeded RNG of its own (the
    /// delivery order of a seed is unchanged). `OneIn(0)` and `OneIn(1)` refuse every post.
    OneIn(u64),
}

enum Arrival {
    Msg {
        from: Rank,
        data: Vec<u8>,
    },
    Lost {
        peer: Rank,
    },
    RdmaDone {
        peer: Rank,
        token: u64,
        result: Result<(), LinkError>,
    },
}

/// What travels on a pair's FIFO.
enum Flight {
    Msg(Vec<u8>),
    /// An RDMA op; an inline WRITE carries its payload, copied when it was posted.
    Rdma(RdmaOp, Option<Payload>),
}

/// Payloads up to this long travel in the flight itself (no allocation per inline WRITE: the
/// simulator's cost is part of every profile of the layers above).
const SMALL_PAYLOAD: usize = 32;

/// An inline WRITE's payload, copied at post time.
enum Payload {
    Small([u8; SMALL_PAYLOAD]),
    Heap(Vec<u8>),
}

impl Payload {
    fn copy_of(b: &[u8]) -> Payload {
        if b.len() <= SMALL_PAYLOAD {
            let mut a = [0u8; SMALL_PAYLOAD];
            a[..b.len()].copy_from_slice(b);
            Payload::Small(a)
        } else {
            Payload::Heap(b.to_vec())
        }
    }

    fn as_ptr(&self) -> *const u8 {
        match self {
            Payload::Small(a) => a.as_ptr(),
            Payload::Heap(v) => v.as_ptr(),
        }
    }
}

/// A registered range of a rank's memory.
#[derive(Debug, Clone, Copy)]
struct Region {
    rank: Rank,
    addr: u64,
    len: usize,
    access: Access,
    /// A memory window: only ops from this peer may use the key.
    only_from: Option<Rank>,
}

impl Region {
    fn allows(&self, target: Rank, from: Rank, op: &RdmaOp) -> bool {
        let want = match op.kind {
            RdmaKind::Write => Access::REMOTE_WRITE,
            RdmaKind::Read => Access::REMOTE_READ,
        };
        let Some(end) = self.addr.checked_add(self.len as u64) else {
            return false;
        };
        self.rank == target
            && self.only_from.map_or(true, |f| f == from)
            && self.access.0 & want.0 == want.0
            && op.remote_addr >= self.addr
            && op
                .remote_addr
                .checked_add(op.len as u64)
                .is_some_and(|e| e <= end)
    }
}

struct State {
    rng: fastrand::Rng,
    /// In flight, by pair `from * size + to`.
    flights: Vec<VecDeque<Flight>>,
    /// RDMA ops among a pair's flights, and among all flights from a rank.
    rdma_in_pair: Vec<usize>,
    rdma_from: Vec<usize>,
    /// Registered regions, indexed by rkey - 1 (rkeys are handed out in order and never
    /// reused; a deregistered one is `None`).
    regions: Vec<Option<Region>>,
    /// Threads sleeping in `SimLink::wait` (notified only when some are: a notify is a system
    /// call even with nobody to wake).
    waiters: usize,
    next_rkey: u32,
    /// Pairs with something in flight (for an O(1) random pick), and each pair's place in it.
    active: Vec<usize>,
    active_pos: Vec<Option<usize>>,
    in_flight_to: Vec<usize>,
    /// Arrived, not yet handed to `poll`, per receiver.
    inbox: Vec<VecDeque<Arrival>>,
    /// Slots in use, by `to * size + from`.
    occupied: Vec<u32>,
    /// Connection gone, by pair (both directions set together).
    lost: Vec<bool>,
    silent: Vec<bool>,
    overruns: u64,
    delivered: u64,
    rdma_done: u64,
    /// RDMA ops each rank posted (accepted by `rdma`), for `Link::signaled_posts`.
    rdma_posted: Vec<u64>,
    post_fault: PostFault,
    fault_rng: fastrand::Rng,
    /// Posts refused by `post_fault` so far.
    posts_refused: u64,
}

struct Shared {
    cfg: SimConfig,
    state: Mutex<State>,
    arrived: Condvar,
    /// Per rank: held by the one `poll` handing out its arrivals (see `SimLink::poll`).
    handing_out: Vec<Mutex<()>>,
    /// `Link::max_inline_write` of every rank's link (`SimNet::set_max_inline_write`).
    max_inline: std::sync::atomic::AtomicUsize,
    /// Per rank: a stand-in for a verbs link's registered receive ring (`Link::own_buffers`:
    /// memory the link owns, which peers must never reach). Messages are not staged in it.
    rings: Vec<Box<[u8]>>,
}

/// The simulated network; hands out one `SimLink` per rank.
#[derive(Clone)]
pub struct SimNet {
    sh: Arc<Shared>,
}

/// One rank's view of a `SimNet`.
pub struct SimLink {
    sh: Arc<Shared>,
    rank: Rank,
}

impl State {
    fn region(&self, rkey: u32) -> Option<&Region> {
        self.regions.get((rkey as usize).wrapping_sub(1))?.as_ref()
    }

    /// Wakes the threads in `SimLink::wait`, if any (called with the state locked, as `wait`
    /// counts itself in and out under it: no wake-up is lost).
    fn notify(&self, cv: &Condvar) {
        if self.waiters > 0 {
            cv.notify_all();
        }
    }

    /// Whether `post_fault` refuses the post being made (counted if so).
    fn refuse_post(&mut self) -> bool {
        let refuse = match self.post_fault {
            PostFault::Off => false,
            PostFault::Nth(0) => {
                self.post_fault = PostFault::Off;
                true
            }
            PostFault::Nth(n) => {
                self.post_fault = PostFault::Nth(n - 1);
                false
            }
            PostFault::OneIn(n) => self.fault_rng.u64(..n.max(1)) == 0,
        };
        self.posts_refused += u64::from(refuse);
        refuse
    }

    fn push_flight(&mut self, pair: usize, from: Rank, to: Rank, f: Flight) {
        if self.active_pos[pair].is_none() {
            self.active_pos[pair] = Some(self.active.len());
            self.active.push(pair);
        }
        if matches!(f, Flight::Rdma(..)) {
            self.rdma_in_pair[pair] += 1;
            self.rdma_from[from as usize] += 1;
        }
        self.flights[pair].push_back(f);
        self.in_flight_to[to as usize] += 1;
    }

    /// Takes the oldest flight of `pair` off the wire.
    fn pop_flight(&mut self, pair: usize, from: Rank, to: Rank) -> Option<Flight> {
        let data = self.flights[pair].pop_front()?;
        self.in_flight_to[to as usize] -= 1;
        if matches!(data, Flight::Rdma(..)) {
            self.rdma_in_pair[pair] -= 1;
            self.rdma_from[from as usize] -= 1;
        }
        if self.flights[pair].is_empty() {
            let pos = self.active_pos[pair].take().unwrap();
            self.active.swap_remove(pos);
            if let Some(&moved) = self.active.get(pos) {
                self.active_pos[moved] = Some(pos);
            }
        }
        Some(data)
    }

    /// Empties `pair`; its RDMA ops are reported failed (`PeerLost`) to their initiator. Returns
    /// whether there were any.
    fn clear_pair(&mut self, pair: usize, from: Rank, to: Rank) -> bool {
        let mut any = false;
        while let Some(f) = self.pop_flight(pair, from, to) {
            if let Flight::Rdma(op, _) = f {
                any = true;
                self.rdma_done += 1;
                self.inbox[from as usize].push_back(Arrival::RdmaDone {
                    peer: to,
                    token: op.token,
                    result: Err(LinkError::PeerLost(to)),
                });
            }
        }
        any
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A test thread that panicked while holding the lock must not hide its own panic behind
        // poison errors everywhere else.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Puts the oldest message of `pair` into its receiver's slots, counting an overrun if the
    /// sender had no free slot there; or executes the oldest RDMA op.
    fn arrive(&self, st: &mut State, pair: usize) {
        let n = self.cfg.size as usize;
        let (from, to) = ((pair / n) as Rank, (pair % n) as Rank);
        let data = match st.pop_flight(pair, from, to) {
            None => return,
            Some(Flight::Rdma(op, inline)) => return self.execute(st, from, to, op, inline),
            Some(Flight::Msg(data)) => data,
        };
        let occ = &mut st.occupied[to as usize * n + from as usize];
        if *occ >= self.cfg.slots {
            st.overruns += 1;
        }
        *occ += 1;
        st.delivered += 1;
        st.inbox[to as usize].push_back(Arrival::Msg { from, data });
        st.notify(&self.arrived);
    }

    /// The RDMA op `from` posted to `to` reaches `to`: check the key, copy, report to `from`.
    fn execute(&self, st: &mut State, from: Rank, to: Rank, op: RdmaOp, inline: Option<Payload>) {
        st.rdma_done += 1;
        let done = |result| Arrival::RdmaDone {
            peer: to,
            token: op.token,
            result,
        };
        if st.silent[to as usize] {
            // Nobody answers: the initiator's retries run out (RETRY_EXC_ERR on RC).
            st.inbox[from as usize].push_back(done(Err(LinkError::PeerLost(to))));
            self.lose(st, from, to, true, false);
            return;
        }
        let ok = st
            .region(op.rkey)
            .is_some_and(|r: &Region| r.allows(to, from, &op));
        if !ok {
            st.inbox[from as usize].push_back(done(Err(LinkError::RemoteAccess(to))));
            self.lose(st, from, to, true, true);
            return;
        }
        let (src, dst) = match (op.kind, &inline) {
            (RdmaKind::Write, Some(payload)) => (payload.as_ptr() as u64, op.remote_addr),
            (RdmaKind::Write, None) => (op.local_addr, op.remote_addr),
            (RdmaKind::Read, _) => (op.remote_addr, op.local_addr),
        };
        // SAFETY: the remote range lies inside a region its rank registered (`register`'s
        // contract: valid for reads and writes until deregistered); the local range is valid by
        // `Link::rdma`'s contract. `copy` allows the two to overlap (a test may point both at
        // one buffer); the lock serialises every simulated DMA.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, op.len) };
        st.inbox[from as usize].push_back(done(Ok(())));
        st.notify(&self.arrived);
    }

    /// Marks the pair lost and tells each still-living end once (after failing the RDMA ops
    /// either end still had in flight on it).
    fn lose(&self, st: &mut State, a: Rank, b: Rank, tell_a: bool, tell_b: bool) {
        let n = self.cfg.size as usize;
        let (ab, ba) = (a as usize * n + b as usize, b as usize * n + a as usize);
        if st.lost[ab] {
            return;
        }
        st.lost[ab] = true;
        st.lost[ba] = true;
        st.clear_pair(ab, a, b);
        st.clear_pair(ba, b, a);
        if tell_a {
            st.inbox[a as usize].push_back(Arrival::Lost { peer: b });
        }
        if tell_b && a != b {
            st.inbox[b as usize].push_back(Arrival::Lost { peer: a });
        }
        st.notify(&self.arrived);
    }
}

impl SimNet {
    pub fn new(cfg: SimConfig) -> SimNet {
        assert!(cfg.size > 0 && cfg.slots > 0);
        let n = cfg.size as usize;
        let st = State {
            rng: fastrand::Rng::with_seed(cfg.seed),
            flights: (0..n * n).map(|_| VecDeque::new()).collect(),
            rdma_in_pair: vec![0; n * n],
            rdma_from: vec![0; n],
            regions: Vec::new(),
            waiters: 0,
            next_rkey: 1,
            active: Vec::new(),
            active_pos: vec![None; n * n],
            in_flight_to: vec![0; n],
            inbox: (0..n).map(|_| VecDeque::new()).collect(),
            occupied: vec![0; n * n],
            lost: vec![false; n * n],
            silent: vec![false; n],
            overruns: 0,
            delivered: 0,
            rdma_done: 0,
            rdma_posted: vec![0; n],
            post_fault: PostFault::Off,
            fault_rng: fastrand::Rng::with_seed(cfg.seed ^ 0x5EED_FA17),
            posts_refused: 0,
        };
        SimNet {
            sh: Arc::new(Shared {
                cfg,
                state: Mutex::new(st),
                arrived: Condvar::new(),
                handing_out: (0..n).map(|_| Mutex::new(())).collect(),
                max_inline: std::sync::atomic::AtomicUsize::new(0),
                rings: (0..n)
                    .map(|_| vec![0u8; 4 << 10].into_boxed_slice())
                    .collect(),
            }),
        }
    }

    pub fn size(&self) -> u32 {
        self.sh.cfg.size
    }

    /// The link of `rank`.
    pub fn link(&self, rank: Rank) -> Arc<SimLink> {
        assert!(rank < self.sh.cfg.size);
        Arc::new(SimLink {
            sh: self.sh.clone(),
            rank,
        })
    }

    /// WRITEs of at most `n` bytes become inline on every rank's link (`Link::max_inline_write`:
    /// the payload is copied when posted); 0, the default: none.
    pub fn set_max_inline_write(&self, n: usize) {
        self.sh
            .max_inline
            .store(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// Delivers one in-flight message, of a pair the RNG picks. False if nothing is in flight.
    pub fn step(&self) -> bool {
        let mut st = self.sh.lock();
        if st.active.is_empty() {
            return false;
        }
        let len = st.active.len();
        let pick = st.rng.usize(..len);
        let pair = st.active[pick];
        self.sh.arrive(&mut st, pair);
        true
    }

    /// Up to `max` steps; returns how many delivered something.
    pub fn steps(&self, max: usize) -> usize {
        (0..max).take_while(|_| self.step()).count()
    }

    /// Messages on the wire (sent, not yet arrived).
    pub fn in_flight(&self) -> usize {
        self.sh.lock().in_flight_to.iter().sum()
    }

    /// Messages that arrived with no free slot for their sender: a flow-control bug above.
    pub fn overruns(&self) -> u64 {
        self.sh.lock().overruns
    }

    /// Messages delivered into receive slots so far.
    pub fn delivered(&self) -> u64 {
        self.sh.lock().delivered
    }

    /// RDMA ops executed or failed so far (each accepted op counts once).
    pub fn rdma_done(&self) -> u64 {
        self.sh.lock().rdma_done
    }

    /// RDMA ops `rank` posted whose `RdmaDone` its `poll` has not handed out yet (on the wire,
    /// or arrived and waiting in its inbox). A layer above that reports an op done while this is
    /// non-zero (and no poll of `rank` runs) ended it before its last completion.
    pub fn rdma_unreported(&self, rank: Rank) -> usize {
        let st = self.sh.lock();
        let done = st.inbox[rank as usize]
            .iter()
            .filter(|a| matches!(a, Arrival::RdmaDone { .. }))
            .count();
        st.rdma_from[rank as usize] + done
    }

    /// From now on, refuse the `rdma` posts `fault` picks (replacing the previous choice):
    /// `rdma` returns `LinkError::Device` with nothing posted, and no `RdmaDone` ever comes for
    /// it, as when a verbs `ibv_post_send` fails; the connection stays up. For tests.
    pub fn fail_rdma_posts(&self, fault: PostFault) {
        self.sh.lock().post_fault = fault;
    }

    /// `rdma` posts refused by `fail_rdma_posts` so far.
    pub fn posts_refused(&self) -> u64 {
        self.sh.lock().posts_refused
    }

    /// Registers `[addr, addr + len)` of `rank`'s memory for remote read and write; returns its
    /// rkey (never 0, never reused).
    ///
    /// # Safety
    /// The range must stay valid for reads and writes until `deregister` (the simulator copies
    /// into and out of it from any thread's `poll` or `step`), and nobody may hold a Rust
    /// reference to bytes of it while an RDMA op to them may run.
    pub unsafe fn register(&self, rank: Rank, addr: u64, len: usize) -> u32 {
        // SAFETY: forwarded contract.
        unsafe { self.register_access(rank, addr, len, Access::REMOTE) }
    }

    /// `register` with explicit rights: WRITEs need `REMOTE_WRITE`, READs `REMOTE_READ`.
    ///
    /// # Safety
    /// As `register`.
    pub unsafe fn register_access(&self, rank: Rank, addr: u64, len: usize, access: Access) -> u32 {
        // SAFETY: forwarded contract.
        unsafe { self.register_region(rank, addr, len, access, None) }
    }

    /// A memory window of `rank`'s memory for `peer` alone: ops from any other rank naming its
    /// key fail with `RemoteAccess`, as with a type 2 window bound through `peer`'s queue pair.
    /// `deregister` kills it.
    ///
    /// # Safety
    /// As `register`.
    pub(crate) unsafe fn bind_window(
        &self,
        rank: Rank,
        peer: Rank,
        addr: u64,
        len: usize,
        access: Access,
    ) -> u32 {
        // SAFETY: forwarded contract.
        unsafe { self.register_region(rank, addr, len, access, Some(peer)) }
    }

    /// # Safety
    /// As `register`.
    unsafe fn register_region(
        &self,
        rank: Rank,
        addr: u64,
        len: usize,
        access: Access,
        only_from: Option<Rank>,
    ) -> u32 {
        assert!(rank < self.sh.cfg.size);
        let mut st = self.sh.lock();
        let rkey = st.next_rkey;
        st.next_rkey = st
            .next_rkey
            .checked_add(1)
            .expect("2^32 simulated registrations");
        debug_assert_eq!(st.regions.len() + 1, rkey as usize);
        st.regions.push(Some(Region {
            rank,
            addr,
            len,
            access,
            only_from,
        }));
        rkey
    }

    /// Forgets a region: later ops naming `rkey` fail with `RemoteAccess`. False if unknown.
    pub fn deregister(&self, rkey: u32) -> bool {
        let mut st = self.sh.lock();
        let i = (rkey as usize).wrapping_sub(1);
        st.regions.get_mut(i).and_then(Option::take).is_some()
    }

    /// The connection between `a` and `b` breaks: both get `PeerLost`, in-flight messages
    /// between them vanish (RDMA ops fail first), later sends either way fail.
    pub fn drop_connection(&self, a: Rank, b: Rank) {
        let mut st = self.sh.lock();
        self.sh.lose(&mut st, a, b, true, true);
    }

    /// `r` dies without anyone being told: what it had in flight vanishes, what is sent to it is
    /// swallowed, it sends nothing. A `probe` of it reports the loss to the prober.
    pub fn silence(&self, r: Rank) {
        let mut st = self.sh.lock();
        st.silent[r as usize] = true;
        let n = self.sh.cfg.size;
        for p in 0..n {
            st.clear_pair((r * n + p) as usize, r, p);
            // RDMA ops to `r` time out: each initiator learns of the loss (probe semantics).
            if st.clear_pair((p * n + r) as usize, p, r) {
                self.sh.lose(&mut st, p, r, true, false);
            }
        }
    }

    /// Puts raw bytes on the wire from `from` to `to`, as if `from`'s link had sent them (they
    /// take a slot like any message).
    pub fn inject(&self, from: Rank, to: Rank, bytes: &[u8]) {
        let n = self.sh.cfg.size;
        let mut st = self.sh.lock();
        st.push_flight(
            (from * n + to) as usize,
            from,
            to,
            Flight::Msg(bytes.to_vec()),
        );
        st.notify(&self.sh.arrived);
    }
}

impl Link for SimLink {
    fn rank(&self) -> Rank {
        self.rank
    }
    fn size(&self) -> u32 {
        self.sh.cfg.size
    }
    fn max_msg(&self) -> usize {
        self.sh.cfg.max_msg
    }
    fn recv_slots(&self) -> u32 {
        self.sh.cfg.slots
    }

    fn send(&self, peer: Rank, msg: &[u8]) -> Result<(), LinkError> {
        let n = self.sh.cfg.size;
        if peer >= n || peer == self.rank {
            return Err(LinkError::BadRank(peer));
        }
        if msg.len() > self.sh.cfg.max_msg {
            return Err(LinkError::TooLong {
                len: msg.len(),
                max: self.sh.cfg.max_msg,
            });
        }
        let mut st = self.sh.lock();
        let pair = (self.rank * n + peer) as usize;
        if st.lost[pair] {
            return Err(LinkError::PeerLost(peer));
        }
        if st.silent[self.rank as usize] || st.silent[peer as usize] {
            return Ok(()); // swallowed: nobody notices until a probe
        }
        st.push_flight(pair, self.rank, peer, Flight::Msg(msg.to_vec()));
        st.notify(&self.sh.arrived);
        Ok(())
    }

    fn poll(&self, on_event: &mut dyn FnMut(LinkEvent<'_>)) -> Result<usize, LinkError> {
        let n = self.sh.cfg.size as usize;
        let me = self.rank as usize;
        let mut st = self.sh.lock();
        if st.silent[me] {
            return Ok(0);
        }
        if self.sh.cfg.delivery == Delivery::Auto {
            // Everything in flight to us arrives, senders interleaved at random.
            while st.in_flight_to[me] > 0 {
                let senders = (0..n)
                    .filter(|&f| !st.flights[f * n + me].is_empty())
                    .count();
                let mut k = st.rng.usize(..senders);
                let from = (0..n)
                    .filter(|&f| !st.flights[f * n + me].is_empty())
                    .find(|_| {
                        k = k.wrapping_sub(1);
                        k == usize::MAX
                    })
                    .unwrap();
                self.sh.arrive(&mut st, from * n + me);
            }
            // Our RDMA ops run without the targets' help: move each of our pairs up to its last
            // RDMA op (the messages ahead of one arrive first, keeping the pair's order).
            if st.rdma_from[me] > 0 {
                for to in 0..n {
                    while st.rdma_in_pair[me * n + to] > 0 {
                        self.sh.arrive(&mut st, me * n + to);
                    }
                }
            }
        }
        // One poller at a time hands out a rank's arrivals, as verbs serialises its receive
        // polls: two threads each running the callback of one of two messages from the same
        // peer could otherwise run them out of order, and the layers above rely on per-pair
        // FIFO up to their handlers (Firehose's messages). A concurrent poll (or a nested one
        // from a callback) finds it taken and hands out nothing.
        if st.inbox[me].is_empty() {
            return Ok(0);
        }
        let _handing_out = match self.sh.handing_out[me].try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Ok(0),
        };
        // Hand out what arrived (bounded, so one poll cannot starve its caller), with the lock
        // released around each callback: a handler may send. After the last arrival there was
        // (and unless a slot must be posted again) the lock is not taken back: what arrives
        // meanwhile is the next poll's.
        let mut count = 0;
        let mut st = Some(st);
        while count < 64 {
            let g = match st.as_mut() {
                Some(g) => g,
                None => st.insert(self.sh.lock()),
            };
            let Some(a) = g.inbox[me].pop_front() else {
                break;
            };
            let last = g.inbox[me].is_empty();
            st = None;
            match &a {
                Arrival::Msg { from, data } => on_event(LinkEvent::Recv { peer: *from, data }),
                Arrival::Lost { peer } => on_event(LinkEvent::PeerLost {
                    peer: *peer,
                    reason: LinkError::PeerLost(*peer),
                }),
                Arrival::RdmaDone {
                    peer,
                    token,
                    result,
                } => on_event(LinkEvent::RdmaDone {
                    peer: *peer,
                    token: *token,
                    result: result.clone(),
                }),
            }
            if let Arrival::Msg { from, .. } = a {
                // The slot is posted again only now that the callback returned.
                st.insert(self.sh.lock()).occupied[me * n + from as usize] -= 1;
            }
            count += 1;
            if last {
                break;
            }
        }
        Ok(count)
    }

    fn wait(&self, timeout: Duration) -> Result<(), LinkError> {
        let me = self.rank as usize;
        let deadline = Instant::now() + timeout;
        let auto = self.sh.cfg.delivery == Delivery::Auto;
        let mut st = self.sh.lock();
        loop {
            if !st.inbox[me].is_empty()
                || (auto && (st.in_flight_to[me] > 0 || st.rdma_from[me] > 0))
            {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(());
            }
            st.waiters += 1;
            st = self
                .sh
                .arrived
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            st.waiters -= 1;
        }
    }

    fn probe(&self, peer: Rank) -> Result<(), LinkError> {
        if peer >= self.sh.cfg.size || peer == self.rank {
            return Err(LinkError::BadRank(peer));
        }
        let mut st = self.sh.lock();
        if st.silent[peer as usize] {
            // The one-sided write times out: only the prober learns of it.
            self.sh.lose(&mut st, self.rank, peer, true, false);
        }
        Ok(())
    }

    fn max_rdma(&self) -> usize {
        SIM_MAX_RDMA
    }

    fn max_inline_write(&self) -> usize {
        self.sh
            .max_inline
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn own_buffers(&self) -> Vec<(u64, usize)> {
        let r = &self.sh.rings[self.rank as usize];
        vec![(r.as_ptr() as u64, r.len())]
    }

    unsafe fn rdma(&self, peer: Rank, op: RdmaOp) -> Result<(), LinkError> {
        let n = self.sh.cfg.size;
        if peer >= n || peer == self.rank {
            return Err(LinkError::BadRank(peer));
        }
        op.validate(SIM_MAX_RDMA)?;
        let mut st = self.sh.lock();
        let pair = (self.rank * n + peer) as usize;
        if st.lost[pair] {
            return Err(LinkError::PeerLost(peer));
        }
        if st.refuse_post() {
            return Err(LinkError::Device("simulated post failure".into()));
        }
        if st.silent[self.rank as usize] {
            return Ok(()); // a dead rank's calls go nowhere (it never polls again)
        }
        let inline = (op.kind == RdmaKind::Write && op.len <= self.max_inline_write()).then(|| {
            // SAFETY: `Link::rdma`'s contract: an inline WRITE's local range is readable for
            // the call (copied now, as a verbs provider copies it into the WQE).
            Payload::copy_of(unsafe {
                std::slice::from_raw_parts(op.local_addr as *const u8, op.len)
            })
        });
        st.push_flight(pair, self.rank, peer, Flight::Rdma(op, inline));
        st.rdma_posted[self.rank as usize] += 1;
        st.notify(&self.sh.arrived);
        Ok(())
    }

    fn signaled_posts(&self) -> u64 {
        self.sh.lock().rdma_posted[self.rank as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(l: &SimLink) -> Vec<(Rank, Vec<u8>)> {
        let mut out = Vec::new();
        l.poll(&mut |e| match e {
            LinkEvent::Recv { peer, data } => out.push((peer, data.to_vec())),
            LinkEvent::PeerLost { peer, .. } => out.push((peer, b"LOST".to_vec())),
            LinkEvent::RdmaDone { peer, token, .. } => {
                out.push((peer, token.to_le_bytes().to_vec()))
            }
        })
        .unwrap();
        out
    }

    #[test]
    fn send_batch_keeps_order_and_rejects_a_long_message_before_sending() {
        let net = SimNet::new(SimConfig::new(2, 7, Delivery::Auto));
        let (a, b) = (net.link(0), net.link(1));
        let long = vec![0u8; a.max_msg() + 1];
        assert!(matches!(
            a.send_batch(1, &[b"x", &long]),
            Err(LinkError::TooLong { .. })
        ));
        assert_eq!(
            net.in_flight(),
            0,
            "nothing sent when one message is too long"
        );
        a.send_batch(1, &[b"1", b"2", b"3"]).unwrap();
        let got: Vec<_> = drain(&b).into_iter().map(|(_, d)| d).collect();
        assert_eq!(got, [b"1".to_vec(), b"2".to_vec(), b"3".to_vec()]);
    }

    #[test]
    fn per_pair_fifo_random_across_pairs_and_deterministic() {
        let run = |seed| {
            let net = SimNet::new(SimConfig {
                slots: 100,
                ..SimConfig::new(3, seed, Delivery::Manual)
            });
            let (l0, l1, l2) = (net.link(0), net.link(1), net.link(2));
            for i in 0..20u8 {
                l0.send(2, &[0, i]).unwrap();
                l1.send(2, &[1, i]).unwrap();
            }
            assert!(drain(&l2).is_empty(), "manual: nothing arrives before step");
            assert_eq!(net.steps(1000), 40);
            let got = drain(&l2);
            for from in [0u8, 1] {
                let seq: Vec<u8> = got
                    .iter()
                    .filter(|m| m.1[0] == from)
                    .map(|m| m.1[1])
                    .collect();
                assert_eq!(seq, (0..20).collect::<Vec<_>>());
            }
            got
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8), "another seed interleaves differently");
    }

    #[test]
    fn counts_overruns_and_frees_slots_after_the_callback() {
        let net = SimNet::new(SimConfig {
            slots: 2,
            ..SimConfig::new(2, 1, Delivery::Auto)
        });
        let (l0, l1) = (net.link(0), net.link(1));
        l0.send(1, b"a").unwrap();
        l0.send(1, b"b").unwrap();
        assert_eq!(drain(&l1).len(), 2);
        assert_eq!(net.overruns(), 0);
        for _ in 0..3 {
            l0.send(1, b"c").unwrap();
        }
        l1.poll(&mut |_| {}).unwrap();
        assert_eq!(net.overruns(), 1);
    }

    #[test]
    fn drop_and_silence() {
        let net = SimNet::new(SimConfig::new(3, 1, Delivery::Auto));
        let (l0, l1, l2) = (net.link(0), net.link(1), net.link(2));
        net.drop_connection(0, 1);
        assert_eq!(drain(&l0), vec![(1, b"LOST".to_vec())]);
        assert_eq!(drain(&l1), vec![(0, b"LOST".to_vec())]);
        assert_eq!(l0.send(1, b"x"), Err(LinkError::PeerLost(1)));
        l0.send(2, b"ok").unwrap();
        assert_eq!(drain(&l2), vec![(0, b"ok".to_vec())]);
        net.silence(2);
        l0.send(2, b"gone").unwrap();
        assert!(drain(&l0).is_empty());
        l0.probe(2).unwrap();
        assert_eq!(drain(&l0), vec![(2, b"LOST".to_vec())]);
        l0.probe(2).unwrap();
        assert!(drain(&l0).is_empty(), "reported once");
    }

    #[test]
    fn wait_wakes_on_send() {
        let net = SimNet::new(SimConfig::new(2, 1, Delivery::Auto));
        let (l0, l1) = (net.link(0), net.link(1));
        let t = std::thread::spawn(move || {
            let t0 = Instant::now();
            l1.wait(Duration::from_secs(10)).unwrap();
            t0.elapsed()
        });
        std::thread::sleep(Duration::from_millis(20));
        l0.send(1, b"x").unwrap();
        assert!(t.join().unwrap() < Duration::from_secs(5));
    }
}
