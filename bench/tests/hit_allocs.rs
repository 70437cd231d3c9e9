//! No heap allocation on the hit path of a blocking put or get (after warm-up), counted by a
//! global allocator: an assertion, not a timing. Over the simulated link (`Rma::with_pins`,
//! `SimPins`, a pin-down cache on the null backend), as `examples/rma_profile.rs` profiles it:
//! an 8-byte put (inline: no local registration), an 8-byte get (its destination through the
//! pin-down cache, a hit), and a 64-byte put with inline off (its source through the cache).
//! The simulator's own work is counted too (it must not allocate per op either, or this test
//! could not see the library's).
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use firehose::internals::cache::{Cache, Limits};
use firehose::internals::net::NetSettings;
use firehose::internals::net::{Delivery, SimConfig, SimNet};
use firehose::internals::net::{Link, Peers, RdmaKind};
use firehose::internals::pin::NullPinner;
use firehose::internals::rma::Rma;
use firehose::internals::rma::SimPins;
use firehose_proto::FirehoseConfig;

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.realloc(p, l, new) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn rank(net: &SimNet, r: u32) -> Arc<Rma> {
    let link: Arc<dyn Link> = net.link(r);
    // No progress thread: nothing else allocates while the loop is counted.
    let peers = Arc::new(Peers::from_link(link, NetSettings::default()).expect("peers"));
    let unbounded = Limits {
        max_pinned: usize::MAX,
        max_regions: usize::MAX,
    };
    let cache = Cache::new(Arc::new(NullPinner), unbounded, None);
    let pins = Box::new(SimPins::new(net.clone(), r));
    Rma::with_pins(peers, Some(cache), FirehoseConfig::new(r, 2), pins).expect("rma")
}

/// Allocations during 1000 blocking ops after 100 of warm-up (rank 1 progressed by a thread
/// during the warm-up only: the first op misses and its move needs the target).
fn allocs_in_1000_hits(inline: usize, kind: RdmaKind, len: usize) -> u64 {
    let net = SimNet::new(SimConfig::new(2, 1, Delivery::Auto));
    net.set_max_inline_write(inline);
    let (a, b) = (rank(&net, 0), rank(&net, 1));
    let target = vec![0u8; 3 * 4096].into_boxed_slice();
    let taddr = (target.as_ptr() as u64 + 4095) & !4095;
    let mut local = vec![0x5Au8; len];
    let lp = local.as_mut_ptr();
    let op = || {
        // SAFETY: `local` outlives the blocking wait and nothing else touches it meanwhile.
        let h = unsafe { a.start(kind, 1, taddr, lp, len, false) }.expect("start");
        a.wait(h).expect("op");
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (s, bb) = (stop.clone(), b.clone());
    let server = std::thread::spawn(move || {
        while !s.load(Relaxed) {
            bb.progress().expect("progress 1");
            std::thread::yield_now();
        }
    });
    for _ in 0..100 {
        op();
    }
    stop.store(true, Relaxed);
    server.join().unwrap();
    let hits0 = a.stats().fh.hits;
    let n = 1000;
    let before = ALLOCS.load(Relaxed);
    for _ in 0..n {
        op();
    }
    let allocs = ALLOCS.load(Relaxed) - before;
    assert_eq!(a.stats().fh.hits - hits0, n, "every counted op must hit");
    a.check_idle().expect("idle");
    drop(local);
    drop(target);
    allocs
}

#[test]
fn a_hit_allocates_nothing() {
    assert_eq!(
        allocs_in_1000_hits(256, RdmaKind::Write, 8),
        0,
        "inline put"
    );
    assert_eq!(allocs_in_1000_hits(256, RdmaKind::Read, 8), 0, "get");
    assert_eq!(
        allocs_in_1000_hits(0, RdmaKind::Write, 64),
        0,
        "put through the cache"
    );
}
