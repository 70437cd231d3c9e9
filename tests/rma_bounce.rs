//! Short gets through bounce slots (`rma::bounce`): a get of at most 256 bytes reads into one
//! of the library's registered slots and its completion copies the bytes to the caller's
//! destination before the result is published. Held to:
//! - every get brings exactly its bytes, whatever the path: 16 threads, blocking and up to 8
//!   in flight each (more than the 64 slots together, so some short gets find none and
//!   register their buffer), lengths on both sides of 256, ranges that cross a region (two
//!   segments, completed through the table rather than the fast path); every slot is given
//!   back (`check_idle`) and no registration is left (the cache's `in_use`);
//! - a short get that fails (its post refused by the device) changes nothing in the
//!   destination, reports the failure, gives its slot back, and the next get works;
//! - a short get into memory that is not writable faults in the calling thread, at the call
//!   (as `memcpy` would), not later in the thread that completes it.

use firehose::cache::Cache;
use firehose::net::sim::{PostFault, SimNet};
use firehose::net::{Link, Peers, RdmaKind};
use firehose::pin::null::NullPinner;
use firehose::rma::sim_pins::SimPins;
use firehose::rma::Rma;
use firehose::rma::RmaError;
use std::sync::Arc;

#[path = "common/rma_job.rs"]
#[allow(dead_code)]
mod rma_job;
#[path = "common/sim_mem.rs"]
#[allow(dead_code)]
mod sim_mem;
use rma_job::{fh_config, sim_net, unbounded_cache, Servers, BUCKET};
use sim_mem::Rng;

/// The target's bytes: 16 buckets, regions of one bucket (a range across a bucket boundary
/// is two segments).
const TARGET: usize = 16 * BUCKET;

struct Job {
    net: SimNet,
    rmas: Vec<Arc<Rma>>,
    caches: Vec<Arc<Cache>>,
    /// Rank 1's memory (page-aligned inside), filled with a pattern before the job starts.
    mem: Vec<u8>,
    off: usize,
}

impl Job {
    fn new(seed: u64) -> Job {
        let net = sim_net(2, seed, 64);
        let mut mem = vec![0u8; TARGET + BUCKET];
        let off = (BUCKET - mem.as_ptr() as usize % BUCKET) % BUCKET;
        for (i, b) in mem.iter_mut().enumerate() {
            *b = (i as u64)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .rotate_left(17) as u8;
        }
        let (rmas, caches) = (0..2)
            .map(|r| {
                let link: Arc<dyn Link> = net.link(r);
                let peers = Arc::new(Peers::from_link(link, Default::default()).unwrap());
                let cache = unbounded_cache(Arc::new(NullPinner));
                let pins = Box::new(SimPins::new(net.clone(), r));
                let c = fh_config(r, 2, 64, 16, 1);
                (
                    Rma::with_pins(peers, Some(cache.clone()), c, pins).unwrap(),
                    cache,
                )
            })
            .unzip();
        Job {
            net,
            rmas,
            caches,
            mem,
            off,
        }
    }

    fn raddr(&self, at: usize) -> u64 {
        self.mem.as_ptr() as u64 + (self.off + at) as u64
    }

    fn expect(&self, at: usize, len: usize) -> &[u8] {
        &self.mem[self.off + at..self.off + at + len]
    }
}

/// One get of `len` bytes at `at` of the target, started (not waited for).
fn start_get(j: &Job, at: usize, dst: &mut [u8]) -> Result<u64, RmaError> {
    // SAFETY: every caller keeps `dst` alive and untouched until the get is done.
    unsafe {
        j.rmas[0].start(
            RdmaKind::Read,
            1,
            j.raddr(at),
            dst.as_mut_ptr(),
            dst.len(),
            false,
        )
    }
}

#[test]
fn sixteen_threads_of_gets_bring_their_bytes_and_give_every_slot_back() {
    let j = Arc::new(Job::new(21));
    let _serve = Servers::start([j.rmas[1].clone()]);
    let threads: Vec<_> = (0..16u64)
        .map(|t| {
            let j = j.clone();
            std::thread::spawn(move || {
                let mut rng = Rng::new(0xB0B0 + t);
                let mut checked = 0;
                for round in 0..60 {
                    // 1 to 8 gets in flight, each into a buffer of its own.
                    let n = 1 + rng.below(8) as usize;
                    let mut bufs: Vec<(usize, Vec<u8>)> = (0..n)
                        .map(|_| {
                            let len = if rng.below(5) == 0 {
                                257 + rng.below(400) as usize
                            } else {
                                1 + rng.below(256) as usize
                            };
                            // Now and then across a bucket (two regions, two segments).
                            let at = if rng.below(4) == 0 {
                                let b = 1 + rng.below(15) as usize;
                                b * BUCKET - 1 - rng.below(len.min(BUCKET) as u64 - 1) as usize
                            } else {
                                rng.below((TARGET - len) as u64) as usize
                            };
                            (at, vec![0xEE; len])
                        })
                        .collect();
                    let hs: Vec<u64> = bufs
                        .iter_mut()
                        .map(|(at, b)| start_get(&j, *at, b).unwrap())
                        .collect();
                    for h in hs {
                        j.rmas[0].wait(h).unwrap();
                    }
                    for (at, b) in &bufs {
                        assert_eq!(
                            &b[..],
                            j.expect(*at, b.len()),
                            "thread {t} round {round}: {} bytes at {at}",
                            b.len()
                        );
                        checked += 1;
                    }
                }
                checked
            })
        })
        .collect();
    let checked: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(checked > 16 * 60);
    let a = &j.rmas[0];
    a.check_idle().unwrap();
    assert_eq!(j.caches[0].stats().in_use, 0, "no registration left");
    let s = a.stats();
    assert!(s.gets_bounced > 0, "short gets bounced: {s:?}");
    assert!(
        s.gets_bounced < s.gets,
        "gets over 256 bytes registered their buffer"
    );
}

#[test]
fn a_failed_short_get_leaves_the_destination_alone() {
    let j = Job::new(5);
    let _serve = Servers::start([j.rmas[1].clone()]);
    let a = &j.rmas[0];
    // Warm: the range is held, so the next get hits and goes straight to the post (the fast
    // path: the slot then comes back through the refused post's release).
    let mut dst = [0u8; 64];
    let h = start_get(&j, 128, &mut dst).unwrap();
    a.wait(h).unwrap();
    assert_eq!(&dst[..], j.expect(128, 64));
    let bounced = a.stats().gets_bounced;
    for case in 0..3usize {
        // 0: a fast hit; 1: a hit across two regions (table path); 2: a miss (posted later).
        let (at, len) = [(256, 64), (BUCKET - 32, 64), (9 * BUCKET + 8, 100)][case];
        let mut dst = vec![0xA5u8; len];
        j.net.fail_rdma_posts(PostFault::Nth(0));
        let r = start_get(&j, at, &mut dst).and_then(|h| a.wait(h));
        assert!(r.is_err(), "case {case}: the refused get failed ({r:?})");
        assert!(
            dst.iter().all(|&b| b == 0xA5),
            "case {case}: nothing copied into the destination of a failed get"
        );
        a.check_idle()
            .unwrap_or_else(|e| panic!("case {case}: {e}"));
        // The same get again works, through a slot.
        j.net.fail_rdma_posts(PostFault::Off);
        let h = start_get(&j, at, &mut dst).unwrap();
        a.wait(h).unwrap();
        assert_eq!(&dst[..], j.expect(at, len), "case {case}: the retry");
        a.check_idle().unwrap();
    }
    assert!(a.stats().gets_bounced >= bounced + 6, "every one bounced");
    assert_eq!(j.caches[0].stats().in_use, 0);
}

#[test]
fn a_short_get_into_read_only_memory_faults_in_the_callers_thread() {
    let j = Job::new(9);
    // SAFETY: a fresh anonymous page, read-only.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(page, libc::MAP_FAILED);
    // SAFETY: the child only starts the get (which must fault at once) and exits; nothing it
    // does needs another thread of the parent.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: the read-only page, 64 bytes of it: the call touches it and must fault here.
        let dst = unsafe { std::slice::from_raw_parts_mut(page.cast::<u8>(), 64) };
        let r = start_get(&j, 0, dst);
        // Reached only if the destination was not touched.
        unsafe { libc::_exit(if r.is_ok() { 3 } else { 4 }) };
    }
    let mut status = 0;
    // SAFETY: our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSEGV,
        "the child faulted in the call (status {status:#x}; exit 3: the get was started)"
    );
    // SAFETY: the page mapped above.
    unsafe { libc::munmap(page, 4096) };
}
