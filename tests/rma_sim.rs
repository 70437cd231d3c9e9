//! The whole Firehose driver (`rma::Rma`: cache, algorithm, active messages, RDMA, completions)
//! natively, over the simulated link: ranks and their workers are threads of this process
//! (`Delivery::Auto`), the target's pins are simulator registrations (`SimPins`), the local
//! buffers go through a pin-down cache on the null backend (the simulator checks no lkey).
//!
//! Every worker owns a disjoint stripe of every rank's buffer and issues random blocking,
//! non-blocking (`test`/`wait`) and implicit (`quiet`) puts and gets of random sizes at random
//! offsets into it, keeping a model of what the stripe must hold; an op never overlaps one of
//! its worker's ops still running (so the model is exact). Gets are checked against the model
//! when they complete; at the end, after every worker is done, the buffers are compared with
//! the models byte for byte. Firehose's bound is small, so the working set is far past
//! M + MAXVICTIM (misses, victims, evictions, moves with puts inside, chunked requests), and the
//! pinned bytes are checked against the bound at every pin. An unmapped target address fails
//! with `RemoteFault`.

use firehose::cache::{Cache, Limits};
use firehose::net::settings::NetSettings;
use firehose::net::sim::{Delivery, SimConfig, SimNet};
use firehose::net::{Link, Peers, Rank, RdmaKind};
use firehose::pin::null::NullPinner;
use firehose::rma::sim_pins::SimPins;
use firehose::rma::Rma;
use firehose::rma::RmaError;
use firehose_proto::{FirehoseConfig, PinFailure, RegionPins, Rights};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BUCKET: usize = 4096;

#[path = "common/sim_mem.rs"]
#[allow(dead_code)]
mod sim_mem;
use sim_mem::{Buf, Rng};

/// `SimPins` that checks Firehose's bound (pinned bytes <= M + MAXVICTIM) at every pin.
struct Bounded {
    inner: SimPins,
    bound: u64,
    peak: Arc<AtomicU64>,
}

impl RegionPins for Bounded {
    fn pin(&mut self, addr: u64, len: usize, rights: Rights) -> Result<u32, PinFailure> {
        let r = self.inner.pin(addr, len, rights)?;
        let b = self.inner.bytes();
        assert!(
            b <= self.bound,
            "pinned {b} > M + MAXVICTIM = {}",
            self.bound
        );
        self.peak.fetch_max(b, SeqCst);
        Ok(r)
    }
    fn unpin(&mut self, addr: u64, len: usize, rkey: u32) {
        self.inner.unpin(addr, len, rkey);
        assert_eq!(
            self.inner.unknown_unpins(),
            0,
            "unpin of a region never pinned"
        );
    }
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), PinFailure> {
        self.inner.write(addr, data)
    }
}

struct Job {
    rmas: Vec<Arc<Rma>>,
    bufs: Vec<Buf>,
    peak: Arc<AtomicU64>,
    bound: u64,
}

fn config(rank: Rank, size: u32) -> FirehoseConfig {
    let mut c = FirehoseConfig::new(rank, size);
    c.bucket_size = BUCKET;
    // 16 buckets per peer, regions of up to 4 buckets: ops up to 48 KiB are one chunk.
    c.m_bytes = 16 * BUCKET * (size as usize - 1);
    c.max_victim_bytes = 8 * BUCKET;
    c.max_region_buckets = 4;
    c
}

/// `inline`: WRITEs up to this long are inline on the links (`Link::max_inline_write`; verbs
/// on rxe: 256), so `Rma` posts short puts with no local registration.
fn job(size: u32, buf_len: usize, seed: u64, inline: usize) -> Job {
    let mut sc = SimConfig::new(size, seed, Delivery::Auto);
    sc.slots = NetSettings::default().recv_depth;
    let net = SimNet::new(sc);
    net.set_max_inline_write(inline);
    let peak = Arc::new(AtomicU64::new(0));
    let cfg0 = config(0, size);
    let bound = (cfg0.m_bytes + cfg0.max_victim_bytes) as u64;
    let unbounded = Limits {
        max_pinned: usize::MAX,
        max_regions: usize::MAX,
    };
    let rmas = (0..size)
        .map(|r| {
            let link: Arc<dyn Link> = net.link(r);
            let peers = Arc::new(Peers::from_link(link, NetSettings::default()).unwrap());
            let cache = Cache::new(Arc::new(NullPinner), unbounded, None);
            let pins = Bounded {
                inner: SimPins::new(net.clone(), r),
                bound,
                peak: peak.clone(),
            };
            let rma = Rma::with_pins(peers, Some(cache), config(r, size), Box::new(pins))
                .expect("rma over the simulator");
            rma.peers().start_progress().unwrap();
            rma
        })
        .collect();
    Job {
        rmas,
        bufs: (0..size).map(|_| Buf::new(buf_len, 0)).collect(),
        peak,
        bound,
    }
}

/// Every worker arrives, then progresses until all have (a thread blocked without progress
/// could leave a peer's move unanswered).
fn progress_barrier(rma: &Rma, count: &AtomicUsize, total: usize) {
    count.fetch_add(1, SeqCst);
    let t0 = Instant::now();
    while count.load(SeqCst) < total {
        rma.progress().unwrap();
        std::thread::yield_now();
        assert!(t0.elapsed() < Duration::from_secs(120), "barrier timed out");
    }
}

enum Pending {
    /// Handle (0: implicit), target, offset, length, and the buffer (a put's source, kept
    /// alive until done; a get's destination with the bytes expected).
    Put {
        h: u64,
        t: usize,
        off: usize,
        _src: Vec<u8>,
    },
    Get {
        h: u64,
        t: usize,
        off: usize,
        dst: Vec<u8>,
        want: Vec<u8>,
    },
}

impl Pending {
    fn range(&self) -> (usize, usize, usize) {
        match self {
            Pending::Put { t, off, _src, .. } => (*t, *off, *off + _src.len()),
            Pending::Get { t, off, dst, .. } => (*t, *off, *off + dst.len()),
        }
    }
    fn handle(&self) -> u64 {
        match self {
            Pending::Put { h, .. } | Pending::Get { h, .. } => *h,
        }
    }
    fn check(&self) {
        if let Pending::Get {
            t, off, dst, want, ..
        } = self
        {
            assert!(
                dst == want,
                "get of {} bytes at {off} of rank {t}",
                dst.len()
            );
        }
    }
}

/// One worker: random ops into its stripe `[lo, hi)` of every rank's buffer. Returns its model
/// of each rank's stripe.
fn worker(
    rma: &Rma,
    bases: &[u64],
    (lo, hi): (usize, usize),
    seed: u64,
    ops: usize,
) -> Vec<Vec<u8>> {
    let size = bases.len();
    let mut rng = Rng::new(seed);
    let mut model = vec![vec![0u8; hi - lo]; size];
    let mut pending: Vec<Pending> = Vec::new();
    let stripe = hi - lo;
    let finish = |p: Pending, rma: &Rma, wait: bool| -> Option<Pending> {
        let h = p.handle();
        if h == 0 {
            rma.quiet().expect("quiet");
        } else {
            if wait {
                rma.wait(h).expect("wait");
            } else {
                match rma.test(h).expect("test") {
                    None => return Some(p),
                    Some(r) => r.expect("op"),
                }
            }
            // Collected once (from the done board or the table): the handle is spent, also
            // while its entry waits to be reused, and after another thread's request took it.
            assert_eq!(rma.test(h), Err(RmaError::UnknownHandle), "spent handle");
        }
        p.check();
        None
    };
    for _ in 0..ops {
        let t = rng.below(size as u64) as usize;
        // Mostly small (the hit path), sometimes several buckets, now and then past the
        // chunk length (a request of several chunks).
        let len = match rng.below(10) {
            0..=5 => 1 + rng.below(64) as usize,
            6..=8 => 1 + rng.below(4 * BUCKET as u64) as usize,
            _ => 1 + rng.below(stripe.min(100 << 10) as u64) as usize,
        }
        .min(stripe);
        let off = rng.below((stripe - len + 1) as u64) as usize;
        let (a, b) = (lo + off, lo + off + len);
        // Nothing of ours may overlap: finish what does (implicit ones by a quiet).
        let mut i = 0;
        while i < pending.len() {
            let (pt, pa, pb) = pending[i].range();
            if pt == t && pa < b && a < pb {
                let p = pending.swap_remove(i);
                finish(p, rma, true);
            } else {
                i += 1;
            }
        }
        let raddr = bases[t] + a as u64;
        let mode = rng.below(4); // 0: blocking, 1: handle (test/wait later), 2: implicit
        if rng.below(2) == 0 {
            let src: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            model[t][off..off + len].copy_from_slice(&src);
            // SAFETY: `src` lives in the pending entry until the put is done, unchanged.
            let h = unsafe {
                rma.start(
                    RdmaKind::Write,
                    t as Rank,
                    raddr,
                    src.as_ptr().cast_mut(),
                    len,
                    mode == 2,
                )
            }
            .expect("put start");
            let p = Pending::Put {
                h: if mode == 2 { 0 } else { h },
                t,
                off: a,
                _src: src,
            };
            match mode {
                0 => {
                    finish(p, rma, true);
                }
                _ => pending.push(p),
            }
        } else {
            let mut dst = vec![0xEEu8; len];
            let want = model[t][off..off + len].to_vec();
            // SAFETY: `dst` lives in the pending entry until the get is done, untouched.
            let h = unsafe {
                rma.start(
                    RdmaKind::Read,
                    t as Rank,
                    raddr,
                    dst.as_mut_ptr(),
                    len,
                    mode == 2,
                )
            }
            .expect("get start");
            let p = Pending::Get {
                h: if mode == 2 { 0 } else { h },
                t,
                off: a,
                dst,
                want,
            };
            match mode {
                0 => {
                    finish(p, rma, true);
                }
                _ => pending.push(p),
            }
        }
        // Now and then, test the oldest handle (progress without blocking).
        if rng.below(3) == 0 {
            if let Some(i) = pending.iter().position(|p| p.handle() != 0) {
                let p = pending.swap_remove(i);
                if let Some(p) = finish(p, rma, false) {
                    pending.push(p);
                }
            }
        }
    }
    // Handles first (a quiet does not spend them), then the implicit ones.
    let (implicit, handles): (Vec<_>, Vec<_>) = pending.into_iter().partition(|p| p.handle() == 0);
    for p in handles {
        finish(p, rma, true);
    }
    rma.quiet().expect("final quiet");
    for p in implicit {
        p.check();
    }
    model
}

fn run(size: u32, workers: usize, ops: usize, seed: u64, inline: usize) {
    let buf_len = 512 << 10;
    let job = Arc::new(job(size, buf_len, seed, inline));
    let total = size as usize * workers;
    let stripe = buf_len / total;
    let bases: Vec<u64> = job.bufs.iter().map(Buf::addr).collect();
    let arrived = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..size as usize)
        .flat_map(|r| (0..workers).map(move |w| (r, w)))
        .map(|(r, w)| {
            let (job, bases, arrived) = (job.clone(), bases.clone(), arrived.clone());
            std::thread::spawn(move || {
                let rma = &job.rmas[r];
                let k = r * workers + w;
                let range = (k * stripe, (k + 1) * stripe);
                let model = worker(
                    rma,
                    &bases,
                    range,
                    seed ^ ((k as u64 + 1) * 0x1234_5678),
                    ops,
                );
                progress_barrier(rma, &arrived, total);
                (range, model)
            })
        })
        .collect();
    // A hang is a failure with the state of every rank, not a test that never ends.
    let done = Arc::new(AtomicUsize::new(0));
    let (d, j) = (done.clone(), job.clone());
    let watchdog = std::thread::spawn(move || {
        let t0 = Instant::now();
        while d.load(SeqCst) == 0 {
            if t0.elapsed() > Duration::from_secs(120) {
                for (r, rma) in j.rmas.iter().enumerate() {
                    eprintln!("rank {r}: {:?}", rma.stats());
                }
                eprintln!("rma_sim: no progress in 120 s");
                std::process::abort();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    done.store(1, SeqCst);
    watchdog.join().unwrap();
    // Every worker is done and joined: no op runs, the buffers can be read.
    for ((lo, hi), model) in results {
        for (t, want) in model.iter().enumerate() {
            // SAFETY: every op completed (each worker's final quiet) and every thread is joined.
            let got = unsafe { &job.bufs[t].bytes()[lo..hi] };
            if got != &want[..] {
                let i = (0..want.len()).find(|&i| got[i] != want[i]).unwrap();
                panic!("rank {t}, stripe at {lo}: first wrong byte at +{i}");
            }
        }
    }
    let mut hits = 0;
    let mut misses = 0;
    for rma in &job.rmas {
        let s = rma.stats();
        hits += s.fh.hits;
        misses += s.fh.misses;
        assert_eq!(s.rejected, 0, "no Firehose message was rejected");
    }
    let peak = job.peak.load(SeqCst);
    eprintln!(
        "{size} ranks x {workers}: hits {hits}, misses {misses}, peak pinned {peak} of bound {}",
        job.bound
    );
    assert!(hits > 0 && misses > 0, "both paths ran");
}

#[test]
fn two_ranks_three_workers_each() {
    run(2, 3, 400, 11, 0);
}

#[test]
fn four_ranks() {
    // Short puts inline (no local registration), the rest registered through the cache.
    run(4, 1, 500, 12, 256);
}

#[test]
fn unmapped_target_is_a_remote_fault() {
    let job = job(2, 1 << 16, 3, 256);
    let rma = &job.rmas[0];
    // Page 1 is below mmap_min_addr: never mapped in any process.
    let hole = 4096u64;
    let target = job.rmas[1].clone();
    let stop = Arc::new(AtomicUsize::new(0));
    let s = stop.clone();
    let server = std::thread::spawn(move || {
        while s.load(SeqCst) == 0 {
            target.progress().unwrap();
            std::thread::yield_now();
        }
    });
    // A small put (rides in the move: the target's write fails), a long one (the pin fails),
    // and a get.
    for (kind, len) in [
        (RdmaKind::Write, 8),
        (RdmaKind::Write, 3 * BUCKET),
        (RdmaKind::Read, 100),
    ] {
        let mut b = vec![7u8; len];
        // SAFETY: `b` outlives the wait.
        let h = unsafe { rma.start(kind, 1, hole, b.as_mut_ptr(), len, false) }.unwrap();
        assert_eq!(rma.wait(h), Err(RmaError::RemoteFault), "{kind:?} {len}");
    }
    // The connection survived: a put to mapped memory still works.
    let v = [1u8, 2, 3, 4];
    let dst = job.bufs[1].addr() + 100;
    // SAFETY: `v` outlives the wait.
    let h = unsafe { rma.start(RdmaKind::Write, 1, dst, v.as_ptr().cast_mut(), 4, false) }.unwrap();
    rma.wait(h).unwrap();
    stop.store(1, SeqCst);
    server.join().unwrap();
    // SAFETY: nothing runs any more.
    assert_eq!(unsafe { &job.bufs[1].bytes()[100..104] }, &v);
}
