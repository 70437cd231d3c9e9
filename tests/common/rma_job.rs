//! What the simulated-RMA tests (`tests/rma_sim_windows.rs`, `tests/rma_sim_rights.rs`,
//! `tests/rma_sim_expose.rs`) build a job from: a simulated network, each rank's peers, a cache
//! without limits, a Firehose configuration, and threads that progress the ranks that only
//! serve. Included with `#[path]`; not every test uses every item.

use firehose::cache::{Cache, Limits};
use firehose::net::settings::NetSettings;
use firehose::net::sim::{Delivery, SimConfig, SimNet};
use firehose::net::{Link, Peers, Rank};
use firehose::pin::Pinner;
use firehose::rma::Rma;
use firehose_proto::FirehoseConfig;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;

pub const BUCKET: usize = 4096;

/// `size` ranks on a simulated network (delivery order from `seed`), with the default settings'
/// receive slots and RDMA writes up to `max_inline` bytes inline.
pub fn sim_net(size: u32, seed: u64, max_inline: usize) -> SimNet {
    let mut sc = SimConfig::new(size, seed, Delivery::Auto);
    sc.slots = NetSettings::default().recv_depth;
    let net = SimNet::new(sc);
    net.set_max_inline_write(max_inline);
    net
}

/// Rank `r`'s peers on `net`, with the default settings.
pub fn peers(net: &SimNet, r: Rank) -> Arc<Peers> {
    let link: Arc<dyn Link> = net.link(r);
    Arc::new(Peers::from_link(link, NetSettings::default()).unwrap())
}

/// A cache over `pinner` with no limit on bytes or regions.
pub fn unbounded_cache(pinner: Arc<dyn Pinner>) -> Arc<Cache> {
    let unbounded = Limits {
        max_pinned: usize::MAX,
        max_regions: usize::MAX,
    };
    Cache::new(pinner, unbounded, None)
}

/// Rank `r`'s Firehose configuration in a job of `size`: buckets of `BUCKET`, M of `m_buckets`,
/// a victim list of `victim_buckets`, regions of `region_buckets` at most.
pub fn fh_config(
    r: Rank,
    size: u32,
    m_buckets: usize,
    victim_buckets: usize,
    region_buckets: u32,
) -> FirehoseConfig {
    let mut c = FirehoseConfig::new(r, size);
    c.bucket_size = BUCKET;
    c.m_bytes = m_buckets * BUCKET;
    c.max_victim_bytes = victim_buckets * BUCKET;
    c.max_region_buckets = region_buckets;
    c
}

/// Threads that progress their ranks until dropped (for ranks that only serve; the others
/// progress in their own waits).
pub struct Servers {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Servers {
    pub fn start(rmas: impl IntoIterator<Item = Arc<Rma>>) -> Servers {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = rmas
            .into_iter()
            .map(|rma| {
                let s = stop.clone();
                std::thread::spawn(move || {
                    while !s.load(SeqCst) {
                        rma.progress().unwrap();
                        std::thread::yield_now();
                    }
                })
            })
            .collect();
        Servers { stop, threads }
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
