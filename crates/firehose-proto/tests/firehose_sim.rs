//! Deterministic simulation of the Firehose core: N ranks (2..8) in one process, seeded,
//! per-pair FIFO network with random interleaving, fake address spaces, random workloads
//! (working sets below M, between M and M + MAXVICTIM, far above), random unmaps and remaps,
//! lost peers. After every step: pinned <= M + MAXVICTIM on every rank, the device's count
//! agrees, every segment handed out lies in a region pinned with that key and locking pages
//! no older than the invalidations finished before the op was acquired, no unpin while an
//! RDMA uses a key, the core's own bookkeeping invariants. At the end every op completed.

#[path = "../../../tests/common/sim_mem.rs"]
#[allow(dead_code)]
mod sim_mem;
#[path = "firehose_sim/world.rs"]
mod world;

use firehose_proto::{Acquire, FhError, Firehose, FirehoseConfig, WireError};
use world::{Params, Rng, World, BASE};

fn params(seed: u64) -> (Params, u64) {
    let mut g = Rng::new(seed ^ 0x5EED);
    let n = 2 + (seed % 7) as u32;
    let region_buckets = [1u32, 2, 4, 8][g.below(4) as usize];
    let f = (2 * region_buckets as u64).max([4u64, 8, 16, 32][g.below(4) as usize]);
    let victim = [0, f / 2, f, 3 * f][g.below(4) as usize];
    let ws = match seed % 3 {
        0 => (f / 2).max(2) as usize,          // below a peer's share
        1 => (f + victim / 2).max(2) as usize, // around F .. F + victims
        _ => (8 * f) as usize,                 // far above
    };
    let mut cfg = FirehoseConfig::new(0, n);
    cfg.bucket_size = 4096;
    cfg.m_bytes = (f * (n as u64 - 1)) as usize * 4096;
    cfg.max_region_buckets = region_buckets;
    let max_len = cfg.max_op_len().min(12 * 4096);
    let unmap_pct = if g.chance(50) { 6 } else { 0 };
    let p = Params {
        n,
        bucket: 4096,
        region_buckets,
        f_buckets: f,
        victim_buckets: victim,
        pages: ws + 16,
        ws_pages: ws,
        max_len,
        adaptive: g.chance(30),
        busy: (0..n).collect(),
        target: vec![],
        len_max: 0,
    };
    (p, unmap_pct)
}

fn run_seed(seed: u64, steps: u64) -> World {
    let (p, unmap_pct) = params(seed);
    let lose = p.n > 2 && seed % 10 == 7;
    let mut w = World::new(p, seed);
    for i in 0..steps {
        if lose && i == steps / 2 {
            let r = (seed % w.p.n as u64) as u32;
            w.lose(r);
        }
        w.step(45, unmap_pct);
    }
    w.drain();
    w
}

#[test]
fn many_seeds() {
    let seeds: u64 = std::env::var("FH_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let first: u64 = std::env::var("FH_SIM_FIRST")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut totals = [0u64; 5];
    for seed in first..first + seeds {
        eprintln!("seed {seed}");
        let w = run_seed(seed, 1500);
        let st: Vec<_> = w.fh.iter().map(|f| f.stats()).collect();
        totals[0] += st.iter().map(|s| s.hits).sum::<u64>();
        totals[1] += st.iter().map(|s| s.misses).sum::<u64>();
        totals[2] += st.iter().map(|s| s.revokes).sum::<u64>();
        totals[3] += st.iter().map(|s| s.victim_hits).sum::<u64>();
        totals[4] += st
            .iter()
            .map(|s| s.quota_grants + s.quota_cuts)
            .sum::<u64>();
    }
    eprintln!(
        "hits {} misses {} revokes {} victim hits {} quota grants+cuts {}",
        totals[0], totals[1], totals[2], totals[3], totals[4]
    );
    // The workloads must exercise both paths, the revocation and the adaptive lending.
    assert!(
        totals[0] > 1000 && totals[1] > 1000 && totals[2] > 50 && totals[3] > 50 && totals[4] > 50,
        "{totals:?}"
    );
}

/// A small world with busy state for the malformed-message tests.
fn busy_world(seed: u64) -> World {
    let p = Params {
        n: 3,
        bucket: 4096,
        region_buckets: 4,
        f_buckets: 16,
        victim_buckets: 8,
        pages: 80,
        ws_pages: 64,
        max_len: 8192,
        adaptive: false,
        busy: vec![0, 1, 2],
        target: vec![],
        len_max: 0,
    };
    let mut w = World::new(p, seed);
    for _ in 0..400 {
        w.step(45, 4);
    }
    w
}

fn snapshot(w: &World, r: u32) -> String {
    format!("{:?} {:?}", w.fh[r as usize], w.mem[r as usize].mrs.len())
}

/// One malformed or forged message for `to` (from `from`), drawn from `g`.
fn garbage(w: &World, g: &mut Rng) -> Vec<u8> {
    use firehose_proto::wire::{encode, Grant, Msg, PinReq};
    match g.below(8) {
        0 => (0..g.below(64)).map(|_| g.next() as u8).collect(),
        1 => {
            // Well-formed, with random ids and fields.
            let m = match g.below(6) {
                0 => Msg::Move {
                    req: g.below(5) as u32,
                    releases: (0..g.below(3)).map(|_| g.below(50)).collect(),
                    pins: (0..g.below(3))
                        .map(|_| PinReq {
                            start: g.below(1 << 19),
                            nb: g.below(9) as u32,
                            need_off: g.below(5) as u32,
                            need_n: g.below(5) as u32,
                            rights: firehose_proto::Rights(1 + g.below(3) as u8),
                        })
                        .collect(),
                    put: g.chance(30).then_some((g.next(), &[7u8; 9][..])),
                },
                1 => Msg::Reply {
                    req: g.below(1000) as u32 + 1000,
                    grants: vec![Ok(Grant {
                        handle: g.below(50),
                        start: g.below(100),
                        nb: 4,
                        rkey: 1,
                        rights: firehose_proto::Rights::BOTH,
                    })],
                    put: None,
                },
                2 => Msg::RevokeAck((0..1 + g.below(3)).map(|_| g.below(100)).collect()),
                3 => Msg::QuotaWant(1 + g.below(10)),
                4 => Msg::QuotaSet {
                    quota: g.below(100),
                    cut: g.chance(50),
                },
                _ => Msg::QuotaAck(g.below(100)),
            };
            encode(&m)
        }
        // Huge counts with nothing behind them.
        2 => vec![
            1,
            1 + g.below(4) as u8,
            0,
            0,
            0,
            0,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
        ],
        3 => vec![1, 3, 0xff, 0xff],
        _ => {
            // A truncated or bit-flipped copy of a real message in flight.
            let msgs: Vec<&Vec<u8>> = w.net.values().flat_map(|q| q.iter()).collect();
            if msgs.is_empty() {
                return vec![];
            }
            let mut m = msgs[g.below(msgs.len() as u64) as usize].clone();
            if g.chance(50) || m.len() < 3 {
                m.truncate(g.below(m.len() as u64) as usize);
            } else {
                let k = 2 + g.below(m.len() as u64 - 2) as usize;
                m[k] ^= 1 << g.below(8);
            }
            m
        }
    }
}

#[test]
fn malformed_messages_change_nothing() {
    let mut g = Rng::new(99);
    let mut rejected = 0;
    let mut accepted = 0;
    let mut w = busy_world(3);
    for i in 0..4000u64 {
        let to = (i % 3) as u32;
        let from = ((i / 3) % 3) as u32;
        let bytes = garbage(&w, &mut g);
        if from == to {
            assert_eq!(w.inject(from, to, &bytes), Some(WireError::BadSender(from)));
            continue;
        }
        let before = snapshot(&w, to);
        let pinned = w.mem[to as usize].pinned;
        match w.inject(from, to, &bytes) {
            Some(_) => {
                rejected += 1;
                assert_eq!(
                    before,
                    snapshot(&w, to),
                    "state changed by a rejected message {bytes:?}"
                );
                assert_eq!(pinned, w.mem[to as usize].pinned);
            }
            None => {
                // Accepted: a well-formed message that fits the protocol (a revoke of an
                // unknown handle, a flipped key in a grant...): the world model may now be
                // wrong, so start a fresh one.
                accepted += 1;
                w = busy_world(100 + i);
            }
        }
    }
    eprintln!("rejected {rejected} accepted {accepted}");
    assert!(rejected > 2300, "{rejected}");
}

#[test]
fn replayed_and_out_of_protocol_moves_are_refused() {
    use firehose_proto::wire::{decode, Msg};
    let mut w = busy_world(5);
    // Replay every move in flight right after its delivery: refused (request ids, handles).
    let mut refused = 0;
    for _ in 0..200 {
        let keys: Vec<(u32, u32)> = w
            .net
            .iter()
            .filter(|(_, q)| !q.is_empty())
            .map(|(k, _)| *k)
            .collect();
        let Some(&(from, to)) = keys.first() else {
            break;
        };
        let m = w.net.get_mut(&(from, to)).unwrap().pop_front().unwrap();
        let is_move = matches!(decode(&m), Ok(Msg::Move { .. }) | Ok(Msg::Reply { .. }));
        assert_eq!(w.inject(from, to, &m), None);
        if is_move {
            let before = snapshot(&w, to);
            if w.inject(from, to, &m).is_some() {
                refused += 1;
                assert_eq!(before, snapshot(&w, to));
            }
        }
        w.pump();
        w.drain_events();
        w.check();
    }
    assert!(refused > 10, "{refused}");
}

#[test]
fn api_errors_change_nothing() {
    let mut f = Firehose::new(FirehoseConfig::new(1, 4)).unwrap();
    let max = f.config().max_op_len();
    let before = format!("{f:?}");
    assert_eq!(f.acquire(1, 0, 0x1000, 0, None), Err(FhError::ZeroLength));
    assert_eq!(
        f.acquire(1, 0, u64::MAX - 3, 8, None),
        Err(FhError::Overflow)
    );
    assert_eq!(f.acquire(1, 4, 0x1000, 8, None), Err(FhError::BadRank(4)));
    assert_eq!(f.acquire(1, 1, 0x1000, 8, None), Err(FhError::SelfRank));
    assert_eq!(
        f.acquire(1, 0, 0x1000, max + 1, None),
        Err(FhError::TooLong { max })
    );
    assert_eq!(
        f.acquire(1, 0, 0x1000, 8, Some(&[1, 2])),
        Err(FhError::PutLength)
    );
    assert_eq!(f.release(1), Err(FhError::UnknownOp));
    assert_eq!(before, format!("{f:?}"));
    // A pending op cannot be released; a duplicate id is refused.
    assert_eq!(f.acquire(1, 0, 0x1000, 8, None), Ok(Acquire::Pending));
    assert_eq!(f.release(1), Err(FhError::UnknownOp));
    assert_eq!(f.acquire(1, 2, 0x1000, 8, None), Err(FhError::DuplicateOp));
    // The top of the address space is fine.
    assert_eq!(f.acquire(2, 0, u64::MAX - 8, 8, None), Ok(Acquire::Pending));
    assert!(f.poll_transmit().is_some());
}

#[test]
fn hit_after_move_and_double_release() {
    let p = Params {
        n: 2,
        bucket: 4096,
        region_buckets: 4,
        f_buckets: 16,
        victim_buckets: 8,
        pages: 64,
        ws_pages: 64,
        max_len: 8192,
        adaptive: false,
        busy: vec![0],
        target: vec![],
        len_max: 0,
    };
    let mut w = World::new(p, 1);
    assert_eq!(
        w.fh[0].acquire(1, 1, BASE + 100, 8, None),
        Ok(Acquire::Pending)
    );
    // Second miss on the same bucket joins the move in flight.
    assert_eq!(
        w.fh[0].acquire(2, 1, BASE + 200, 8, None),
        Ok(Acquire::Pending)
    );
    w.pump();
    assert_eq!(
        w.net.values().map(|q| q.len()).sum::<usize>(),
        1,
        "one move for both"
    );
    assert_eq!(w.fh[0].stats().hit_pending, 1);
    w.deliver();
    w.pump();
    w.deliver();
    let mut ready = 0;
    while let Some(e) = w.fh[0].poll_event() {
        assert!(matches!(e, firehose_proto::Event::Ready { .. }));
        ready += 1;
    }
    assert_eq!(ready, 2);
    // Now a hit anywhere in the region (4 buckets, aligned).
    match w.fh[0].acquire(3, 1, BASE + 3 * 4096 + 5, 4096, None) {
        Ok(Acquire::Hit(s)) => assert_eq!(s.len(), 2, "the op spans two regions? {s:?}"),
        Ok(Acquire::Pending) => {} // crosses into the next region: a miss there
        other => panic!("{other:?}"),
    }
    match w.fh[0].acquire(4, 1, BASE + 4096, 2 * 4096, None) {
        Ok(Acquire::Hit(s)) => {
            assert_eq!(s.len(), 1, "one region, one segment: {s:?}");
            assert_eq!((s[0].raddr, s[0].len), (BASE + 4096, 8192));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(w.fh[0].release(4), Ok(()));
    assert_eq!(w.fh[0].release(4), Err(FhError::UnknownOp));
    assert_eq!(w.fh[0].release(1), Ok(()));
    assert_eq!(w.fh[0].release(2), Ok(()));
}

/// One rank's one-sided hit rate and its target's victim hits, for a skewed or balanced load.
fn hit_rate(adaptive: bool, busy: Vec<u32>, ws_pages: usize, seed: u64) -> (f64, u64, u64) {
    let n = 5;
    let target = busy.iter().map(|_| Some(0)).collect();
    let p = Params {
        n,
        bucket: 4096,
        region_buckets: 1,
        f_buckets: 32,
        victim_buckets: 32,
        pages: ws_pages + 16,
        ws_pages,
        max_len: 4096,
        adaptive,
        busy: busy.clone(),
        target,
        len_max: 64,
    };
    let mut w = World::new(p, seed);
    // Warm up, then measure.
    for _ in 0..6000 {
        w.step(45, 0);
    }
    let before: Vec<_> = w.fh.iter().map(|f| f.stats()).collect();
    for _ in 0..30000 {
        w.step(45, 0);
    }
    w.drain();
    let (mut h, mut m) = (0, 0);
    for &r in &busy {
        let (a, b) = (before[r as usize], w.fh[r as usize].stats());
        h += b.hits - a.hits;
        m += b.misses - a.misses;
    }
    let t = w.fh[0].stats();
    (
        h as f64 / (h + m) as f64,
        t.victim_hits,
        t.quota_grants + t.quota_cuts,
    )
}

/// Adaptive lending against the fixed split (run with --nocapture to see the table): one busy
/// peer with a working set of 3F at rank 0 (F = 32 pages, M = 4F) gains; a balanced load of
/// four peers at 1.5F each loses nothing; the bound holds throughout (checked every step).
#[test]
fn adaptive_vs_fixed_split() {
    let mut rows = Vec::new();
    for (name, busy, ws) in [
        ("skewed 1 peer, ws 3F", vec![1], 96),
        ("skewed 1 peer, ws 1.5F", vec![1], 48),
        ("balanced 4 peers, ws 1.5F", vec![1, 2, 3, 4], 48),
        ("balanced 4 peers, ws 0.75F", vec![1, 2, 3, 4], 24),
    ] {
        let fixed = hit_rate(false, busy.clone(), ws, 7);
        let adapt = hit_rate(true, busy.clone(), ws, 7);
        eprintln!(
            "{name:28} fixed hit {:6.2} % (victim hits {:5})  adaptive hit {:6.2} % (victim hits {:5}, quota msgs {})",
            fixed.0 * 100.0, fixed.1, adapt.0 * 100.0, adapt.1, adapt.2
        );
        rows.push((fixed.0, adapt.0));
    }
    assert!(
        rows[0].1 > rows[0].0 + 0.2,
        "lending must help a skewed load: {rows:?}"
    );
    assert!(
        rows[1].1 > 0.95,
        "a 1.5F working set fits with lending: {rows:?}"
    );
    assert!(
        rows[2].1 >= rows[2].0 - 0.05,
        "lending must not hurt a balanced load: {rows:?}"
    );
}

/// A peer that asks for more than its share F is refused, and nothing is pinned for it: the
/// per-peer bound is enforced by the target, not trusted to the initiator. The refusal is an
/// answer (every pin `Refused`: the move's ops fail instead of waiting for ever), and the next
/// move in sequence is served (a refused move does not desynchronise the request ids).
#[test]
fn over_quota_move_is_refused() {
    use firehose_proto::wire::{decode, encode, Msg, PinReq, RemoteError};
    let mut w = busy_world(11);
    let pin = |i: u64| PinReq {
        start: (BASE >> 12) + 4 * i,
        nb: 4,
        need_off: 0,
        need_n: 1,
        rights: firehose_proto::Rights::BOTH,
    };
    // Rank 1's replies to rank 2 queued so far (the world sends them at its next step).
    let replies = |w: &mut World| -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        while let Some((to, m)) = w.fh[1].poll_transmit() {
            if to == 2 {
                v.push(m);
            }
        }
        v
    };
    replies(&mut w);
    // The request id must be the next one rank 2 would use: try them in turn (the wrong ones
    // are dropped as UnknownRequest, without change or answer).
    for req in 1..400u32 {
        let m = Msg::Move {
            req,
            releases: vec![],
            pins: (0..5).map(pin).collect(), // 20 buckets > F = 16
            put: None,
        };
        let before = snapshot(&w, 1);
        let (pins, refused) = (w.fh[1].stats().pins, w.fh[1].stats().moves_refused);
        let e = w.inject(2, 1, &encode(&m));
        if e == Some(WireError::UnknownRequest) {
            assert_eq!(before, snapshot(&w, 1));
            continue;
        }
        assert_eq!(e, None, "an over-quota move in sequence is answered");
        assert_eq!(w.fh[1].stats().pins, pins, "nothing pinned for it");
        assert_eq!(w.fh[1].stats().moves_refused, refused + 1);
        w.fh[1].check_invariants().unwrap();
        let out = replies(&mut w);
        let last = decode(out.last().expect("a reply")).unwrap();
        assert_eq!(
            last,
            Msg::Reply {
                req,
                grants: vec![Err(RemoteError::Refused); 5],
                put: None
            }
        );
        // The next move in sequence is served.
        let next = Msg::Move {
            req: req + 1,
            releases: vec![],
            pins: vec![],
            put: Some((BASE, b"after")),
        };
        assert_eq!(w.inject(2, 1, &encode(&next)), None);
        let out = replies(&mut w);
        assert!(
            matches!(decode(out.last().expect("a reply")).unwrap(), Msg::Reply { req: r, .. } if r == req + 1)
        );
        return;
    }
    panic!("never reached the quota check");
}

/// Pins that only count (every address is mapped): for the small-put pinning policy.
#[derive(Default)]
struct CountPins {
    pins: u64,
    next: u32,
}

impl firehose_proto::RegionPins for CountPins {
    fn pin(
        &mut self,
        _: u64,
        _: usize,
        _: firehose_proto::Rights,
    ) -> Result<u32, firehose_proto::PinFailure> {
        self.pins += 1;
        self.next += 1;
        Ok(self.next)
    }
    fn unpin(&mut self, _: u64, _: usize, _: u32) {}
    fn write(&mut self, _: u64, _: &[u8]) -> Result<(), firehose_proto::PinFailure> {
        Ok(())
    }
}

/// Rank 0 puts 8 bytes at a time to random slots of rank 1's first `ws` bytes, `n` puts per
/// phase `(ws, n)` (blocking: each put completes before the next); region mode, F = 1 MiB,
/// MAXVICTIM 512 KiB. Returns (hit rate, target pins, unpinned puts in moves) over the last
/// 4000 puts.
fn small_puts(auto: bool, phases: &[(u64, u64)], seed: u64) -> (f64, u64, u64) {
    use firehose_proto::Event;
    let mk = |r| {
        let mut c = FirehoseConfig::new(r, 2);
        c.bucket_size = 4096;
        c.m_bytes = 1 << 20;
        c.max_victim_bytes = 512 << 10;
        c.max_region_buckets = 32;
        c.small_put_pins_auto = auto;
        Firehose::new(c).unwrap()
    };
    let (mut a, mut b) = (mk(0), mk(1));
    let (mut pa, mut pb) = (CountPins::default(), CountPins::default());
    let mut rng = Rng::new(seed);
    let mut before = (a.stats(), 0);
    let total: u64 = phases.iter().map(|p| p.1).sum();
    let wss = phases
        .iter()
        .flat_map(|&(ws, n)| std::iter::repeat(ws).take(n as usize));
    for (op, ws) in (1..=total).zip(wss) {
        if op == total - 3999 {
            before = (a.stats(), pb.pins);
        }
        let raddr = BASE + rng.below(ws / 8) * 8;
        match a.acquire(op, 1, raddr, 8, Some(&[7u8; 8])).unwrap() {
            Acquire::Hit(_) => a.release(op).unwrap(),
            Acquire::DoneInMove => loop {
                while let Some((_, m)) = a.poll_transmit() {
                    b.handle_message(0, &m, &mut pb).unwrap();
                }
                while let Some((_, m)) = b.poll_transmit() {
                    a.handle_message(1, &m, &mut pa).unwrap();
                }
                match a.poll_event() {
                    Some(Event::PutDone { op: o }) if o == op => break,
                    Some(e) => panic!("unexpected {e:?}"),
                    None => {}
                }
            },
            Acquire::Pending => panic!("a small put never waits for a pin"),
        }
    }
    let (s, s0) = (a.stats(), before.0);
    let (h, m) = (s.hits - s0.hits, s.misses - s0.misses);
    (
        h as f64 / (h + m) as f64,
        pb.pins - before.1,
        s.puts_in_move_unpinned - s0.puts_in_move_unpinned,
    )
}

/// `FH_SMALL_PUT_PINS=auto`: below M every small-put miss still pins (the hit rate reaches
/// 100 %, as with `always`); far past M + MAXVICTIM, where firehoses are evicted unused, the
/// target pins a fraction of what `always` makes it pin, at no loss of hit rate; and when the
/// puts turn local again after that, pinning resumes and the hit rate comes back.
#[test]
fn small_puts_stop_pinning_only_when_pinning_does_not_pay() {
    let below = [(768 << 10, 6000)];
    let (h_auto, p_auto, u_auto) = small_puts(true, &below, 3);
    let (h_always, p_always, u_always) = small_puts(false, &below, 3);
    eprintln!("below M: auto hit {h_auto:.3} pins {p_auto} unpinned {u_auto}; always hit {h_always:.3} pins {p_always}");
    assert_eq!(
        (h_auto, u_auto, u_always),
        (1.0, 0, 0),
        "below M nothing changes"
    );
    assert_eq!(p_auto, p_always);

    let past = [(6 << 20, 6000)];
    let (h_auto, p_auto, u_auto) = small_puts(true, &past, 3);
    let (h_always, p_always, u_always) = small_puts(false, &past, 3);
    eprintln!("past the bound: auto hit {h_auto:.3} pins {p_auto} unpinned {u_auto}; always hit {h_always:.3} pins {p_always}");
    assert_eq!(u_always, 0);
    assert!(u_auto > 2000, "most misses ride unpinned: {u_auto}");
    assert!(
        p_auto * 4 < p_always,
        "pins: auto {p_auto}, always {p_always}"
    );
    assert!(
        h_auto >= h_always - 0.05,
        "hit rate: auto {h_auto}, always {h_always}"
    );

    // Scattered, then a hot set of 512 KiB: measured over its last 4000 puts.
    let (h_auto, _, _) = small_puts(true, &[(6 << 20, 6000), (512 << 10, 12000)], 3);
    eprintln!("scattered then local: auto hit {h_auto:.3}");
    assert!(
        h_auto > 0.99,
        "pinning resumes once it pays: hit rate {h_auto}"
    );
}

/// Two ranks in page mode (regions of one bucket), M = `m_buckets` pages, MAXVICTIM one page.
fn page_mode_pair(m_buckets: usize) -> (Firehose, Firehose) {
    let mk = |r| {
        let mut c = FirehoseConfig::new(r, 2);
        c.bucket_size = 4096;
        c.m_bytes = m_buckets * 4096;
        c.max_victim_bytes = 4096;
        c.max_region_buckets = 1;
        Firehose::new(c).unwrap()
    };
    (mk(0), mk(1))
}

/// Carries messages between `a` (rank 0) and `b` (rank 1) until op `op` of `a` is Ready.
fn until_ready(a: &mut Firehose, b: &mut Firehose, op: u64) {
    use firehose_proto::Event;
    let mut pins = CountPins::default();
    loop {
        while let Some((_, m)) = a.poll_transmit() {
            b.handle_message(0, &m, &mut pins).unwrap();
        }
        while let Some((_, m)) = b.poll_transmit() {
            a.handle_message(1, &m, &mut CountPins::default()).unwrap();
        }
        match a.poll_event() {
            Some(Event::Ready { op: o, .. }) if o == op => return,
            Some(e) => panic!("unexpected {e:?}"),
            None => {}
        }
    }
}

/// Pins buckets `0..n` of rank 1 for `a` (each its own region, ops 100..100+n), all released:
/// every later op inside them is a hit.
fn pin_buckets(a: &mut Firehose, b: &mut Firehose, n: u64) {
    for k in 0..n {
        assert_eq!(
            a.acquire(100 + k, 1, BASE + k * 4096, 8, None),
            Ok(Acquire::Pending)
        );
        until_ready(a, b, 100 + k);
        a.release(100 + k).unwrap();
    }
}

/// The unused FIFO evicts the least recently released firehose: a hit leaves its firehose in
/// place in the FIFO (lazy removal), so the eviction scan must give a firehose released since
/// it was queued a second chance. F = 2 regions of one bucket: A and B are pinned (A first),
/// A is used again, then C needs room: B goes, A stays (it hits afterwards).
#[test]
fn eviction_takes_the_least_recently_released() {
    let (mut a, mut b) = page_mode_pair(2);
    let mut put = |op: u64, bucket: u64| -> bool {
        let hit = match a.acquire(op, 1, BASE + bucket * 4096, 8, None).unwrap() {
            Acquire::Hit(_) => true,
            Acquire::Pending => {
                until_ready(&mut a, &mut b, op);
                false
            }
            Acquire::DoneInMove => panic!("no small put here"),
        };
        a.release(op).unwrap();
        a.check_invariants().unwrap();
        hit
    };
    assert!(!put(1, 0), "A misses");
    assert!(!put(2, 1), "B misses");
    assert!(put(3, 0), "A hits");
    assert!(!put(4, 2), "C misses and evicts one of A, B");
    assert!(put(5, 0), "A, released last, was kept");
    assert!(!put(6, 1), "B, released before A, was evicted");
}

/// Hits wait for their release in the op table's front slot when it is free, in the table
/// otherwise: ids stay unique across both, either can be released first, a release is good
/// once, and a hit over three firehoses goes to the table. Checked against the invariants
/// (refs held equal what the live ops hold) after every step.
#[test]
fn hits_in_the_front_slot_and_the_table() {
    let (mut a, mut b) = page_mode_pair(64);
    pin_buckets(&mut a, &mut b, 4);
    let ok = |a: &Firehose| a.check_invariants().unwrap();
    let hit = |r: Result<Acquire, FhError>| matches!(r, Ok(Acquire::Hit(_)));
    assert_eq!(a.refs_held(), 0);
    // Op 1 takes the front slot (one firehose), op 2 the table (two), op 3 the table (three).
    assert!(hit(a.acquire(1, 1, BASE, 8, None)));
    assert_eq!(
        a.acquire(1, 1, BASE + 4096, 8, None),
        Err(FhError::DuplicateOp),
        "an id in the front slot is taken"
    );
    assert_eq!(
        a.acquire(1, 1, BASE + 40 * 4096, 8, None),
        Err(FhError::DuplicateOp),
        "by a miss too"
    );
    assert!(hit(a.acquire(2, 1, BASE + 4096 - 4, 8, None)));
    assert_eq!(
        a.acquire(2, 1, BASE, 8, None),
        Err(FhError::DuplicateOp),
        "an id in the table is taken"
    );
    assert!(hit(a.acquire(3, 1, BASE + 4096 - 4, 4096 + 8, None)));
    ok(&a);
    assert_eq!(a.ops_in_flight(), 3);
    assert_eq!(a.refs_held(), 1 + 2 + 3);
    // Release out of order; each once.
    assert_eq!(a.release(2), Ok(()));
    assert_eq!(a.release(2), Err(FhError::UnknownOp));
    assert_eq!(a.release(1), Ok(()));
    assert_eq!(a.release(1), Err(FhError::UnknownOp));
    ok(&a);
    assert_eq!(a.refs_held(), 3);
    // The front slot is free again while op 3 sits in the table: op 4 (two firehoses) takes it.
    assert!(hit(a.acquire(4, 1, BASE + 2 * 4096 - 4, 8, None)));
    assert_eq!(a.ops_in_flight(), 2);
    assert_eq!(a.refs_held(), 5);
    assert_eq!(a.release(3), Ok(()));
    assert_eq!(a.release(4), Ok(()));
    assert_eq!(a.release(4), Err(FhError::UnknownOp));
    ok(&a);
    assert_eq!((a.ops_in_flight(), a.refs_held()), (0, 0));
}

/// Carries messages between `a` (rank 0) and `b` (rank 1) until neither has any to send.
fn carry(a: &mut Firehose, b: &mut Firehose, pins: &mut CountPins) {
    loop {
        let mut n = 0;
        while let Some((_, m)) = a.poll_transmit() {
            b.handle_message(0, &m, pins).unwrap();
            n += 1;
        }
        while let Some((_, m)) = b.poll_transmit() {
            a.handle_message(1, &m, &mut CountPins::default()).unwrap();
            n += 1;
        }
        if n == 0 {
            return;
        }
    }
}

/// The front slot's release of a one-firehose hit drops that firehose's ref once: a firehose
/// another op still holds keeps the other's ref, and one the target revoked while the front
/// op held it is acked at the release (the target's invalidation waits until then), once.
#[test]
fn the_front_release_drops_its_ref_once_and_acks_a_revoked_firehose() {
    let (mut a, mut b) = page_mode_pair(64);
    pin_buckets(&mut a, &mut b, 2);
    let ok = |a: &Firehose| a.check_invariants().unwrap();
    let hit = |r: Result<Acquire, FhError>| matches!(r, Ok(Acquire::Hit(_)));
    // Ops 1 (front slot) and 2 (table) on bucket 0's firehose.
    assert!(hit(a.acquire(1, 1, BASE, 8, None)));
    assert!(hit(a.acquire(2, 1, BASE + 64, 8, None)));
    assert_eq!(a.refs_held(), 2);
    assert_eq!(a.release(1), Ok(()));
    assert_eq!(a.refs_held(), 1, "op 2 still holds it");
    ok(&a);
    assert_eq!(a.release(2), Ok(()));
    assert_eq!(a.refs_held(), 0);
    ok(&a);
    // Op 3 (front slot) holds bucket 1's firehose while the target revokes it.
    assert!(hit(a.acquire(3, 1, BASE + 4096, 8, None)));
    let mut pins = CountPins::default();
    let id = b.invalidate(BASE + 4096, 4096, &mut pins);
    carry(&mut a, &mut b, &mut pins);
    assert!(!b.invalidation_done(id), "op 3 holds the firehose");
    ok(&a);
    assert_eq!(a.release(3), Ok(()));
    assert_eq!(a.release(3), Err(FhError::UnknownOp));
    carry(&mut a, &mut b, &mut pins);
    assert!(b.invalidation_done(id), "acked at the release");
    ok(&a);
    assert_eq!((a.ops_in_flight(), a.refs_held()), (0, 0));
    // Bucket 0's firehose is still there (a hit); bucket 1's is gone (a miss).
    assert!(hit(a.acquire(4, 1, BASE, 8, None)));
    assert_eq!(a.release(4), Ok(()));
    assert_eq!(a.acquire(5, 1, BASE + 4096, 8, None), Ok(Acquire::Pending));
}

/// `acquire_hit` (a driver's fast path) takes exactly `acquire`'s one-region hit into the free
/// front slot, and on anything else returns `None` with nothing changed; what it took is
/// released as any op.
#[test]
fn the_fast_hit_is_the_front_slot_hit_and_nothing_else() {
    use firehose_proto::Rights;
    let (mut a, mut b) = page_mode_pair(64);
    pin_buckets(&mut a, &mut b, 2);
    let ok = |a: &Firehose| a.check_invariants().unwrap();
    let hits = a.stats().hits;
    // Nothing there for a miss, two regions, bad arguments, this rank: no change.
    let none = [
        (1, 1, BASE + 40 * 4096, 8, Rights::WRITE),
        (1, 1, BASE + 4096 - 4, 8, Rights::WRITE),
        (1, 1, BASE, 0, Rights::WRITE),
        (1, 1, u64::MAX - 4, 8, Rights::WRITE),
        (1, 1, BASE, 1 << 40, Rights::WRITE),
        (1, 0, BASE, 8, Rights::WRITE),
        (1, 9, BASE, 8, Rights::WRITE),
        (1, 1, BASE, 8, Rights(0)),
    ];
    for (op, peer, raddr, len, r) in none {
        assert_eq!(
            a.acquire_hit(op, peer, raddr, len, r),
            None,
            "{raddr:#x}+{len}"
        );
    }
    assert_eq!(
        (a.stats().hits, a.refs_held(), a.ops_in_flight()),
        (hits, 0, 0)
    );
    ok(&a);
    let seg = a
        .acquire_hit(1, 1, BASE + 8, 16, Rights::WRITE)
        .expect("a hit");
    assert_eq!((seg.raddr, seg.len), (BASE + 8, 16));
    // The same segment from the general path (op 2 goes to the table).
    match a.acquire(2, 1, BASE + 8, 16, None) {
        Ok(Acquire::Hit(s)) => {
            assert_eq!(s.len(), 1);
            assert_eq!(
                (s[0].raddr, s[0].len, s[0].rkey),
                (seg.raddr, seg.len, seg.rkey)
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        (a.stats().hits, a.refs_held(), a.ops_in_flight()),
        (hits + 2, 2, 2)
    );
    // The front slot is taken: the fast path steps aside; so for a duplicate id.
    assert_eq!(a.acquire_hit(3, 1, BASE, 8, Rights::WRITE), None);
    assert_eq!(a.release(1), Ok(()));
    assert_eq!(
        a.acquire_hit(2, 1, BASE, 8, Rights::WRITE),
        None,
        "op 2 is in the table"
    );
    assert_eq!(a.acquire(2, 1, BASE, 8, None), Err(FhError::DuplicateOp));
    ok(&a);
    assert_eq!(a.release(2), Ok(()));
    assert_eq!(a.release(1), Err(FhError::UnknownOp));
    ok(&a);
    assert_eq!((a.ops_in_flight(), a.refs_held()), (0, 0));
}

/// `pass_front` (a driver ending the front slot's op as it starts the next) leaves what
/// `release` then `acquire_hit` leave: the reference passes to the new op on the same
/// firehose (refs, invariants, hits, and the eviction order: the firehose counts as released
/// last), and it steps aside, changing nothing, for another firehose, an old op that is not
/// in the front slot, or a revoked firehose (whose release must send the ack; `front_awaited`
/// says so meanwhile).
#[test]
fn passing_the_front_slot_is_a_release_then_a_hit() {
    use firehose_proto::Rights;
    let w = Rights::WRITE;
    // F = 2 regions of one bucket: A (bucket 0) and B (bucket 1) pinned, A first.
    let (mut a, mut b) = page_mode_pair(2);
    pin_buckets(&mut a, &mut b, 2);
    let ok = |a: &Firehose| a.check_invariants().unwrap();
    let hits = a.stats().hits;
    assert!(a.acquire_hit(1, 1, BASE, 8, w).is_some());
    assert!(!a.front_awaited());
    // Not the front op, another firehose: nothing changes.
    assert_eq!(a.pass_front(9, 2, 1, BASE, 8, w), None);
    assert_eq!(a.pass_front(1, 2, 1, BASE + 4096, 8, w), None);
    assert_eq!(
        (a.refs_held(), a.ops_in_flight(), a.stats().hits),
        (1, 1, hits + 1)
    );
    // Op 1's reference passes to op 2 (A again).
    let seg = a.pass_front(1, 2, 1, BASE + 16, 8, w).expect("passed");
    assert_eq!((seg.raddr, seg.len), (BASE + 16, 8));
    assert_eq!(
        (a.refs_held(), a.ops_in_flight(), a.stats().hits),
        (1, 1, hits + 2)
    );
    ok(&a);
    assert_eq!(a.release(1), Err(FhError::UnknownOp), "op 1 is over");
    assert_eq!(a.release(2), Ok(()));
    assert_eq!((a.refs_held(), a.ops_in_flight()), (0, 0));
    ok(&a);
    // A was released last: C's miss evicts B, and A still hits.
    assert_eq!(
        a.acquire(3, 1, BASE + 2 * 4096, 8, None),
        Ok(Acquire::Pending)
    );
    until_ready(&mut a, &mut b, 3);
    a.release(3).unwrap();
    assert!(a.acquire_hit(4, 1, BASE, 8, w).is_some(), "A kept");
    a.release(4).unwrap();
    assert!(
        a.acquire_hit(5, 1, BASE + 4096, 8, w).is_none(),
        "B evicted"
    );
    ok(&a);
    // A revoked while op 6 holds it: awaited, not passed; the release acks it.
    assert!(a.acquire_hit(6, 1, BASE, 8, w).is_some());
    let mut pins = CountPins::default();
    let id = b.invalidate(BASE, 4096, &mut pins);
    carry(&mut a, &mut b, &mut pins);
    assert!(a.front_awaited(), "the target waits for the release");
    assert_eq!(a.pass_front(6, 7, 1, BASE, 8, w), None);
    assert_eq!(a.release(6), Ok(()));
    assert!(!a.front_awaited());
    carry(&mut a, &mut b, &mut pins);
    assert!(b.invalidation_done(id));
    ok(&a);
    assert_eq!((a.refs_held(), a.ops_in_flight()), (0, 0));
}
