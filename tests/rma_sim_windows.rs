//! Memory windows (`FH_MW`) through the whole driver (`rma::Rma`) on the simulated link: the
//! target's pins give each holder a key of its own (`SimPins::with_windows`, which the simulator
//! checks as a device checks a type 2 window: only the peer it was bound for may use it), the
//! region's own key allows nothing remotely, and a key dies as soon as its holder lets go of
//! the region (not when the region leaves the victim FIFO).
//!
//! Three ranks: 0 is the target (its progress runs on a thread), 1 puts and gets through
//! `Rma`, 2 is a bare link that replays rank 1's keys.

use firehose::net::sim::{SimLink, SimNet};
use firehose::net::{Link, LinkError, LinkEvent, Rank, RdmaKind, RdmaOp};
use firehose::pin::null::NullPinner;
use firehose::rma::sim_pins::SimPins;
use firehose::rma::Rma;
use firehose_proto::{PinFailure, RegionPins, Rights};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[path = "common/rma_job.rs"]
#[allow(dead_code)]
mod rma_job;
use rma_job::{fh_config, peers, sim_net, unbounded_cache, Servers, BUCKET};

/// What the target's pins did: (peer, key) granted and dropped, regions pinned (their own key).
#[derive(Default)]
struct Log {
    granted: Vec<(Rank, u32)>,
    dropped: Vec<(Rank, u32)>,
    region_keys: Vec<u32>,
    live_windows: usize,
    window_errors: u64,
}

struct Logged {
    inner: SimPins,
    log: Arc<Mutex<Log>>,
}

impl Logged {
    fn sync(&self) {
        let mut l = self.log.lock().unwrap();
        l.live_windows = self.inner.live_windows();
        l.window_errors = self.inner.window_errors();
    }
}

impl RegionPins for Logged {
    fn pin(&mut self, addr: u64, len: usize, rights: Rights) -> Result<u32, PinFailure> {
        let k = self.inner.pin(addr, len, rights)?;
        self.log.lock().unwrap().region_keys.push(k);
        Ok(k)
    }
    fn unpin(&mut self, addr: u64, len: usize, rkey: u32) {
        self.inner.unpin(addr, len, rkey);
        self.sync();
    }
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), PinFailure> {
        self.inner.write(addr, data)
    }
    fn key_for(
        &mut self,
        peer: Rank,
        addr: u64,
        len: usize,
        rights: Rights,
        rkey: u32,
    ) -> Result<u32, PinFailure> {
        let k = self.inner.key_for(peer, addr, len, rights, rkey)?;
        self.log.lock().unwrap().granted.push((peer, k));
        self.sync();
        Ok(k)
    }
    fn drop_key(&mut self, peer: Rank, rkey: u32, key: u32) {
        self.inner.drop_key(peer, rkey, key);
        self.log.lock().unwrap().dropped.push((peer, key));
        self.sync();
    }
}

struct Job {
    _server: Servers,
    net: SimNet,
    initiator: Arc<Rma>,
    replayer: Arc<SimLink>,
    log: Arc<Mutex<Log>>,
}

/// `m_buckets`: the target's M (small: the initiator must release firehoses as it moves on).
fn job(windows: bool, m_buckets: usize) -> Job {
    let size = 3;
    let net = sim_net(size, 11, 64);
    let log = Arc::new(Mutex::new(Log::default()));
    let rma = |r: Rank| {
        let cache = unbounded_cache(Arc::new(NullPinner));
        let c = fh_config(r, size, m_buckets, 4, 1);
        let inner = match windows {
            true => SimPins::with_windows(net.clone(), r),
            false => SimPins::new(net.clone(), r),
        };
        let pins = Logged {
            inner,
            log: if r == 0 { log.clone() } else { Arc::default() },
        };
        Rma::with_pins(peers(&net, r), Some(cache), c, Box::new(pins)).unwrap()
    };
    let target = rma(0);
    let initiator = rma(1);
    Job {
        _server: Servers::start([target]),
        replayer: net.link(2),
        net,
        initiator,
        log,
    }
}

fn put(rma: &Rma, raddr: u64, src: &[u8]) {
    // SAFETY: `src` outlives the wait.
    let h = unsafe {
        rma.start(
            RdmaKind::Write,
            0,
            raddr,
            src.as_ptr().cast_mut(),
            src.len(),
            false,
        )
    }
    .unwrap();
    rma.wait(h).unwrap();
}

/// Rank 2 writes `len` bytes of `src` to rank 0 at `raddr` with `rkey`; the op's result.
fn replay(link: &SimLink, raddr: u64, rkey: u32, src: &[u8]) -> Result<(), LinkError> {
    let op = RdmaOp {
        kind: RdmaKind::Write,
        local_addr: src.as_ptr() as u64,
        lkey: 0,
        len: src.len(),
        remote_addr: raddr,
        rkey,
        token: 7,
    };
    // SAFETY: `src` outlives the op (we wait for its completion below); the remote side is the
    // simulator's to check.
    unsafe { link.rdma(0, op) }.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut got = None;
        link.poll(&mut |e| {
            if let LinkEvent::RdmaDone {
                token: 7, result, ..
            } = e
            {
                got = Some(result);
            }
        })
        .unwrap();
        if let Some(r) = got {
            return r;
        }
        assert!(Instant::now() < deadline, "replayed op never completed");
        std::thread::yield_now();
    }
}

/// A put of rank 1 lands; rank 2 replaying the key rank 1 got (or the region's own key) is
/// refused, and the target's bytes stay as rank 1 left them.
#[test]
fn a_key_serves_the_peer_it_was_granted_to_only() {
    let j = job(true, 64);
    let target = vec![0u8; 16 * BUCKET];
    let base = (target.as_ptr() as u64 + BUCKET as u64 - 1) & !(BUCKET as u64 - 1);
    let data: Vec<u8> = (0..2048).map(|i| (i % 251) as u8 + 1).collect();
    put(&j.initiator, base, &data);
    let (granted, region_keys) = {
        let l = j.log.lock().unwrap();
        (l.granted.clone(), l.region_keys.clone())
    };
    assert_eq!(granted.len(), 1, "one firehose for rank 1: {granted:?}");
    assert_eq!(granted[0].0, 1);
    let key = granted[0].1;
    assert!(
        !region_keys.contains(&key),
        "rank 1 got the region's own key"
    );
    let before = bytes_at(base, 64);
    let evil = vec![0xEEu8; 64];
    assert_eq!(
        replay(&j.replayer, base, key, &evil),
        Err(LinkError::RemoteAccess(0)),
        "rank 2 wrote with the key granted to rank 1"
    );
    assert_eq!(bytes_at(base, 64), before);
    assert_eq!(&before[..], &data[..64], "the put itself did not land");
    // The replay broke 2 <-> 0 (as a remote access error breaks an RC connection); the region's
    // own key is tried on a fresh job.
    let j2 = job(true, 64);
    put(&j2.initiator, base, &data);
    let rk = j2.log.lock().unwrap().region_keys[0];
    assert_eq!(
        replay(&j2.replayer, base, rk, &evil),
        Err(LinkError::RemoteAccess(0)),
        "the region's own key allowed a remote write"
    );
    assert_eq!(bytes_at(base, 64), &data[..64]);
    drop(target);
}

/// A copy of `len` bytes at `addr` (memory the simulator may write from other threads: read
/// volatile, only while no op to it runs).
fn bytes_at(addr: u64, len: usize) -> Vec<u8> {
    // SAFETY: the callers pass ranges of their own live buffers.
    (0..len)
        .map(|i| unsafe { std::ptr::read_volatile((addr as *const u8).add(i)) })
        .collect()
}

/// With M of 4 buckets and one bucket per region, rank 1 putting to 32 buckets must let go of
/// firehoses as it goes: every key it let go of is dead at once (the simulator no longer knows
/// it), though its region may still be pinned as a victim, and no region is unpinned under a
/// live window.
#[test]
fn a_key_dies_when_its_holder_lets_go() {
    let j = job(true, 4);
    let target = vec![0u8; 40 * BUCKET];
    let base = (target.as_ptr() as u64 + BUCKET as u64 - 1) & !(BUCKET as u64 - 1);
    for round in 0..3u8 {
        for b in 0..32u64 {
            let data = vec![round.wrapping_mul(32).wrapping_add(b as u8) | 1; 2048];
            put(&j.initiator, base + b * BUCKET as u64, &data);
            assert_eq!(bytes_at(base + b * BUCKET as u64, 2048), data);
        }
    }
    j.initiator.quiet().unwrap();
    let l = j.log.lock().unwrap();
    assert!(l.granted.len() >= 8, "only {} grants", l.granted.len());
    assert!(!l.dropped.is_empty(), "rank 1 never let go of a firehose");
    assert_eq!(
        l.window_errors, 0,
        "a region was unpinned under a live window"
    );
    assert_eq!(l.live_windows, l.granted.len() - l.dropped.len());
    for &(peer, key) in &l.dropped {
        assert_eq!(peer, 1);
        assert!(
            l.granted.contains(&(peer, key)),
            "dropped a key never granted"
        );
        assert!(
            !j.net.deregister(key),
            "key {key:#x} outlived its holder's release"
        );
    }
    drop(l);
    drop(target);
}

/// Without windows (`FH_MW=off`), every holder gets the region's own key: the replay of the
/// first test goes through. (What the windows protect against, shown on the same job.)
#[test]
fn without_windows_a_replayed_key_writes() {
    let j = job(false, 64);
    let target = vec![0u8; 16 * BUCKET];
    let base = (target.as_ptr() as u64 + BUCKET as u64 - 1) & !(BUCKET as u64 - 1);
    let data = vec![5u8; 2048];
    put(&j.initiator, base, &data);
    let key = j.log.lock().unwrap().granted[0].1;
    assert_eq!(replay(&j.replayer, base, key, &[0xEE; 64]), Ok(()));
    assert_eq!(bytes_at(base, 64), vec![0xEE; 64]);
    drop(target);
}
