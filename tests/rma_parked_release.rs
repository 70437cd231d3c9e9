//! The parked release of a fast op (`rma::engine`'s module docs): the completion of a blocking
//! inline put that hit in the front slot publishes its result and leaves its table entry and
//! its firehose release to the next holder of the engine lock. Held to:
//! - every holder sees the ended state: `check_idle` right after each wait finds no request
//!   running and no reference held, whatever ran before (fast puts, puts behind them in the
//!   table, gets, implicit puts, `test`), and no release failed (each ended exactly once), and
//!   no registration is left in use (a fast get's is released by its completion, a short
//!   get's bounce slot given back);
//! - a revoke of the region a parked put used is acked at once (the message's critical section
//!   ends the parked op before it reads the references), and one that crosses a fast put in
//!   flight is acked by that put's completion (which then does not park), both well within
//!   the holder bound;
//! - an op is not fast while another waits for its release: blocked after it started (its
//!   completion sees `eager`), or before it, into an empty front slot (`start` checks
//!   `front_awaited`); progress alone then lets the blocked op go on.

use firehose::cache::Cache;
use firehose::net::settings::NetSettings;
use firehose::net::sim::{Delivery, SimConfig, SimNet};
use firehose::net::{Link, Peers, RdmaKind};
use firehose::pin::null::NullPinner;
use firehose::rma::expose::ExposeMode;
use firehose::rma::sim_pins::SimPins;
use firehose::rma::Rma;
use firehose::rma::RmaError;
use firehose_proto::Rights;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "common/rma_job.rs"]
#[allow(dead_code)]
mod rma_job;
use rma_job::{fh_config, sim_net, unbounded_cache, Servers, BUCKET};

/// Rank 0 and rank 1 over the simulator (inline writes up to 256 bytes: an 8-byte put is fast
/// when it hits), with a holder bound short enough for a missed ack to fail a test quickly.
fn job(mode: ExposeMode) -> Vec<Arc<Rma>> {
    job_m(mode, 64, 8).0
}

/// `job` with Firehose's M of `m_buckets` and regions of up to `region_buckets`.
/// Also each rank's pin-down cache.
fn job_m(
    mode: ExposeMode,
    m_buckets: usize,
    region_buckets: u32,
) -> (Vec<Arc<Rma>>, Vec<Arc<Cache>>) {
    job_on(&sim_net(2, 11, 256), mode, m_buckets, region_buckets)
}

/// `job_m` over `net` (two ranks).
fn job_on(
    net: &SimNet,
    mode: ExposeMode,
    m_buckets: usize,
    region_buckets: u32,
) -> (Vec<Arc<Rma>>, Vec<Arc<Cache>>) {
    let settings = NetSettings {
        timeout: Some(Duration::from_secs(3)),
        probe: Duration::from_millis(50),
        ..NetSettings::default()
    };
    (0..2)
        .map(|r| {
            let link: Arc<dyn Link> = net.link(r);
            let peers = Arc::new(Peers::from_link(link, settings).unwrap());
            let cache = unbounded_cache(Arc::new(NullPinner));
            let c = fh_config(r, 2, m_buckets, 16, region_buckets);
            let pins = Box::new(SimPins::new(net.clone(), r));
            let rma = Rma::with_pins_exposed(peers, Some(cache.clone()), c, pins, mode);
            (rma.unwrap(), cache)
        })
        .unzip()
}

/// A page-aligned target of `len` bytes.
struct Mem(Vec<u8>, usize);

impl Mem {
    fn new(len: usize) -> Mem {
        let v = vec![0u8; len + BUCKET];
        let off = (BUCKET - v.as_ptr() as usize % BUCKET) % BUCKET;
        Mem(v, off)
    }
    fn addr(&self) -> u64 {
        self.0.as_ptr() as u64 + self.1 as u64
    }
    fn byte(&self, off: usize) -> u8 {
        // SAFETY: inside the buffer; no op runs on it when it is read (volatile: the simulator
        // writes through raw pointers).
        unsafe { std::ptr::read_volatile(self.0.as_ptr().add(self.1 + off)) }
    }
}

fn start(rma: &Rma, kind: RdmaKind, raddr: u64, local: &mut [u8], implicit: bool) -> u64 {
    // SAFETY: every caller keeps `local` alive and untouched until the op is done.
    unsafe { rma.start(kind, 1, raddr, local.as_mut_ptr(), local.len(), implicit) }.unwrap()
}

#[test]
fn every_lock_holder_sees_the_parked_release_ended_once() {
    let (rmas, caches) = job_m(ExposeMode::All, 64, 8);
    let _serve = Servers::start([rmas[1].clone()]);
    let (a, mem) = (&rmas[0], Mem::new(64 << 10));
    let mut src = [7u8; 8];
    // The first put misses; the next hit.
    let h = start(a, RdmaKind::Write, mem.addr(), &mut src, false);
    a.wait(h).unwrap();
    let hits = a.stats().fh.hits;
    for i in 0..200u64 {
        let off = (i as usize * 8) % (32 << 10);
        let raddr = mem.addr() + off as u64;
        src = [i as u8; 8];
        match i % 5 {
            // A blocking fast put: parked at its completion, ended by the next holder.
            0 | 1 => {
                let h = start(a, RdmaKind::Write, raddr, &mut src, false);
                a.wait(h).unwrap();
            }
            // Two in flight: the first in the front slot (fast), the second in the table.
            2 => {
                let mut s2 = [i as u8 ^ 0xff; 8];
                let h1 = start(a, RdmaKind::Write, raddr, &mut src, false);
                let h2 = start(a, RdmaKind::Write, raddr + 8, &mut s2, false);
                while a.test(h1).unwrap().is_none() {}
                a.wait(h2).unwrap();
                assert_eq!(mem.byte(off + 8), i as u8 ^ 0xff);
            }
            // Gets (fast too) after a put: a short one through a bounce slot (copied and the
            // slot given back by its completion), and one of 512 bytes whose registration its
            // completion releases.
            3 => {
                let h = start(a, RdmaKind::Write, raddr, &mut src, false);
                a.wait(h).unwrap();
                let mut dst = [0u8; 8];
                let h = start(a, RdmaKind::Read, raddr, &mut dst, false);
                a.wait(h).unwrap();
                assert_eq!(dst, src);
                let mut long = [0u8; 512];
                let h = start(a, RdmaKind::Read, raddr, &mut long, false);
                a.wait(h).unwrap();
                assert_eq!(long[..8], src);
                assert!((0..512).all(|k| long[k] == mem.byte(off + k)), "op {i}");
            }
            // Implicit (never fast), collected by quiet.
            _ => {
                start(a, RdmaKind::Write, raddr, &mut src, true);
                a.quiet().unwrap();
            }
        }
        assert_eq!(mem.byte(off), i as u8, "op {i}");
        // Nothing running, no reference held, no release failed: the parked op was ended, once.
        a.check_idle()
            .unwrap_or_else(|e| panic!("after op {i}: {e}"));
        // Every registration released (a get's by its completion, once).
        assert_eq!(caches[0].stats().in_use, 0, "after op {i}");
    }
    assert!(a.stats().fh.hits >= hits + 200, "the puts hit");
}

/// Rank 1 exposes 64 KiB, and rank 0 puts into it twice (its firehose then held, the front
/// slot's put fast), rank 1 served meanwhile and left alone after: (rank 0, rank 1, the memory).
fn warmed_puts() -> (Arc<Rma>, Arc<Rma>, Mem) {
    let rmas = job(ExposeMode::Declared);
    let (a, t) = (rmas[0].clone(), rmas[1].clone());
    let mem = Mem::new(64 << 10);
    t.expose(mem.addr(), 64 << 10, Rights::BOTH).unwrap();
    let serve = Servers::start([t.clone()]);
    let mut src = [3u8; 8];
    for _ in 0..2 {
        let h = start(&a, RdmaKind::Write, mem.addr(), &mut src, false);
        a.wait(h).unwrap();
    }
    drop(serve);
    (a, t, mem)
}

/// The region rank 0's last (parked) put used is revoked while rank 0 starts nothing: its
/// progress alone handles the revoke, whose critical section ends the parked op first, so the
/// reference is gone and the ack leaves at once.
#[test]
fn a_revoke_after_a_parked_put_is_acked_at_once() {
    let (a, t, mem) = warmed_puts();
    let hits = a.stats().fh.hits;
    let mut src = [4u8; 8];
    let h = start(&a, RdmaKind::Write, mem.addr(), &mut src, false);
    a.wait(h).unwrap();
    assert_eq!(a.stats().fh.hits, hits + 1, "a hit");
    // Rank 0 only progresses (as a progress thread would): no start, no table check.
    let _serve0 = Servers::start([a.clone()]);
    let t0 = Instant::now();
    assert_eq!(t.unexpose(mem.addr(), 64 << 10), Ok(()));
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert_eq!(mem.byte(0), 4);
    let _serve1 = Servers::start([t.clone()]);
    assert_eq!(
        {
            let mut s = [5u8; 8];
            let h = start(&a, RdmaKind::Write, mem.addr(), &mut s, false);
            a.wait(h)
        },
        Err(RmaError::RemoteDenied)
    );
    a.check_idle().unwrap();
}

/// A revoke sent while rank 0's fast put is in flight is acked by rank 0's wait for that put
/// alone (whichever comes first, the put's completion or the message), though rank 0 then starts
/// nothing and no other thread progresses it.
#[test]
fn a_revoke_crossing_a_fast_put_is_acked_by_its_completion() {
    let (a, t, mem) = warmed_puts();
    let mut src = [6u8; 8];
    // Posted, not yet polled (the simulator runs it in rank 0's next poll).
    let h = start(&a, RdmaKind::Write, mem.addr(), &mut src, false);
    let revokes = t.stats().fh.revokes;
    let unexpose = {
        let t = t.clone();
        let addr = mem.addr();
        std::thread::spawn(move || {
            let t0 = Instant::now();
            (t.unexpose(addr, 64 << 10), t0.elapsed())
        })
    };
    // The revoke is on its way to rank 0 before rank 0 polls.
    let until = Instant::now() + Duration::from_secs(2);
    while t.stats().fh.revokes == revokes {
        assert!(Instant::now() < until, "no revoke sent");
        std::thread::yield_now();
    }
    a.wait(h).unwrap();
    assert_eq!(mem.byte(0), 6);
    let (r, took) = unexpose.join().unwrap();
    assert_eq!(r, Ok(()), "acked by the put's completion ({took:?})");
    assert!(took < Duration::from_secs(2), "{took:?}");
    a.check_idle().unwrap();
}

/// An op that blocks for want of quota while a fast put holds the only firehose (M: one bucket
/// per peer): the put's completion must not park it (the blocked op waits for that release),
/// so progress alone (no lock taken by the caller: no start, no table check) lets the blocked
/// get go on and finish.
#[test]
fn a_fast_completion_does_not_park_while_an_op_waits_for_its_release() {
    let rmas = job_m(ExposeMode::All, 2, 2).0;
    let _serve = Servers::start([rmas[1].clone()]);
    let a = &rmas[0];
    let mut mem = Mem::new(128 << 10);
    let far = 64 << 10;
    // The get straddles two buckets: with the put's one, more than the quota.
    let far = far + BUCKET - 4;
    mem.0[mem.1 + far] = 0x77;
    let mut src = [1u8; 8];
    for _ in 0..2 {
        let h = start(a, RdmaKind::Write, mem.addr(), &mut src, false);
        a.wait(h).unwrap();
    }
    let blocked = a.stats().fh.misses;
    // The fast put (posted, not polled), then a get elsewhere: a miss, blocked (the one region
    // the quota allows is held by the put).
    src = [2u8; 8];
    let h1 = start(a, RdmaKind::Write, mem.addr(), &mut src, false);
    let mut dst = [0u8; 8];
    let h2 = start(a, RdmaKind::Read, mem.addr() + far as u64, &mut dst, false);
    assert_eq!(a.stats().fh.misses, blocked + 1);
    let until = Instant::now() + Duration::from_secs(2);
    // SAFETY: `dst` is written by the simulator only; read volatile.
    while unsafe { std::ptr::read_volatile(dst.as_ptr()) } != 0x77 {
        assert!(Instant::now() < until, "the blocked get never went on");
        a.progress().unwrap();
    }
    a.wait(h1).unwrap();
    a.wait(h2).unwrap();
    assert_eq!(mem.byte(0), 2);
    a.check_idle().unwrap();
}

/// A hit that takes an empty front slot while an op is already blocked for want of quota on
/// that peer is not fast (`start`'s `front_awaited` check): the blocked op waits for its
/// release too, so its completion must release under the lock. Driven by hand (the
/// simulator's `Manual` delivery, one RDMA op at a time): an implicit put W takes the front
/// slot and a put X the table, both on the one region the quota allows; W completes alone (the
/// front slot is empty again, X still holds the region); a get elsewhere blocks; then a put H
/// hits the region into the empty front slot. Past that, only progress runs (no start, no
/// test, no wait: no caller takes the engine lock), and the blocked get must still go on.
#[test]
fn a_hit_into_an_empty_front_slot_is_not_fast_while_an_op_is_blocked() {
    let net = SimNet::new(SimConfig {
        slots: NetSettings::default().recv_depth,
        ..SimConfig::new(2, 13, Delivery::Manual)
    });
    net.set_max_inline_write(256);
    let rmas = job_on(&net, ExposeMode::All, 2, 2).0;
    let (a, t) = (&rmas[0], &rmas[1]);
    // Everything moves only here: one step of the network, then both ranks' progress.
    let drive = |what: &str, done: &dyn Fn() -> bool| {
        let until = Instant::now() + Duration::from_secs(2);
        while !done() {
            assert!(Instant::now() < until, "{what}");
            net.step();
            a.progress().unwrap();
            t.progress().unwrap();
        }
    };
    let mut mem = Mem::new(128 << 10);
    // The get straddles two buckets: with the put's region, more than the quota.
    let far = (64 << 10) + BUCKET - 4;
    mem.0[mem.1 + far] = 0x77;
    // Warm: the region of `mem.addr()` held (a miss, then a hit).
    let mut src = [1u8; 8];
    for _ in 0..2 {
        let h = start(a, RdmaKind::Write, mem.addr(), &mut src, false);
        drive("warm-up put", &|| a.test(h).unwrap().is_some());
    }
    drive("messages left over", &|| net.in_flight() == 0);
    let mut w = [2u8; 8];
    let mut x = [3u8; 8];
    start(a, RdmaKind::Write, mem.addr(), &mut w, true);
    let hx = start(a, RdmaKind::Write, mem.addr() + 8, &mut x, false);
    assert_eq!(net.in_flight(), 2, "W and X posted");
    // W's WRITE (first on the pair's FIFO) arrives; rank 0's progress ends W (implicit: under
    // the lock), which frees the front slot. X still holds the region.
    assert!(net.step());
    a.progress().unwrap();
    assert_eq!(mem.byte(0), 2);
    assert_eq!(net.in_flight(), 1, "X still in flight");
    // The get misses and blocks: nothing is sent for it.
    let misses = a.stats().fh.misses;
    let mut dst = [0u8; 8];
    let hb = start(a, RdmaKind::Read, mem.addr() + far as u64, &mut dst, false);
    assert_eq!(a.stats().fh.misses, misses + 1);
    assert_eq!(net.in_flight(), 1, "the get is blocked, not sent");
    // H hits the held region into the empty front slot.
    let hits = a.stats().fh.hits;
    let mut hsrc = [4u8; 8];
    let hh = start(a, RdmaKind::Write, mem.addr() + 16, &mut hsrc, false);
    assert_eq!(a.stats().fh.hits, hits + 1, "H is a hit");
    // Progress alone: X's and H's releases must let the get go on.
    // SAFETY: `dst` is written by the simulator only; read volatile.
    drive("the blocked get never went on", &|| unsafe {
        std::ptr::read_volatile(dst.as_ptr()) == 0x77
    });
    for h in [hx, hb, hh] {
        drive("a request never ended", &|| a.test(h).unwrap().is_some());
    }
    assert_eq!((mem.byte(8), mem.byte(16)), (3, 4));
    a.check_idle().unwrap();
}
