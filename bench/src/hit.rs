//! Hit cost: register + deregister of ranges that are already cached, timed in batches, on
//! 1..N threads that each own their own regions, thread t bound to allowed CPU t mod N.

use std::sync::Barrier;
use std::time::Instant;

use firehose::internals::helper::placement::{allowed_cpus, bind_current_thread};

use crate::impls::RegCache;
use crate::summary::{summarize, Summary};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Always the thread's first region.
    Same,
    /// Uniform random among the thread's regions (sequence precomputed).
    Random,
}

impl Pattern {
    pub fn name(self) -> &'static str {
        match self {
            Pattern::Same => "same",
            Pattern::Random => "random",
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct HitConfig {
    /// Ops per timed batch.
    pub batch: usize,
    /// Timed batches per thread (one more untimed warm-up batch runs first).
    pub batches: usize,
}

/// One table row.
#[derive(Debug, Clone)]
pub struct HitRow {
    pub regions: usize,
    pub pattern: Pattern,
    pub threads: usize,
    pub imp: &'static str,
    /// Timed register+deregister pairs over all threads.
    pub iterations: u64,
    /// Per-op latency (one op = register + deregister), over every thread's batches.
    pub lat: Summary,
    /// Aggregate throughput of all threads, millions of ops per second: median over rounds
    /// (round = one batch on every thread, started together).
    pub mops: f64,
    /// Failed registrations in the timed loops (must be 0).
    pub failures: u64,
    /// The samples behind `lat` (per-op ns of each batch) and `mops` (one per round), kept so
    /// segments of one row measured at different times can be merged.
    pub per_op: Vec<f64>,
    pub round_mops: Vec<f64>,
}

impl HitRow {
    /// Fold another segment of the same configuration into this row.
    pub fn merge(&mut self, other: HitRow) {
        self.iterations += other.iterations;
        self.failures += other.failures;
        self.per_op.extend(other.per_op);
        self.round_mops.extend(other.round_mops);
        self.lat = summarize(&self.per_op);
        self.mops = summarize(&self.round_mops).p50;
    }
}

/// Length of the precomputed random index sequence (per thread); long enough that a 10^5-region
/// run does not replay a short, cache-warm subset.
const SEQ_LEN: usize = 1 << 20;

/// Run `cfg.batches` batches on each of `slices.len()` threads; thread `t` uses the regions
/// `slices[t]` (addresses of `len`-byte ranges that are already cached).
pub fn run<C: RegCache>(
    cache: &C,
    slices: &[Vec<usize>],
    len: usize,
    pattern: Pattern,
    cfg: HitConfig,
) -> HitRow {
    let threads = slices.len();
    let barrier = Barrier::new(threads);
    let cpus = &allowed_cpus();
    let results: Vec<ThreadResult> = std::thread::scope(|s| {
        let handles: Vec<_> = slices
            .iter()
            .enumerate()
            .map(|(t, regions)| {
                let barrier = &barrier;
                s.spawn(move || {
                    // Thread t on allowed CPU t mod N, for every implementation alike. Unbound,
                    // the kernel's wake-affine placement sometimes kept both threads of a 2-thread
                    // row on one CPU for a whole segment (they wake each other at every round's
                    // barrier). That row then measured 1.0-1.5x the 1-thread throughput with an
                    // unchanged per-op latency, while the ceiling's threads, placed apart,
                    // measured 1.95x: in 7 of 20 runs, and sched_getcpu showed the cause.
                    let cpu = cpus[t % cpus.len()];
                    if let Err(errno) = bind_current_thread(cpu) {
                        eprintln!("hit: thread {t} not bound to CPU {cpu} (errno {errno})");
                    }
                    // Addresses, not indices: the timed loop then reads one sequential stream
                    // instead of adding a random access into a region table of its own.
                    let seq: Vec<usize> = match pattern {
                        Pattern::Same => vec![regions[0]],
                        Pattern::Random => {
                            let mut rng = fastrand::Rng::with_seed(0x9e37_79b9 + t as u64);
                            (0..SEQ_LEN)
                                .map(|_| regions[rng.usize(..regions.len())])
                                .collect()
                        }
                    };
                    thread_loop(cache, &seq, len, cfg, barrier)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Throughput per round: all threads' ops over the span from the first start to the last end
    // of that round. The median over rounds is robust to the odd preemption on a shared host,
    // yet still honest about concurrency (threads that did not overlap stretch the span).
    let round_mops: Vec<f64> = (0..cfg.batches)
        .map(|b| {
            let start = results.iter().map(|r| r.spans[b].0).min().unwrap();
            let end = results.iter().map(|r| r.spans[b].1).max().unwrap();
            (threads * cfg.batch) as f64 / end.duration_since(start).as_secs_f64() / 1e6
        })
        .collect();
    let per_op: Vec<f64> = results
        .iter()
        .flat_map(|r| {
            r.spans
                .iter()
                .map(|(a, b)| b.duration_since(*a).as_nanos() as f64 / cfg.batch as f64)
        })
        .collect();
    HitRow {
        regions: slices.iter().map(Vec::len).sum(),
        pattern,
        threads,
        imp: cache.name(),
        iterations: (threads * cfg.batch * cfg.batches) as u64,
        lat: summarize(&per_op),
        mops: summarize(&round_mops).p50,
        failures: results.iter().map(|r| r.failures).sum(),
        per_op,
        round_mops,
    }
}

struct ThreadResult {
    /// (start, end) of each timed batch; batch `b` of every thread ran in the same round.
    spans: Vec<(Instant, Instant)>,
    failures: u64,
}

fn thread_loop<C: RegCache>(
    cache: &C,
    seq: &[usize],
    len: usize,
    cfg: HitConfig,
    barrier: &Barrier,
) -> ThreadResult {
    let mut spans = Vec::with_capacity(cfg.batches);
    let mut pos = 0usize;
    // One untimed warm-up batch.
    let mut failures = one_batch(cache, seq, &mut pos, len, cfg.batch);
    for _ in 0..cfg.batches {
        // Rounds: every thread starts batch b together, so the threads really contend.
        barrier.wait();
        let t0 = Instant::now();
        failures += one_batch(cache, seq, &mut pos, len, cfg.batch);
        spans.push((t0, Instant::now()));
    }
    ThreadResult { spans, failures }
}

/// `batch` register+deregister pairs; returns how many registrations failed.
#[inline(never)]
fn one_batch<C: RegCache>(
    cache: &C,
    seq: &[usize],
    pos: &mut usize,
    len: usize,
    batch: usize,
) -> u64 {
    let mut failures = 0;
    if seq.len() == 1 {
        let addr = seq[0];
        for _ in 0..batch {
            match cache.get(std::hint::black_box(addr), len) {
                Some(h) => cache.put(h),
                None => failures += 1,
            }
        }
    } else {
        for _ in 0..batch {
            let addr = seq[*pos];
            *pos = (*pos + 1) & (seq.len() - 1);
            match cache.get(addr, len) {
                Some(h) => cache.put(h),
                None => failures += 1,
            }
        }
    }
    failures
}

/// Split `n` region addresses into `threads` equal, disjoint slices (each thread its own buffers).
pub fn split(addrs: &[usize], threads: usize) -> Vec<Vec<usize>> {
    let per = addrs.len() / threads;
    (0..threads)
        .map(|t| addrs[t * per..(t + 1) * per].to_vec())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::sync::Mutex;

    /// A fake cache that records which addresses were looked up and checks get/put pairing.
    struct Fake {
        gets: Mutex<HashMap<usize, u64>>,
        outstanding: AtomicU64,
    }
    impl RegCache for Fake {
        fn name(&self) -> &'static str {
            "fake"
        }
        fn get(&self, addr: usize, _len: usize) -> Option<u64> {
            *self.gets.lock().unwrap().entry(addr).or_default() += 1;
            self.outstanding.fetch_add(1, Relaxed);
            Some(addr as u64)
        }
        fn put(&self, _h: u64) {
            self.outstanding.fetch_sub(1, Relaxed);
        }
    }

    #[test]
    fn random_pattern_touches_every_region_and_pairs_ops() {
        let fake = Fake {
            gets: Mutex::new(HashMap::new()),
            outstanding: AtomicU64::new(0),
        };
        let addrs: Vec<usize> = (0..64).map(|i| 0x1000 * (i + 1)).collect();
        let slices = split(&addrs, 2);
        let cfg = HitConfig {
            batch: 1000,
            batches: 3,
        };
        let row = run(&fake, &slices, 4096, Pattern::Random, cfg);
        assert_eq!(row.iterations, 2 * 3 * 1000);
        assert_eq!(row.regions, 64);
        assert_eq!(row.failures, 0);
        assert_eq!(fake.outstanding.load(Relaxed), 0);
        let gets = fake.gets.lock().unwrap();
        // Warm-up batch included: 4 batches of 1000 per thread.
        assert_eq!(gets.values().sum::<u64>(), 2 * 4 * 1000);
        assert_eq!(gets.len(), 64, "every region must be visited");
        assert!(row.mops > 0.0 && row.lat.p50 > 0.0);
    }

    #[test]
    fn same_pattern_uses_one_region_per_thread() {
        let fake = Fake {
            gets: Mutex::new(HashMap::new()),
            outstanding: AtomicU64::new(0),
        };
        let addrs: Vec<usize> = (0..8).map(|i| 0x1000 * (i + 1)).collect();
        let row = run(
            &fake,
            &split(&addrs, 4),
            4096,
            Pattern::Same,
            HitConfig {
                batch: 10,
                batches: 2,
            },
        );
        let gets = fake.gets.lock().unwrap();
        let mut keys: Vec<_> = gets.keys().copied().collect();
        keys.sort();
        assert_eq!(keys, vec![0x1000, 0x3000, 0x5000, 0x7000]);
        assert_eq!(row.threads, 4);
    }
}
