//! A chunk of a put or get spans several remote regions (one RDMA per *segment*, each with its
//! region's rkey); what if one segment fails while the others run? Over the simulated link,
//! with the whole driver (`rma::Rma`), regions of one bucket (so an op of k buckets is k
//! segments, checked through `rdma_posted`), and two ways for a segment to fail:
//!
//! - its post is refused synchronously (`SimNet::fail_rdma_posts`: `Link::rdma` returns
//!   `LinkError::Device`, as a failing `ibv_post_send`; nothing is posted for it, the connection
//!   stays up, the segments before it are posted and those after it still are);
//! - it is posted and completes with an error (its region's rkey forgotten at the target:
//!   `RemoteAccess`, which loses the connection as RC does; the segments after it are flushed
//!   with `PeerLost`), while the segments before it succeed.
//!
//! Either way the request completes exactly once with `PeerLost` (what `link_status`
//! makes of every link error but the argument ones, and what `fh_put`/`fh_get` document for a
//! broken transfer), never with success; the segments that did run moved their bytes and the
//! failed one moved none; every firehose reference and the local registration are released
//! exactly once (`Rma::check_idle`, the cache's `in_use`); no wait hangs (each is bounded); and
//! the same `Rma` keeps working afterwards. For puts and gets; blocking (`wait`), handle
//! (`test` until done) and implicit (`quiet`); on the hit path (posted from `start`) and the
//! miss path (posted from the `Ready` event); the failure on the first, a middle and the last
//! segment, and in a later chunk of a long request. Then 16 threads on 4 ranks with random
//! refused posts: every op is a success with the right bytes or `PeerLost`, and
//! nothing is leaked at the end.

use firehose::cache::{Cache, Limits};
use firehose::net::settings::NetSettings;
use firehose::net::sim::{Delivery, PostFault, SimConfig, SimNet};
use firehose::net::{Link, Peers, Rank, RdmaKind};
use firehose::pin::null::NullPinner;
use firehose::rma::sim_pins::SimPins;
use firehose::rma::Rma;
use firehose::rma::RmaError;
use firehose_proto::{FirehoseConfig, PinFailure, RegionPins};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

#[path = "common/sim_mem.rs"]
#[allow(dead_code)]
mod sim_mem;
use sim_mem::{Buf, Rng};

const BUCKET: usize = 4096;
/// Buckets (= regions, = segments) of one test op.
const SEGS: usize = 4;
/// Firehoses per peer: the longest chunk is `FH_PER_PEER - 1` buckets.
const FH_PER_PEER: usize = 32;
const MAX_CHUNK_BUCKETS: usize = FH_PER_PEER - 1;
/// Every wait of a test is bounded by this: a hang is a failure, not a test that never ends.
const TIMEOUT: Duration = Duration::from_secs(30);
/// What a failed segment makes of its request (`link_status`: `Device`, `RemoteAccess` and
/// `PeerLost` alike).
const SEG_FAILED: RmaError = RmaError::PeerLost;

fn config(rank: Rank, size: u32) -> FirehoseConfig {
    let mut c = FirehoseConfig::new(rank, size);
    c.bucket_size = BUCKET;
    c.m_bytes = FH_PER_PEER * BUCKET * (size as usize - 1);
    c.max_victim_bytes = 16 * BUCKET;
    // One bucket per region: an op of k aligned buckets spans k regions, k rkeys, k segments.
    c.max_region_buckets = 1;
    c
}

/// What a target rank has pinned for its peers, shared with the test.
#[derive(Default)]
struct PinLog {
    /// Live regions: rkey -> (address, length).
    live: HashMap<u32, (u64, usize)>,
    bytes: u64,
    peak: u64,
    unknown_unpins: u64,
}

/// `SimPins` that logs its regions (the test looks up a region's rkey to forget it) and checks
/// Firehose's bound (pinned bytes <= M + MAXVICTIM) at every pin.
struct Logged {
    inner: SimPins,
    log: Arc<Mutex<PinLog>>,
    bound: u64,
}

impl RegionPins for Logged {
    fn pin(
        &mut self,
        addr: u64,
        len: usize,
        rights: firehose_proto::Rights,
    ) -> Result<u32, PinFailure> {
        let rkey = self.inner.pin(addr, len, rights)?;
        let mut l = self.log.lock().unwrap();
        l.live.insert(rkey, (addr, len));
        l.bytes = self.inner.bytes();
        l.peak = l.peak.max(l.bytes);
        assert!(l.bytes <= self.bound, "pinned {} > {}", l.bytes, self.bound);
        Ok(rkey)
    }
    fn unpin(&mut self, addr: u64, len: usize, rkey: u32) {
        self.inner.unpin(addr, len, rkey);
        let mut l = self.log.lock().unwrap();
        l.live.remove(&rkey);
        l.bytes = self.inner.bytes();
        l.unknown_unpins = self.inner.unknown_unpins();
    }
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), PinFailure> {
        self.inner.write(addr, data)
    }
}

struct Job {
    net: SimNet,
    rmas: Vec<Arc<Rma>>,
    caches: Vec<Arc<Cache>>,
    pins: Vec<Arc<Mutex<PinLog>>>,
    bufs: Vec<Buf>,
    /// Bucket-aligned start of each rank's buffer.
    bases: Vec<u64>,
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng::new(seed);
    (0..len).map(|_| r.next() as u8).collect()
}

/// `size` ranks over one simulated network, each with a buffer of `buckets` aligned buckets
/// filled with a pattern of its own.
fn job(size: u32, buckets: usize, seed: u64, inline: usize) -> Job {
    let mut sc = SimConfig::new(size, seed, Delivery::Auto);
    sc.slots = NetSettings::default().recv_depth;
    let net = SimNet::new(sc);
    net.set_max_inline_write(inline);
    let c0 = config(0, size);
    let bound = (c0.m_bytes + c0.max_victim_bytes) as u64;
    let unbounded = Limits {
        max_pinned: usize::MAX,
        max_regions: usize::MAX,
    };
    let (mut rmas, mut caches, mut pins) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..size {
        let link: Arc<dyn Link> = net.link(r);
        let peers = Arc::new(Peers::from_link(link, NetSettings::default()).unwrap());
        let cache = Cache::new(Arc::new(NullPinner), unbounded, None);
        let log = Arc::new(Mutex::new(PinLog::default()));
        let p = Logged {
            inner: SimPins::new(net.clone(), r),
            log: log.clone(),
            bound,
        };
        let rma = Rma::with_pins(peers, Some(cache.clone()), config(r, size), Box::new(p))
            .expect("rma over the simulator");
        rmas.push(rma);
        caches.push(cache);
        pins.push(log);
    }
    let bufs: Vec<Buf> = (0..size)
        .map(|_| Buf::new((buckets + 1) * BUCKET, 0))
        .collect();
    let bases = bufs
        .iter()
        .enumerate()
        .map(|(r, b)| {
            let base = b.addr().next_multiple_of(BUCKET as u64);
            // SAFETY: no op runs yet; inside the buffer (one spare bucket for the alignment).
            unsafe {
                b.write(
                    (base - b.addr()) as usize,
                    &pattern(r as u64, buckets * BUCKET),
                )
            };
            base
        })
        .collect();
    Job {
        net,
        rmas,
        caches,
        pins,
        bufs,
        bases,
    }
}

impl Job {
    /// `len` bytes of rank `r`'s buffer at `addr`.
    ///
    /// # Safety
    /// No op to those bytes runs.
    unsafe fn remote(&self, r: usize, addr: u64, len: usize) -> Vec<u8> {
        let off = (addr - self.bufs[r].addr()) as usize;
        // SAFETY: forwarded contract.
        unsafe { self.bufs[r].bytes()[off..off + len].to_vec() }
    }

    /// Threads that progress ranks `1..` (the targets answer moves) until the guard drops.
    fn serve(&self) -> Servers {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = self.rmas[1..]
            .iter()
            .map(|rma| {
                let (rma, stop) = (rma.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(SeqCst) {
                        rma.progress().unwrap();
                        std::thread::yield_now();
                    }
                })
            })
            .collect();
        Servers { stop, threads }
    }

    /// Nothing of past ops is left on any rank (every request done), nothing was released
    /// twice, no local registration is in use, no target unpinned a region it did not hold.
    fn check_no_leak(&self) {
        for (r, rma) in self.rmas.iter().enumerate() {
            // A target may still be handling the last release messages: let it settle.
            let t0 = Instant::now();
            while let Err(e) = rma.check_idle() {
                assert!(t0.elapsed() < TIMEOUT, "rank {r}: {e}");
                rma.progress().unwrap();
                std::thread::yield_now();
            }
            assert_eq!(
                self.caches[r].stats().in_use,
                0,
                "rank {r}: registrations in use"
            );
            assert_eq!(self.pins[r].lock().unwrap().unknown_unpins, 0, "rank {r}");
            assert_eq!(rma.stats().rejected, 0, "rank {r}: rejected messages");
        }
        assert_eq!(self.net.overruns(), 0);
    }
}

struct Servers {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// How the caller learns the result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `wait` (what `fh_put`/`fh_get` do).
    Blocking,
    /// `test` until done (`fh_put_nb` + `fh_test`).
    Handle,
    /// No handle; `quiet` reports it (`fh_put_nb` with `out` NULL + `fh_quiet`).
    Implicit,
}

/// Runs `f` on its own thread; panics if it does not return within `TIMEOUT`.
fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(TIMEOUT)
        .unwrap_or_else(|_| panic!("{what}: no result in {TIMEOUT:?} (hang)"))
}

/// One op from rank 0, its result learned as `mode` says, with every wait bounded. Also
/// checks it completes exactly once: a spent handle is unknown, a second `quiet` is clean.
///
/// # Safety
/// `local` is valid for `len` bytes and left alone until this returns.
unsafe fn op(
    j: &Job,
    kind: RdmaKind,
    peer: Rank,
    raddr: u64,
    local: *mut u8,
    len: usize,
    mode: Mode,
) -> Result<(), RmaError> {
    let rma = &j.rmas[0];
    let implicit = mode == Mode::Implicit;
    // SAFETY: forwarded contract.
    let h = unsafe { rma.start(kind, peer, raddr, local, len, implicit) }.expect("start");
    let r = match mode {
        Mode::Blocking => {
            let rma = rma.clone();
            bounded("wait", move || rma.wait(h))
        }
        Mode::Handle => {
            let t0 = Instant::now();
            loop {
                if let Some(r) = rma.test(h).expect("test of a live handle") {
                    break r;
                }
                assert!(
                    t0.elapsed() < TIMEOUT,
                    "test: not done in {TIMEOUT:?} (hang)"
                );
                std::thread::yield_now();
            }
        }
        Mode::Implicit => {
            let rma = rma.clone();
            bounded("quiet", move || rma.quiet())
        }
    };
    // The request may end only after its last completion: nothing of rank 0's (this rank is the
    // only one posting, and nobody else polls it) is still to be reported.
    assert_eq!(
        j.net.rdma_unreported(0),
        0,
        "done before its last completion"
    );
    if implicit {
        let rma = rma.clone();
        assert_eq!(
            bounded("quiet", move || rma.quiet()),
            Ok(()),
            "reported once"
        );
    } else {
        assert_eq!(rma.test(h), Err(RmaError::UnknownHandle), "spent");
        assert_eq!(rma.wait(h), Err(RmaError::UnknownHandle), "spent");
        // Made up: the same slot under a later generation (its done word exists and never says
        // done: the wait must still ask the table), and a slot far beyond the table.
        for made_up in [h + (7 << 32), (1 << 32) | 0x7fff_ffff] {
            let rma = rma.clone();
            assert_eq!(
                bounded("wait", move || rma.wait(made_up)),
                Err(RmaError::UnknownHandle),
                "made up {made_up:#x}"
            );
        }
    }
    r
}

/// A verified put then get of fresh bytes at `raddr` of `peer`: the `Rma` still works.
fn still_works(j: &Job, peer: Rank, raddr: u64, len: usize, seed: u64) {
    let src = pattern(seed, len);
    let mut back = vec![0u8; len];
    // SAFETY: both buffers outlive their ops (`op` returns when they are done).
    unsafe {
        let p = src.as_ptr().cast_mut();
        op(j, RdmaKind::Write, peer, raddr, p, len, Mode::Blocking).expect("put after");
        let g = back.as_mut_ptr();
        op(j, RdmaKind::Read, peer, raddr, g, len, Mode::Blocking).expect("get after");
        assert!(
            j.remote(peer as usize, raddr, len) == src,
            "put after: bytes"
        );
    }
    assert!(back == src, "get after: bytes");
}

/// Checks a failed op's bytes segment by segment (segment `s` is bucket `s` of the op): those
/// `moved(s)` says ran carried their bytes (a put's `src` at the target, the target's bytes into
/// a get's `local`), the others changed nothing (the target kept `before`, `local` its 0xEE).
/// `after`: the target's bytes after the op.
fn check_segments(
    what: &str,
    kind: RdmaKind,
    (before, after): (&[u8], &[u8]),
    (src, local): (&[u8], &[u8]),
    moved: impl Fn(usize) -> bool,
) {
    let seg = |v: &[u8], s: usize| v[s * BUCKET..(s + 1) * BUCKET].to_vec();
    for s in 0..before.len() / BUCKET {
        let (got, want) = match (kind, moved(s)) {
            (RdmaKind::Write, true) => (seg(after, s), seg(src, s)),
            (RdmaKind::Write, false) => (seg(after, s), seg(before, s)),
            (RdmaKind::Read, true) => (seg(local, s), seg(before, s)),
            (RdmaKind::Read, false) => (seg(local, s), vec![0xEE; BUCKET]),
        };
        assert!(
            got == want,
            "{what}: bytes of segment {s} (moved: {})",
            moved(s)
        );
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// The range is covered by unused firehoses: `start` posts the segments.
    Hit,
    /// A fresh range: the segments are posted when the move's reply makes the chunk `Ready`.
    Miss,
}

/// The post of segment `fail` of a `SEGS`-segment op is refused; checks everything the file's
/// header lists. `slot` is a 4-bucket range of rank 1's buffer no other case uses.
fn refused_post_case(j: &Job, kind: RdmaKind, mode: Mode, path: Path, fail: usize, slot: usize) {
    let what = format!("{kind:?} {mode:?} {path:?}, segment {fail} of {SEGS} refused");
    let rma = &j.rmas[0];
    let len = SEGS * BUCKET;
    let raddr = j.bases[1] + (slot * SEGS * BUCKET) as u64;
    if path == Path::Hit {
        // Warm: the range's firehoses are then unused and cached, with the op's rights (a put
        // on a region pinned for gets only would miss). A put writes back what is there.
        // SAFETY: nothing runs on the range now.
        let mut warm = unsafe { j.remote(1, raddr, len) };
        // SAFETY: `warm` outlives the op.
        unsafe { op(j, kind, 1, raddr, warm.as_mut_ptr(), len, Mode::Blocking) }.expect("warm-up");
    }
    // SAFETY: nothing runs on the range now.
    let before = unsafe { j.remote(1, raddr, len) };
    let src = pattern(1000 + slot as u64, len);
    let mut local = match kind {
        RdmaKind::Write => src.clone(),
        RdmaKind::Read => vec![0xEE; len],
    };
    let s0 = rma.stats();
    let refused0 = j.net.posts_refused();
    j.net.fail_rdma_posts(PostFault::Nth(fail as u64));
    // SAFETY: `local` outlives the op.
    let r = unsafe { op(j, kind, 1, raddr, local.as_mut_ptr(), len, mode) };
    j.net.fail_rdma_posts(PostFault::Off);
    let s1 = rma.stats();
    assert_eq!(r, Err(SEG_FAILED), "{what}");
    assert_eq!(
        s1.rdma_posted - s0.rdma_posted,
        SEGS as u64,
        "{what}: one chunk of {SEGS} segments, every one posted (the refused one too)"
    );
    assert_eq!(j.net.posts_refused() - refused0, 1, "{what}");
    let (hits, misses) = (s1.fh.hits - s0.fh.hits, s1.fh.misses - s0.fh.misses);
    match path {
        Path::Hit => assert_eq!((hits, misses), (1, 0), "{what}"),
        Path::Miss => assert_eq!((hits, misses), (0, 1), "{what}"),
    }
    // The segments that were posted moved their bytes; the refused one moved none.
    // SAFETY: the op is done.
    let after = unsafe { j.remote(1, raddr, len) };
    check_segments(&what, kind, (&before, &after), (&src, &local), |s| {
        s != fail
    });
    j.check_no_leak();
    still_works(j, 1, raddr, len, 2000 + slot as u64);
    j.check_no_leak();
}

#[test]
fn refused_post_in_a_multi_segment_chunk() {
    let modes = [Mode::Blocking, Mode::Handle, Mode::Implicit];
    let cases: Vec<_> = [RdmaKind::Write, RdmaKind::Read]
        .into_iter()
        .flat_map(|k| modes.into_iter().map(move |m| (k, m)))
        .flat_map(|(k, m)| [Path::Hit, Path::Miss].map(|p| (k, m, p)))
        // First, a middle and the last segment.
        .flat_map(|(k, m, p)| [0, 1, SEGS - 1].map(|f| (k, m, p, f)))
        .collect();
    let j = job(3, cases.len() * SEGS, 21, 0);
    let _servers = j.serve();
    for (slot, &(kind, mode, path, fail)) in cases.iter().enumerate() {
        refused_post_case(&j, kind, mode, path, fail, slot);
    }
    // The other target never noticed anything.
    still_works(&j, 2, j.bases[2], SEGS * BUCKET, 3);
    j.check_no_leak();
}

/// Short puts are inline (posted with no local registration): a refused segment of an inline
/// put of two segments (200 bytes across a bucket boundary) is no different.
#[test]
fn refused_post_with_inline_segments() {
    let j = job(2, 8, 22, 256);
    let _servers = j.serve();
    let rma = &j.rmas[0];
    // 200 bytes across a bucket boundary: two segments of 100, each inline.
    let raddr = j.bases[1] + BUCKET as u64 - 100;
    let src = pattern(5, 200);
    // Warm with a put (the firehoses then have write rights): of what is there.
    // SAFETY: nothing runs on the range now.
    let mut warm = unsafe { j.remote(1, raddr, 200) };
    // SAFETY: the buffers outlive their ops.
    unsafe {
        op(
            &j,
            RdmaKind::Write,
            1,
            raddr,
            warm.as_mut_ptr(),
            200,
            Mode::Blocking,
        )
        .unwrap();
        for fail in [0, 1] {
            let before = j.remote(1, raddr, 200);
            let s0 = rma.stats().rdma_posted;
            j.net.fail_rdma_posts(PostFault::Nth(fail));
            let p = src.as_ptr().cast_mut();
            let r = op(&j, RdmaKind::Write, 1, raddr, p, 200, Mode::Blocking);
            assert_eq!(r, Err(SEG_FAILED), "inline segment {fail} refused");
            assert_eq!(rma.stats().rdma_posted - s0, 2, "two segments");
            let after = j.remote(1, raddr, 200);
            let (f, k) = (fail as usize * 100, 100 - fail as usize * 100);
            assert!(
                after[f..f + 100] == before[f..f + 100],
                "refused: untouched"
            );
            assert!(after[k..k + 100] == src[k..k + 100], "posted: written");
            j.check_no_leak();
            // Restore, for the next round's `before`.
            op(
                &j,
                RdmaKind::Write,
                1,
                raddr,
                before.as_ptr().cast_mut(),
                200,
                Mode::Blocking,
            )
            .unwrap();
        }
    }
    still_works(&j, 1, raddr, 200, 6);
    j.check_no_leak();
}

/// A request of two chunks, each of several segments; a post of the second chunk is refused.
/// The first chunk's bytes arrive, the request fails once, nothing leaks.
#[test]
fn refused_post_in_a_later_chunk() {
    let buckets = MAX_CHUNK_BUCKETS + 9;
    let len = buckets * BUCKET;
    for (kind, mode) in [
        (RdmaKind::Write, Mode::Handle),
        (RdmaKind::Read, Mode::Implicit),
    ] {
        let j = job(2, buckets, 23, 0);
        let _servers = j.serve();
        let rma = &j.rmas[0];
        let raddr = j.bases[1];
        // SAFETY: nothing runs.
        let before = unsafe { j.remote(1, raddr, len) };
        let src = pattern(7, len);
        let mut local = match kind {
            RdmaKind::Write => src.clone(),
            RdmaKind::Read => vec![0xEE; len],
        };
        // Both chunks miss; the second waits for the first one's firehoses (the quota holds
        // one chunk): posts 0..31 are the first chunk's, 31.. the second's.
        let fail = MAX_CHUNK_BUCKETS + 4;
        j.net.fail_rdma_posts(PostFault::Nth(fail as u64));
        // SAFETY: `local` outlives the op.
        let r = unsafe { op(&j, kind, 1, raddr, local.as_mut_ptr(), len, mode) };
        j.net.fail_rdma_posts(PostFault::Off);
        let what = format!("{kind:?} {mode:?}");
        assert_eq!(r, Err(SEG_FAILED), "{what}");
        let s = rma.stats();
        assert_eq!((s.rdma_posted, s.fh.misses), (buckets as u64, 2), "{what}");
        // SAFETY: the op is done.
        let after = unsafe { j.remote(1, raddr, len) };
        check_segments(&what, kind, (&before, &after), (&src, &local), |s| {
            s != fail
        });
        j.check_no_leak();
        still_works(&j, 1, raddr, len, 8);
        j.check_no_leak();
    }
}

/// A posted segment completes with an error (its region's rkey forgotten at the target:
/// `RemoteAccess`, and the connection is lost as on RC) while the segments before it succeed
/// and those after it are flushed. The request fails once; every reference is released (the
/// target keeps what it had pinned for the lost peer as unheld victims, by design: `check_idle`
/// checks its bookkeeping); the other peer still works.
#[test]
fn segment_completing_with_an_error() {
    for kind in [RdmaKind::Write, RdmaKind::Read] {
        for fail in [0, 1, SEGS - 1] {
            for mode in [Mode::Blocking, Mode::Handle, Mode::Implicit] {
                let what = format!("{kind:?} {mode:?}, segment {fail} of {SEGS} fails");
                let j = job(3, SEGS, 24 + fail as u64, 0);
                let _servers = j.serve();
                let rma = &j.rmas[0];
                let len = SEGS * BUCKET;
                let raddr = j.bases[1];
                // Warm with the op's own kind (its rights); a put writes back what is there.
                // SAFETY: nothing runs on the range now.
                let mut warm = unsafe { j.remote(1, raddr, len) };
                // SAFETY: `warm` outlives the op.
                unsafe { op(&j, kind, 1, raddr, warm.as_mut_ptr(), len, mode) }.expect("warm-up");
                // Forget the rkey of the region of segment `fail` (as if the target had
                // deregistered it behind Firehose's back).
                let bucket = raddr + (fail * BUCKET) as u64;
                let rkey = {
                    let log = j.pins[1].lock().unwrap();
                    let found = log
                        .live
                        .iter()
                        .find(|(_, &(a, l))| a <= bucket && bucket < a + l as u64);
                    *found.expect("the bucket is pinned").0
                };
                assert!(j.net.deregister(rkey));
                // SAFETY: nothing runs.
                let before = unsafe { j.remote(1, raddr, len) };
                let src = pattern(9, len);
                let mut local = match kind {
                    RdmaKind::Write => src.clone(),
                    RdmaKind::Read => vec![0xEE; len],
                };
                let s0 = rma.stats();
                // SAFETY: `local` outlives the op.
                let r = unsafe { op(&j, kind, 1, raddr, local.as_mut_ptr(), len, mode) };
                let s1 = rma.stats();
                assert_eq!(r, Err(SEG_FAILED), "{what}");
                assert_eq!(s1.fh.hits - s0.fh.hits, 1, "{what}: posted from start");
                assert_eq!(s1.rdma_posted - s0.rdma_posted, SEGS as u64, "{what}");
                // Before the failed one: done; from it on: nothing (flushed).
                // SAFETY: the op is done.
                let after = unsafe { j.remote(1, raddr, len) };
                check_segments(&what, kind, (&before, &after), (&src, &local), |s| s < fail);
                j.check_no_leak();
                // Rank 1 is lost to rank 0: later ops to it fail at once, cleanly ...
                let mut b = vec![0u8; 8];
                // SAFETY: `b` outlives the op.
                let r = unsafe { op(&j, RdmaKind::Read, 1, raddr, b.as_mut_ptr(), 8, mode) };
                assert_eq!(r, Err(RmaError::PeerLost), "{what}: after");
                // ... and rank 2 still works.
                still_works(&j, 2, j.bases[2], len, 10);
                j.check_no_leak();
            }
        }
    }
}

/// 16 threads (4 ranks x 4) doing random puts and gets of 1 byte to 12 buckets (several
/// segments, sometimes several chunks), blocking, with handles and implicit, while one post in
/// 16 is refused. Each op reports success (and then its bytes are right) or `PeerLost`
/// (then the bytes it would have written are unknown until written again); at the end every
/// known byte is right and nothing is leaked on any rank.
#[test]
fn sixteen_threads_with_random_refused_posts() {
    const SIZE: u32 = 4;
    const WORKERS: usize = 4;
    const OPS: usize = 300;
    let stripe_buckets = 12;
    let total = SIZE as usize * WORKERS;
    let j = Arc::new(job(SIZE, total * stripe_buckets, 25, 256));
    j.net.fail_rdma_posts(PostFault::OneIn(16));
    let arrived = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..total)
        .map(|k| {
            let (j, arrived, failures) = (j.clone(), arrived.clone(), failures.clone());
            std::thread::spawn(move || {
                let r = k / WORKERS;
                let stripe = stripe_buckets * BUCKET;
                let lo = k * stripe;
                let (model, f) =
                    random_worker(&j, (r, k % WORKERS), lo, stripe, 100 + k as u64, OPS);
                failures.fetch_add(f, SeqCst);
                // Keep progressing until every worker is done: a peer may still need our
                // answers to its moves.
                arrived.fetch_add(1, SeqCst);
                let rma = &j.rmas[r];
                while arrived.load(SeqCst) < total {
                    rma.progress().unwrap();
                    std::thread::yield_now();
                }
                (lo, model)
            })
        })
        .collect();
    let done = Arc::new(AtomicBool::new(false));
    let (d, jj) = (done.clone(), j.clone());
    let watchdog = std::thread::spawn(move || {
        let t0 = Instant::now();
        while !d.load(SeqCst) {
            if t0.elapsed() > Duration::from_secs(120) {
                for (r, rma) in jj.rmas.iter().enumerate() {
                    eprintln!("rank {r}: {:?} {:?}", rma.stats(), rma.check_idle());
                }
                eprintln!("rma_seg_fail: no progress in 120 s (hang)");
                std::process::abort();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    done.store(true, SeqCst);
    watchdog.join().unwrap();
    j.net.fail_rdma_posts(PostFault::Off);
    // Every op is done and every thread joined: the buffers can be read.
    for (lo, model) in results {
        for (t, m) in model.iter().enumerate() {
            // SAFETY: nothing runs.
            let got = unsafe { j.remote(t, j.bases[t] + lo as u64, m.len()) };
            for (i, (g, w)) in got.iter().zip(m).enumerate() {
                if let Some(w) = w {
                    assert_eq!(g, w, "rank {t}, stripe at {lo}, byte {i}");
                }
            }
        }
    }
    let failures = failures.load(SeqCst);
    let refused = j.net.posts_refused();
    let (ops, posted) = j.rmas.iter().map(|r| r.stats()).fold((0, 0), |(o, p), s| {
        (o + s.puts + s.gets - s.self_ops, p + s.rdma_posted)
    });
    assert!(
        posted > ops,
        "{posted} posts for {ops} ops: several segments per op"
    );
    eprintln!("16 threads: {refused} posts refused, {failures} ops failed");
    assert!(refused > 0 && failures > 0, "failures were injected");
    j.check_no_leak();
}

/// One worker of rank `r`: random ops into its stripe `[lo, lo + stripe)` of every rank's
/// buffer. Returns its model of each rank's stripe (`None`: unknown, after a failed put) and
/// how many ops failed. Only worker 0 of a rank starts implicit ops: `quiet` reports the
/// first implicit error of the whole context, so with one implicit worker per rank its error
/// is that worker's own.
fn random_worker(
    j: &Job,
    (r, w): (usize, usize),
    lo: usize,
    stripe: usize,
    seed: u64,
    ops: usize,
) -> (Vec<Vec<Option<u8>>>, u64) {
    let rma = &j.rmas[r];
    let size = j.rmas.len();
    let mut rng = Rng::new(seed);
    let mut st = Worker {
        j,
        r,
        lo,
        // The stripes start as the job's patterns.
        model: (0..size)
            // SAFETY: a stripe is only touched by its worker, which has started nothing yet.
            .map(|t| unsafe { j.remote(t, j.bases[t] + lo as u64, stripe) })
            .map(|v| v.into_iter().map(Some).collect())
            .collect(),
        failures: 0,
    };
    let mut pending: Vec<Pending> = Vec::new();
    for _ in 0..ops {
        let t = rng.below(size as u64) as usize;
        let len = match rng.below(4) {
            0 => 1 + rng.below(300) as usize,
            _ => 1 + rng.below(stripe as u64) as usize,
        };
        let off = rng.below((stripe - len + 1) as u64) as usize;
        // Nothing of ours may overlap: finish what does (implicit ones by a quiet).
        let overlaps = |p: &Pending| p.t == t && p.off < off + len && off < p.off + p.buf.len();
        if pending.iter().any(|p| overlaps(p) && p.h == 0) {
            let (implicit, rest) = pending.into_iter().partition(|p| p.h == 0);
            pending = rest;
            st.quiet(rma, implicit);
        }
        while let Some(i) = pending.iter().position(overlaps) {
            let p = pending.swap_remove(i);
            let res = wait_bounded(rma, p.h);
            st.complete(p, res);
        }
        let mode = match rng.below(3) {
            0 => Mode::Blocking,
            1 => Mode::Handle,
            _ if w == 0 => Mode::Implicit,
            _ => Mode::Handle,
        };
        let kind = if rng.below(2) == 0 {
            RdmaKind::Write
        } else {
            RdmaKind::Read
        };
        let (mut buf, want) = match kind {
            RdmaKind::Write => ((0..len).map(|_| rng.next() as u8).collect(), Vec::new()),
            RdmaKind::Read => (vec![0xEE; len], st.model[t][off..off + len].to_vec()),
        };
        let raddr = j.bases[t] + (lo + off) as u64;
        let implicit = mode == Mode::Implicit;
        // SAFETY: `buf` moves into `Pending` (its heap bytes stay put) and lives, untouched,
        // until the op is done.
        let h = unsafe { rma.start(kind, t as Rank, raddr, buf.as_mut_ptr(), len, implicit) }
            .expect("start");
        let p = Pending {
            h: if implicit { 0 } else { h },
            kind,
            t,
            off,
            buf,
            want,
        };
        if mode == Mode::Blocking {
            let res = wait_bounded(rma, p.h);
            st.complete(p, res);
        } else {
            pending.push(p);
        }
        // Now and then, test the oldest handle (progress without blocking).
        if rng.below(3) == 0 {
            if let Some(i) = pending.iter().position(|p| p.h != 0) {
                if let Some(res) = rma.test(pending[i].h).expect("test") {
                    st.complete(pending.swap_remove(i), res);
                }
            }
        }
    }
    let (implicit, handles): (Vec<_>, Vec<_>) = pending.into_iter().partition(|p| p.h == 0);
    for p in handles {
        let res = wait_bounded(rma, p.h);
        st.complete(p, res);
    }
    // Only the implicit worker may quiet: a quiet takes the context's implicit error, whoever's.
    if w == 0 {
        st.quiet(rma, implicit);
    }
    (st.model, st.failures)
}

/// An op of a random worker not yet known done.
struct Pending {
    /// 0: implicit.
    h: u64,
    kind: RdmaKind,
    t: usize,
    off: usize,
    buf: Vec<u8>,
    /// A get's expected bytes (the model when it started).
    want: Vec<Option<u8>>,
}

struct Worker<'a> {
    j: &'a Job,
    r: usize,
    lo: usize,
    model: Vec<Vec<Option<u8>>>,
    failures: u64,
}

impl Worker<'_> {
    /// `p` is done with `res`: a success is checked (a get's bytes against the model, a put's
    /// at the target) and recorded; a failure must be a failed segment's status.
    fn complete(&mut self, p: Pending, res: Result<(), RmaError>) {
        let (r, range) = (self.r, p.off..p.off + p.buf.len());
        match (res, p.kind) {
            (Ok(()), RdmaKind::Write) => {
                let raddr = self.j.bases[p.t] + (self.lo + p.off) as u64;
                // SAFETY: the stripe is ours, and no op of ours overlaps `p`'s range.
                let there = unsafe { self.j.remote(p.t, raddr, p.buf.len()) };
                if let Some(i) = (0..there.len()).find(|&i| there[i] != p.buf[i]) {
                    let (h, t, off, len) = (p.h, p.t, p.off, p.buf.len());
                    panic!("rank {r}: put {h:#x} of {len} to rank {t} at {off}: wrong at +{i}");
                }
                for (m, &b) in self.model[p.t][range].iter_mut().zip(&p.buf) {
                    *m = Some(b);
                }
            }
            (Ok(()), RdmaKind::Read) => {
                for (i, (g, want)) in p.buf.iter().zip(&p.want).enumerate() {
                    if let Some(want) = want {
                        assert_eq!(g, want, "rank {r}: get from rank {} at {}+{i}", p.t, p.off);
                    }
                }
            }
            (Err(e), kind) => {
                assert_eq!(e, SEG_FAILED, "rank {r}: {kind:?} failed otherwise");
                self.failures += 1;
                if kind == RdmaKind::Write {
                    // Some of its segments may have landed: unknown until written again.
                    self.model[p.t][range].fill(None);
                }
            }
        }
    }

    /// A bounded `quiet` collecting `implicit` (this worker's implicit ops): success is every
    /// one's; an error is at least one's, which one is not said, so the puts' bytes are then
    /// unknown and the gets unchecked.
    fn quiet(&mut self, rma: &Rma, implicit: Vec<Pending>) {
        let t0 = Instant::now();
        let res = rma.quiet();
        assert!(t0.elapsed() < TIMEOUT, "quiet took {:?}", t0.elapsed());
        if let Err(e) = res {
            assert_eq!(e, SEG_FAILED, "rank {}: quiet", self.r);
            self.failures += 1;
        }
        for p in implicit {
            match res {
                Ok(()) => self.complete(p, Ok(())),
                Err(_) if p.kind == RdmaKind::Write => {
                    self.model[p.t][p.off..p.off + p.buf.len()].fill(None)
                }
                Err(_) => {}
            }
        }
    }
}

/// `wait`, failing the test if it takes longer than `TIMEOUT` (the watchdog aborts a true
/// hang).
fn wait_bounded(rma: &Rma, h: u64) -> Result<(), RmaError> {
    let t0 = Instant::now();
    let r = rma.wait(h);
    assert!(t0.elapsed() < TIMEOUT, "wait took {:?}", t0.elapsed());
    r
}
