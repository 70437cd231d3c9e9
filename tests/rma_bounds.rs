//! Every blocking RMA call is bounded, and a peer cannot poison or exhaust a rank.
//! The whole driver (`rma::Rma`) over the simulated link, ranks as threads (`Delivery::Auto`),
//! one case per test: a live peer that never answers (`Timeout` within the bound, no
//! leak, the other peers unaffected), a peer's goodbye (`PeerLost` at once), a target
//! that refuses a move (an error reply, later moves still served), a peer that withholds
//! credits (what is queued for it stays bounded), a forged `QUOTA_SET` (refused, counted).
//!
//! A rank "that never progresses" is one no thread polls: no progress thread, no worker.

use firehose::cache::{Cache, Limits};
use firehose::ffi::{ctx::fh_net_stats, rma::fh_rma_stats};
use firehose::net::settings::NetSettings;
use firehose::net::sim::{Delivery, SimConfig, SimNet};
use firehose::net::{Link, Peers, Rank, RdmaKind};
use firehose::pin::null::NullPinner;
use firehose::rma::sim_pins::SimPins;
use firehose::rma::Rma;
use firehose::rma::RmaError;
use firehose_proto::FirehoseConfig;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

#[path = "common/sim_mem.rs"]
#[allow(dead_code)]
mod sim_mem;
use sim_mem::Buf;

const BUCKET: usize = 4096;

fn config(rank: Rank, size: u32) -> FirehoseConfig {
    let mut c = FirehoseConfig::new(rank, size);
    c.bucket_size = BUCKET;
    c.m_bytes = 16 * BUCKET * (size as usize - 1);
    c.max_victim_bytes = 8 * BUCKET;
    c.max_region_buckets = 4;
    c
}

struct Job {
    net: SimNet,
    rmas: Vec<Arc<Rma>>,
    bufs: Vec<Buf>,
}

/// `size` ranks; `cfg(rank)` gives each its Firehose settings, `ns` the peer layer's.
fn job_with(size: u32, ns: NetSettings, cfg: impl Fn(Rank) -> FirehoseConfig) -> Job {
    let mut sc = SimConfig::new(size, 26, Delivery::Auto);
    sc.slots = ns.recv_depth;
    let net = SimNet::new(sc);
    let unbounded = Limits {
        max_pinned: usize::MAX,
        max_regions: usize::MAX,
    };
    let rmas = (0..size)
        .map(|r| {
            let link: Arc<dyn Link> = net.link(r);
            let peers = Arc::new(Peers::from_link(link, ns).unwrap());
            let cache = Cache::new(Arc::new(NullPinner), unbounded, None);
            let pins = Box::new(SimPins::new(net.clone(), r));
            Rma::with_pins(peers, Some(cache), cfg(r), pins).expect("rma over the simulator")
        })
        .collect();
    Job {
        net,
        rmas,
        bufs: (0..size).map(|_| Buf::new(256 << 10, 0)).collect(),
    }
}

fn job(size: u32, timeout: Duration) -> Job {
    let ns = NetSettings {
        timeout: Some(timeout),
        probe: Duration::from_millis(50),
        ..NetSettings::default()
    };
    job_with(size, ns, |r| config(r, size))
}

/// A thread that progresses `rma` until the returned flag is set.
fn serve(rma: &Arc<Rma>) -> (Arc<AtomicBool>, JoinHandle<()>) {
    let stop = Arc::new(AtomicBool::new(false));
    let (s, r) = (stop.clone(), rma.clone());
    let t = std::thread::spawn(move || {
        while !s.load(SeqCst) {
            let _ = r.progress();
            std::thread::yield_now();
        }
    });
    (stop, t)
}

/// Runs `f` on a thread and waits at most `limit` for it: a wait that never ends is a failure
/// with a message, not a test that hangs (the thread is left behind).
fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("{what}: still waiting after {limit:?}"))
}

/// A blocking op: start, then wait. The buffer is leaked on purpose when the wait never ends
/// (`within` gives up on it while the op may still write it).
fn op(rma: &Rma, kind: RdmaKind, peer: Rank, raddr: u64, len: usize) -> Result<(), RmaError> {
    let buf: &'static mut [u8] = Box::leak(vec![5u8; len].into_boxed_slice());
    // SAFETY: `buf` is leaked: valid for the op whatever happens to the wait.
    let h = unsafe { rma.start(kind, peer, raddr, buf.as_mut_ptr(), len, false) }?;
    rma.wait(h)
}

#[test]
fn silent_live_peer_times_out_within_the_bound_and_leaks_nothing() {
    let bound = Duration::from_millis(300);
    let job = Arc::new(job(3, bound));
    // Rank 1 lives but never progresses; rank 2 is served.
    let (stop, server) = serve(&job.rmas[2]);
    let j = job.clone();
    let (r, took) = within(
        Duration::from_secs(20),
        "get from a silent peer",
        move || {
            let t0 = Instant::now();
            let r = op(&j.rmas[0], RdmaKind::Read, 1, j.bufs[1].addr() + 64, 100);
            (r, t0.elapsed())
        },
    );
    assert_eq!(r, Err(RmaError::Timeout));
    assert!(took >= bound, "gave up early: {took:?}");
    assert!(took < bound * 4, "{took:?} for a bound of {bound:?}");
    // Nothing of the op is left: no chunk, no Firehose op, no reference, no reservation.
    job.rmas[0].check_idle().unwrap();
    assert_eq!(job.rmas[0].peers().am().stats().peers_given_up, 1);
    // As C reads it (`fh_get_net_stats`).
    let c = fh_net_stats::from(&job.rmas[0].peers().am().stats());
    assert_eq!(
        (c.peers_given_up, c.queue_overflows, c.peers_lost),
        (1, 0, 1)
    );
    // The context goes on with the other peers.
    let j = job.clone();
    within(Duration::from_secs(20), "ops to a served peer", move || {
        op(
            &j.rmas[0],
            RdmaKind::Write,
            2,
            j.bufs[2].addr() + 8,
            3 * BUCKET,
        )
        .unwrap();
        op(&j.rmas[0], RdmaKind::Read, 2, j.bufs[2].addr() + 8, 100).unwrap();
        // Later ops to the peer given up on fail at once.
        assert_eq!(
            op(&j.rmas[0], RdmaKind::Read, 1, j.bufs[1].addr(), 8),
            Err(RmaError::PeerLost)
        );
    });
    // An implicit op and `quiet` are bounded the same way.
    let j = job.clone();
    let (r, took) = within(Duration::from_secs(20), "quiet", move || {
        // A fresh context's view: rank 2 stops being served, so its move is never answered.
        let buf: &'static mut [u8] = Box::leak(vec![0u8; 64].into_boxed_slice());
        stop.store(true, SeqCst);
        server.join().unwrap();
        // SAFETY: leaked buffer.
        unsafe {
            j.rmas[0].start(
                RdmaKind::Read,
                2,
                j.bufs[2].addr() + 40_000,
                buf.as_mut_ptr(),
                64,
                true,
            )
        }
        .unwrap();
        let t0 = Instant::now();
        (j.rmas[0].quiet(), t0.elapsed())
    });
    assert_eq!(r, Err(RmaError::Timeout));
    assert!(took < bound * 4, "quiet took {took:?}");
    job.rmas[0].check_idle().unwrap();
    let _ = &job.net;
}

#[test]
fn goodbye_fails_rma_at_once() {
    // A bound far above what the test allows: only the goodbye can end the wait in time.
    let job = Arc::new(job(2, Duration::from_secs(5)));
    let j = job.clone();
    let (tx, rx) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let buf: &'static mut [u8] = Box::leak(vec![0u8; 100].into_boxed_slice());
        // SAFETY: leaked buffer.
        let h = unsafe {
            j.rmas[0].start(
                RdmaKind::Read,
                1,
                j.bufs[1].addr(),
                buf.as_mut_ptr(),
                100,
                false,
            )
        }
        .unwrap();
        tx.send(()).unwrap();
        let r = j.rmas[0].wait(h);
        (r, Instant::now())
    });
    rx.recv().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    // Rank 1 never answered the move; it leaves.
    let bye = Instant::now();
    job.rmas[1].peers().finalize().unwrap();
    let (r, end) = waiter.join().unwrap();
    assert_eq!(r, Err(RmaError::PeerLost));
    let after = end.saturating_duration_since(bye);
    assert!(
        after < Duration::from_secs(1),
        "ended {after:?} after the goodbye"
    );
    // Later ops to it fail at once too, and nothing of the failed one is left.
    let t0 = Instant::now();
    assert_eq!(
        op(&job.rmas[0], RdmaKind::Write, 1, job.bufs[1].addr(), 8),
        Err(RmaError::PeerLost)
    );
    assert!(t0.elapsed() < Duration::from_secs(1));
    job.rmas[0].check_idle().unwrap();
}

#[test]
fn refused_move_is_answered_and_later_moves_are_served() {
    // Rank 1 keeps half the quota rank 0 believes it has (the two disagree on FH_M, which
    // `fh_init` would have refused): a move over rank 1's quota is refused, not dropped.
    let ns = NetSettings {
        timeout: Some(Duration::from_secs(3)),
        ..NetSettings::default()
    };
    let job = Arc::new(job_with(2, ns, |r| {
        let mut c = config(r, 2);
        if r == 1 {
            c.m_bytes = 8 * BUCKET;
        }
        c
    }));
    let (stop, server) = serve(&job.rmas[1]);
    let j = job.clone();
    within(
        Duration::from_secs(20),
        "ops to a refusing target",
        move || {
            let base = j.bufs[1].addr().next_multiple_of(4 * BUCKET as u64);
            let t0 = Instant::now();
            // Three regions of 4 buckets: 12 > 8.
            assert_eq!(
                op(&j.rmas[0], RdmaKind::Read, 1, base, 12 * BUCKET),
                Err(RmaError::PinFailed)
            );
            assert!(
                t0.elapsed() < Duration::from_secs(1),
                "answered, not timed out"
            );
            // One region fits: served (the request ids are still in step).
            op(&j.rmas[0], RdmaKind::Write, 1, base + 64, 100).unwrap();
            op(&j.rmas[0], RdmaKind::Read, 1, base + 64, 100).unwrap();
        },
    );
    stop.store(true, SeqCst);
    server.join().unwrap();
    assert!(job.rmas[1].stats().fh.moves_refused >= 1);
    let c = fh_rma_stats::from(&job.rmas[1].stats());
    assert_eq!(c.moves_refused, job.rmas[1].stats().fh.moves_refused);
    job.rmas[0].check_idle().unwrap();
}

#[test]
fn mismatched_settings_fail_on_every_rank_naming_both_values() {
    use firehose::rma::agree::{self, Agreed};
    let run = |m_of_rank2: usize| -> Vec<Result<(), String>> {
        let job = job(3, Duration::from_secs(10));
        let threads: Vec<_> = (0..3u32)
            .map(|r| {
                let rma = job.rmas[r as usize].clone();
                std::thread::spawn(move || {
                    let mut c = config(r, 3);
                    if r == 2 {
                        c.m_bytes = m_of_rank2;
                    }
                    let mut list = agree::net_settings(rma.peers());
                    list.extend(c.must_agree().iter().map(|&(v, x)| Agreed::new(v, x)));
                    agree::exchange(rma.peers(), &list)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    };
    let same = config(0, 3).m_bytes;
    assert!(run(same).iter().all(Result::is_ok));
    let other = same / 2;
    for (r, res) in run(other).into_iter().enumerate() {
        let msg = res.expect_err("every rank fails");
        let (mine, theirs) = if r == 2 { (other, same) } else { (same, other) };
        assert!(
            msg.contains("FH_M")
                && msg.contains(&format!("has {mine}"))
                && msg.contains(&format!("has {theirs}")),
            "rank {r}: {msg}"
        );
    }
}

/// An active message from `from` as its link would carry it, with no credit given back.
fn raw_oneway(handler: u16, payload: &[u8]) -> Vec<u8> {
    use firehose::net::wire::{Header, Kind, HEADER_LEN};
    let mut m = vec![0u8; HEADER_LEN + payload.len()];
    Header {
        kind: Kind::OneWay,
        handler,
        credits: 0,
        token: 0,
        len: payload.len() as u32,
    }
    .encode(&mut m);
    m[HEADER_LEN..].copy_from_slice(payload);
    m
}

#[test]
fn a_peer_withholding_credits_costs_bounded_memory() {
    use firehose::rma::FIREHOSE_AM;
    use firehose_proto::wire::{encode, Msg};
    let job = job(2, Duration::from_secs(10));
    let rma = &job.rmas[0];
    let limit = 64 << 10;
    rma.peers().am().set_max_queued(limit);
    // Rank 1 never polls (so never gives a credit back) and sends puts-in-move, 16 at a time:
    // every one is answered, and the answers queue at rank 0 for want of credits.
    let dst = job.bufs[0].addr();
    let mut peak = 0;
    let mut req = 0u32;
    for _ in 0..20_000 / 16 {
        for _ in 0..16 {
            req += 1;
            let m = Msg::Move {
                req,
                releases: vec![],
                pins: vec![],
                put: Some((dst, b"12345678")),
            };
            job.net.inject(1, 0, &raw_oneway(FIREHOSE_AM, &encode(&m)));
        }
        while rma.progress().unwrap() > 0 {}
        peak = peak.max(rma.peers().am().queued_bytes(1));
    }
    let s = rma.peers().am().stats();
    assert!(
        peak <= limit + 4096,
        "queued {peak} bytes for a bound of {limit}"
    );
    assert_eq!(s.queue_overflows, 1, "declared lost once: {s:?}");
    assert_eq!(s.peers_given_up, 1);
    let c = fh_net_stats::from(&s);
    assert_eq!((c.queue_overflows, c.peers_given_up), (1, 1), "{c:?}");
    assert_eq!(rma.peers().am().queued_bytes(1), 0, "its queue is dropped");
    rma.check_idle().unwrap();
}

#[test]
fn forged_quota_sets_are_refused_and_counted() {
    use firehose::rma::FIREHOSE_AM;
    use firehose_proto::wire::{encode, Msg};
    let ns = NetSettings {
        timeout: Some(Duration::from_secs(10)),
        ..NetSettings::default()
    };
    let job = Arc::new(job_with(2, ns, |r| {
        let mut c = config(r, 2);
        c.adaptive = true;
        c
    }));
    let (stop, server) = serve(&job.rmas[1]);
    let rma = &job.rmas[0];
    let set = |quota: u64, cut: bool| {
        let m = encode(&Msg::QuotaSet { quota, cut });
        job.net.inject(1, 0, &raw_oneway(FIREHOSE_AM, &m));
        while rma.progress().unwrap() > 0 {}
    };
    // F is 16 buckets, regions 4: a raise nobody asked for, a cut to nothing, a "cut" upward.
    set(1 << 20, false);
    set(0, true);
    set(64, true);
    let s = rma.stats();
    assert_eq!(s.fh.bad_quota_sets, 3, "{s:?}");
    assert_eq!(fh_rma_stats::from(&s).bad_quota_sets, 3);
    assert_eq!(s.rejected, 3);
    // The quota is what it was: 4 regions of rank 1's memory (all of F) can be held, a fifth
    // region waits for one of them, and everything works.
    let j = job.clone();
    within(
        Duration::from_secs(20),
        "ops after forged quota sets",
        move || {
            let base = j.bufs[1].addr().next_multiple_of(4 * BUCKET as u64);
            for i in 0..6u64 {
                op(
                    &j.rmas[0],
                    RdmaKind::Write,
                    1,
                    base + i * 4 * BUCKET as u64,
                    64,
                )
                .unwrap();
            }
        },
    );
    stop.store(true, SeqCst);
    server.join().unwrap();
    rma.check_idle().unwrap();
}
