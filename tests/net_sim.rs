//! The active-message layer on the simulated link: storms over many seeds, threads, one-way
//! floods, garbage, drops, silent peers, the progress thread, finalize. Every test ends by
//! checking the flow-control invariant: no message ever arrived without a free slot.

use firehose::net::settings::NetSettings;
use firehose::net::sim::{Delivery, SimConfig, SimNet};
use firehose::net::wire::{Header, Kind, Reject, HEADER_LEN};
use firehose::net::NetError;
use firehose::net::{Am, Rank, Ticket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ECHO: u16 = 1;
const SINK: u16 = 2;

#[path = "common/sim_mem.rs"]
#[allow(dead_code)]
mod sim_mem;
use sim_mem::Rng;

/// The echo handler's answer: the target's rank, then the payload reversed.
fn echo_of(target: Rank, payload: &[u8]) -> Vec<u8> {
    let mut v = target.to_le_bytes().to_vec();
    v.extend(payload.iter().rev());
    v
}

fn job(cfg: SimConfig, settings: NetSettings) -> (SimNet, Vec<Arc<Am>>) {
    let net = SimNet::new(cfg);
    let ams: Vec<Arc<Am>> = (0..cfg.size)
        .map(|r| {
            let am = Arc::new(Am::new(net.link(r), settings).unwrap());
            am.register_request(ECHO, move |_, p, rep| rep.reply(&echo_of(r, p)).unwrap());
            am
        })
        .collect();
    (net, ams)
}

fn no_rejects(am: &Am) {
    let s = am.stats();
    assert_eq!(
        s.rejected_total(),
        0,
        "rank {}: {:?}",
        am.rank(),
        s.rejected
    );
}

/// Request/reply among 8-32 ranks, each rank with many requests out to random peers (itself
/// included), deliveries in an order chosen by the seed, few slots so credits run out: every
/// reply matches its request, nothing is rejected, no slot is ever overrun.
#[test]
fn request_reply_storm_many_seeds() {
    let mut stalls = 0;
    for seed in 0..24u64 {
        let mut rng = Rng::new(seed);
        let size = [8, 16, 32][seed as usize % 3];
        let cfg = SimConfig {
            slots: 4 + rng.below(6) as u32,
            max_msg: 512,
            ..SimConfig::new(size, seed, Delivery::Manual)
        };
        let (net, ams) = job(cfg, NetSettings::default());
        let per_rank = 30;
        let mut left = vec![per_rank; size as usize];
        let mut out: Vec<Vec<(Ticket, Vec<u8>)>> = (0..size).map(|_| Vec::new()).collect();
        let mut rounds = 0;
        while left.iter().any(|&l| l > 0) || out.iter().any(|o| !o.is_empty()) {
            rounds += 1;
            assert!(rounds < 100_000, "seed {seed}: no progress");
            for _ in 0..size {
                let r = rng.below(size as u64) as usize;
                for _ in 0..rng.below(4) {
                    if left[r] == 0 {
                        break;
                    }
                    left[r] -= 1;
                    let peer = rng.below(size as u64) as Rank;
                    // The echo is 4 bytes longer than the request: both must fit.
                    let len = rng.below(ams[r].max_payload() as u64 - 3) as usize;
                    let payload: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                    let t = ams[r].request(peer, ECHO, &payload).unwrap();
                    out[r].push((t, echo_of(peer, &payload)));
                }
                // A rank with nothing of its own outstanding still answers the others.
                ams[r].progress().unwrap();
                let mut i = 0;
                while i < out[r].len() {
                    match ams[r].test(&out[r][i].0).unwrap() {
                        Some(got) => {
                            let (_, want) = out[r].swap_remove(i);
                            assert_eq!(got, want, "seed {seed} rank {r}");
                        }
                        None => i += 1,
                    }
                }
            }
            net.steps(rng.below(4 * size as u64) as usize);
        }
        assert_eq!(net.overruns(), 0, "seed {seed}");
        stalls += ams.iter().map(|a| a.stats().credit_stalls).sum::<u64>();
        ams.iter().for_each(|a| no_rejects(a));
    }
    assert!(
        stalls > 0,
        "the credits were never short: the test tests too little"
    );
}

/// 16 threads issue requests on one endpoint at once (and progress it through their waits),
/// against peers answering from their progress threads.
#[test]
fn sixteen_threads_on_one_endpoint() {
    let cfg = SimConfig {
        slots: 6,
        ..SimConfig::new(4, 3, Delivery::Auto)
    };
    let net = SimNet::new(cfg);
    // Ranks 1..3 answer from a progress thread of their own endpoint; rank 0 has none.
    let ams: Vec<Arc<Am>> = (0..4)
        .map(|r| {
            let s = NetSettings {
                progress_thread: r > 0,
                ..NetSettings::default()
            };
            let am = Am::new(net.link(r), s).unwrap();
            am.register_request(ECHO, move |_, p, rep| rep.reply(&echo_of(r, p)).unwrap());
            Arc::new(am)
        })
        .collect();
    let a = ams[0].clone();
    let threads: Vec<_> = (0..16u32)
        .map(|t| {
            let a = a.clone();
            std::thread::spawn(move || {
                let mut rng = Rng::new(t as u64);
                for i in 0..150u32 {
                    let peer = rng.below(4) as Rank;
                    let mut p = t.to_le_bytes().to_vec();
                    p.extend(i.to_le_bytes());
                    p.extend((0..rng.below(100)).map(|_| rng.next() as u8));
                    let got = a.call(peer, ECHO, &p).unwrap();
                    assert_eq!(got, echo_of(peer, &p));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(net.overruns(), 0);
    assert_eq!(a.outstanding(), 0);
    ams.iter().for_each(|a| no_rejects(a));
}

/// Both sides only send one-way messages and never reply: credits come back only through
/// credit-only messages, and every message arrives with a slot free.
#[test]
fn one_way_floods_both_ways_use_credit_only_messages() {
    for seed in 0..8u64 {
        let cfg = SimConfig {
            slots: 4 + seed as u32 % 4,
            ..SimConfig::new(2, seed, Delivery::Manual)
        };
        let (net, ams) = job(cfg, NetSettings::default());
        let got: Vec<Arc<AtomicU64>> = (0..2).map(|_| Arc::new(AtomicU64::new(0))).collect();
        for (am, g) in ams.iter().zip(&got) {
            let g = g.clone();
            am.register_oneway(SINK, move |from, p| {
                assert_eq!(p, (1 - from).to_le_bytes());
                g.fetch_add(1, Ordering::Relaxed);
            });
        }
        let n = 2000;
        let mut rng = Rng::new(seed);
        let mut sent = [0u64; 2];
        let mut rounds = 0;
        while got.iter().any(|g| g.load(Ordering::Relaxed) < n) {
            rounds += 1;
            assert!(rounds < 1_000_000, "seed {seed}: stuck");
            let r = rng.below(2) as usize;
            for _ in 0..rng.below(8) {
                if sent[r] < n {
                    ams[r]
                        .send_oneway(1 - r as Rank, SINK, &(1 - r as Rank).to_le_bytes())
                        .unwrap();
                    sent[r] += 1;
                }
            }
            if rng.below(3) == 0 {
                ams[rng.below(2) as usize].progress().unwrap();
            }
            net.steps(rng.below(5) as usize);
        }
        assert_eq!(net.overruns(), 0, "seed {seed}");
        for am in &ams {
            let s = am.stats();
            assert!(s.credit_only_sent() > 0, "seed {seed}: {s:?}");
            assert!(s.credit_stalls > 0);
            assert_eq!(s.sent(Kind::Reply), 0);
            no_rejects(am);
        }
    }
}

fn raw(kind: u8, handler: u16, token: u32, payload: &[u8]) -> Vec<u8> {
    let h = Header {
        kind: Kind::OneWay,
        handler,
        credits: 0,
        token,
        len: payload.len() as u32,
    };
    let mut m = vec![0; HEADER_LEN + payload.len()];
    h.encode(&mut m);
    m[2] = kind;
    m[HEADER_LEN..].copy_from_slice(payload);
    m
}

/// Rank 2 sends every kind of malformed message to rank 0 (and a forged reply for a request
/// rank 0 has out to rank 1): each is rejected and counted under its own reason, and rank 0
/// keeps working with rank 1.
#[test]
fn garbage_from_one_peer_is_rejected_and_counted() {
    let (net, ams) = job(SimConfig::new(3, 5, Delivery::Auto), NetSettings::default());
    let (a, b) = (&ams[0], &ams[1]);
    // The first request of a fresh endpoint: token 1 (tokens count up from 1).
    let t = a.request(1, ECHO, b"real").unwrap();
    let garbage: Vec<(Vec<u8>, Reject)> = vec![
        (vec![0xFA, 1, 1], Reject::Truncated),
        (
            raw(3, SINK, 0, b"x").iter().map(|b| b ^ 0xFF).collect(),
            Reject::BadMagic,
        ),
        (
            {
                let mut m = raw(3, SINK, 0, b"");
                m[1] = 9;
                m
            },
            Reject::BadVersion,
        ),
        (raw(6, 0, 0, b""), Reject::UnknownKind),
        (
            {
                let mut m = raw(3, SINK, 0, b"abc");
                m.pop();
                m
            },
            Reject::BadLength,
        ),
        (raw(4, 0, 0, b"payload on credit-only"), Reject::Malformed),
        (raw(1, 999, 7, b"no such handler"), Reject::UnknownHandler),
        (raw(2, 0, 1, b"forged reply"), Reject::UnknownToken),
        (raw(2, 0, 12345, b"stale reply"), Reject::UnknownToken),
    ];
    let mut want = [0u64; Reject::COUNT];
    for (m, why) in &garbage {
        // One at a time: rank 2 injects below its slot count, so only the checks are tested.
        net.inject(2, 0, m);
        a.progress().unwrap();
        want[why.index()] += 1;
    }
    b.progress().unwrap();
    assert_eq!(a.wait(t, None).unwrap(), echo_of(1, b"real"));
    // Then rank 2 says bye; anything after it is too late.
    net.inject(2, 0, &raw(5, 0, 0, b""));
    net.inject(2, 0, &raw(3, SINK, 0, b"after bye"));
    want[Reject::AfterFinalize.index()] += 1;
    a.progress().unwrap();
    assert_eq!(a.stats().rejected, want);
    let t = a.request(1, ECHO, b"still fine").unwrap();
    b.progress().unwrap();
    assert_eq!(a.wait(t, None).unwrap(), echo_of(1, b"still fine"));
    assert_eq!(a.request(2, ECHO, b"").unwrap_err(), NetError::PeerLost);
    assert_eq!(net.overruns(), 0);
}

/// A dropped connection fails the requests out to that peer with PEER_LOST (no hang), later
/// sends to it fail, and the other peers keep working.
#[test]
fn dropped_connection_fails_outstanding_tickets() {
    let (net, ams) = job(SimConfig::new(3, 9, Delivery::Auto), NetSettings::default());
    let a = &ams[0];
    let lost: Vec<Ticket> = (0..5).map(|_| a.request(1, ECHO, b"x").unwrap()).collect();
    let ok = a.request(2, ECHO, b"y").unwrap();
    net.drop_connection(0, 1);
    let t0 = Instant::now();
    for t in lost {
        assert_eq!(a.wait(t, None).unwrap_err(), NetError::PeerLost);
    }
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_eq!(a.request(1, ECHO, b"").unwrap_err(), NetError::PeerLost);
    ams[2].progress().unwrap();
    assert_eq!(a.wait(ok, None).unwrap(), echo_of(2, b"y"));
    assert_eq!(a.stats().peers_lost, 1);
    ams[1].progress().unwrap();
    assert_eq!(ams[1].stats().peers_lost, 1);
    assert_eq!(net.overruns(), 0);
}

/// A peer that dies without any event is found by the probe of a waiting request; a peer that
/// lives but never answers ends in TIMEOUT. Neither hangs.
#[test]
fn silent_peer_found_by_probe_stuck_peer_by_timeout() {
    let s = NetSettings {
        probe: Duration::from_millis(20),
        timeout: Some(Duration::from_secs(30)),
        ..NetSettings::default()
    };
    let (net, ams) = job(SimConfig::new(3, 2, Delivery::Auto), s);
    net.silence(1);
    let t0 = Instant::now();
    let t = ams[0].request(1, ECHO, b"anyone?").unwrap();
    assert_eq!(ams[0].wait(t, None).unwrap_err(), NetError::PeerLost);
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(ams[0].stats().probes >= 1);
    // Rank 2 is alive (probes succeed) but never progresses.
    let t = ams[0].request(2, ECHO, b"busy?").unwrap();
    let e = ams[0]
        .wait(t, Some(Duration::from_millis(200)))
        .unwrap_err();
    assert_eq!(e, NetError::Timeout);
    assert_eq!(net.overruns(), 0);
}

/// The progress thread answers requests while its rank's application thread computes (never
/// calls into the endpoint).
#[test]
fn progress_thread_answers_while_target_computes() {
    let net = SimNet::new(SimConfig::new(2, 4, Delivery::Auto));
    let a = Am::new(net.link(0), NetSettings::default()).unwrap();
    let b = Am::new(
        net.link(1),
        NetSettings {
            progress_thread: true,
            ..NetSettings::default()
        },
    )
    .unwrap();
    b.register_request(ECHO, |_, p, r| r.reply(&echo_of(1, p)).unwrap());
    let computing = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300)); // "compute"
        b
    });
    for i in 0..300u32 {
        let p = i.to_le_bytes();
        assert_eq!(a.call(1, ECHO, &p).unwrap(), echo_of(1, &p));
    }
    let b = computing.join().unwrap();
    assert!(b.stats().progress_wakeups > 0);
    assert_eq!(b.stats().received(Kind::Request), 300);
    drop(b); // stops and joins the thread
    assert_eq!(net.overruns(), 0);
}

/// After finalize: sends fail with FINALIZED, outstanding requests fail, messages that still
/// arrive are rejected, and the peer learns (bye) that this rank is gone.
#[test]
fn finalize_then_traffic_is_rejected() {
    let (net, ams) = job(SimConfig::new(2, 6, Delivery::Auto), NetSettings::default());
    let (a, b) = (&ams[0], &ams[1]);
    a.register_oneway(SINK, |_, _| {});
    b.register_oneway(SINK, |_, _| {});
    let b_out = b.request(0, ECHO, b"never answered").unwrap();
    let a_out = a.request(1, ECHO, b"sent before the bye").unwrap();
    b.finalize().unwrap();
    assert_eq!(b.wait(b_out, None).unwrap_err(), NetError::Finalized);
    assert_eq!(
        b.send_oneway(0, SINK, b"").unwrap_err(),
        NetError::Finalized
    );
    assert_eq!(b.request(1, ECHO, b"").unwrap_err(), NetError::Finalized);
    // a has not seen the bye yet: this leaves, and b rejects it.
    a.send_oneway(1, SINK, b"too late").unwrap();
    b.progress().unwrap();
    assert_eq!(b.stats().rejected(Reject::AfterFinalize), 2);
    // a's progress answers b's request (b rejects that reply too, later) and reads the bye.
    assert_eq!(a.wait(a_out, None).unwrap_err(), NetError::PeerLost);
    assert_eq!(a.request(1, ECHO, b"").unwrap_err(), NetError::PeerLost);
    b.progress().unwrap();
    assert_eq!(b.stats().rejected(Reject::AfterFinalize), 3);
    a.finalize().unwrap();
    assert_eq!(net.overruns(), 0);
}

/// Every rank at once: 8 ranks, 3 threads each issuing requests to random ranks and progressing
/// their own endpoint through their waits (so several threads poll one link concurrently and
/// handlers run on all of them), half the ranks with a progress thread as well.
#[test]
fn all_to_all_with_threads_on_every_rank() {
    let cfg = SimConfig {
        slots: 5,
        ..SimConfig::new(8, 11, Delivery::Auto)
    };
    let net = SimNet::new(cfg);
    let ams: Vec<Arc<Am>> = (0..8)
        .map(|r| {
            let s = NetSettings {
                progress_thread: r % 2 == 1,
                ..NetSettings::default()
            };
            let am = Am::new(net.link(r), s).unwrap();
            am.register_request(ECHO, move |_, p, rep| rep.reply(&echo_of(r, p)).unwrap());
            Arc::new(am)
        })
        .collect();
    let finished = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..24u64)
        .map(|t| {
            let am = ams[(t % 8) as usize].clone();
            let finished = finished.clone();
            std::thread::spawn(move || {
                let mut rng = Rng::new(t);
                for i in 0..100u64 {
                    let peer = rng.below(8) as Rank;
                    let p = (t << 32 | i).to_le_bytes();
                    assert_eq!(am.call(peer, ECHO, &p).unwrap(), echo_of(peer, &p));
                }
                // A rank without a progress thread answers only while someone progresses it.
                finished.fetch_add(1, Ordering::SeqCst);
                while finished.load(Ordering::SeqCst) < 24 {
                    am.progress().unwrap();
                    std::thread::yield_now();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    ams.iter().for_each(|a| no_rejects(a));
    assert_eq!(net.overruns(), 0);
}
