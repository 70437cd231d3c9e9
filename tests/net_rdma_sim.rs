//! One-sided RDMA on the simulated link (`Link::rdma`, `LinkEvent::RdmaDone`, `SimNet::register`):
//! random writes and reads land byte-exact and report their token exactly once, a write then a
//! send on one pair arrive in that order, bad keys and ranges fail with `RemoteAccess` and lose
//! the peer (outstanding ops fail first), bad arguments are refused with nothing posted, 16
//! threads post at once, the AM endpoint passes completions up to its RDMA handler, and posts
//! refused on purpose (`SimNet::fail_rdma_posts`) report nothing and leave the connection up.

use firehose::net::settings::NetSettings;
use firehose::net::sim::{Delivery, PostFault, SimConfig, SimLink, SimNet};
use firehose::net::solo::SoloLink;
use firehose::net::{Am, Link, LinkError, LinkEvent, Rank, RdmaKind, RdmaOp};
use firehose::pin::Access;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

#[path = "common/sim_mem.rs"]
#[allow(dead_code)]
mod sim_mem;
use sim_mem::{Buf, Rng};

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng::new(seed);
    (0..len).map(|_| r.next() as u8).collect()
}

fn op(kind: RdmaKind, local: u64, len: usize, remote: u64, rkey: u32, token: u64) -> RdmaOp {
    RdmaOp {
        kind,
        local_addr: local,
        lkey: 0,
        len,
        remote_addr: remote,
        rkey,
        token,
    }
}

#[derive(Debug, PartialEq)]
enum Ev {
    Msg(Rank, Vec<u8>),
    Lost(Rank),
    Done(Rank, u64, Result<(), LinkError>),
}

fn drain(l: &SimLink) -> Vec<Ev> {
    let mut out = Vec::new();
    loop {
        let n = l
            .poll(&mut |e| match e {
                LinkEvent::Recv { peer, data } => out.push(Ev::Msg(peer, data.to_vec())),
                LinkEvent::PeerLost { peer, .. } => out.push(Ev::Lost(peer)),
                LinkEvent::RdmaDone {
                    peer,
                    token,
                    result,
                } => out.push(Ev::Done(peer, token, result)),
            })
            .unwrap();
        if n == 0 {
            return out;
        }
    }
}

/// Each rank's registered region; rank r's region is split in `size` stripes, stripe i written
/// and read only by rank i (so writes of different initiators never race).
struct Job {
    net: SimNet,
    links: Vec<Arc<SimLink>>,
    regions: Vec<Buf>,
    rkeys: Vec<u32>,
    stripe: usize,
}

fn job(size: u32, seed: u64, delivery: Delivery, stripe: usize) -> Job {
    let net = SimNet::new(SimConfig {
        slots: 64,
        ..SimConfig::new(size, seed, delivery)
    });
    let links = (0..size).map(|r| net.link(r)).collect();
    let regions: Vec<Buf> = (0..size)
        .map(|_| Buf::new(stripe * size as usize, 0))
        .collect();
    let rkeys = regions
        .iter()
        .enumerate()
        // SAFETY: the buffers outlive every op (they are dropped with the job, after the links
        // are done) and are only read once no op can run.
        .map(|(r, b)| unsafe { net.register(r as Rank, b.addr(), b.len) })
        .collect();
    Job {
        net,
        links,
        regions,
        rkeys,
        stripe,
    }
}

/// A rank's random ops to every peer, in batches: each op uses its own slice of the local
/// buffer; writes update the rank's shadow of its stripe at post time, reads expect the shadow
/// at post time (per-pair order: the target executes them in posting order). Checked once the
/// batch's completions are all in: every token exactly once, success, bytes equal.
struct Initiator {
    me: Rank,
    local: Buf,
    shadow: Vec<Vec<u8>>, // by target
    rng: Rng,
    next_token: u64,
}

struct Posted {
    peer: Rank,
    kind: RdmaKind,
    local_off: usize,
    expect: Vec<u8>,
}

impl Initiator {
    fn new(me: Rank, size: u32, stripe: usize, local_len: usize, seed: u64) -> Initiator {
        Initiator {
            me,
            local: Buf::new(local_len, 0xEE),
            shadow: vec![vec![0; stripe]; size as usize],
            rng: Rng::new(seed),
            next_token: (u64::from(me) << 48) | 1,
        }
    }

    /// Posts up to `n` random ops (sizes 1..=max_len); returns them by token.
    fn post_batch(&mut self, j: &Job, n: usize, max_len: usize, posted: &mut HashMap<u64, Posted>) {
        let size = j.links.len() as u64;
        let mut local_off = 0;
        for _ in 0..n {
            let peer = loop {
                let p = self.rng.below(size) as Rank;
                if p != self.me {
                    break p;
                }
            };
            let len = 1 + self.rng.below(max_len as u64) as usize;
            if local_off + len > self.local.len {
                break;
            }
            let off = self.rng.below((j.stripe - len + 1) as u64) as usize;
            let remote =
                j.regions[peer as usize].addr() + (self.me as usize * j.stripe + off) as u64;
            let kind = if self.rng.below(2) == 0 {
                RdmaKind::Write
            } else {
                RdmaKind::Read
            };
            let token = self.next_token;
            self.next_token += 1;
            let shadow = &mut self.shadow[peer as usize][off..off + len];
            let expect = match kind {
                RdmaKind::Write => {
                    let data = pattern(token, len);
                    // SAFETY: this slice of the local buffer is used by no posted op.
                    unsafe { self.local.write(local_off, &data) };
                    shadow.copy_from_slice(&data);
                    data
                }
                RdmaKind::Read => shadow.to_vec(),
            };
            let o = op(
                kind,
                self.local.addr() + local_off as u64,
                len,
                remote,
                j.rkeys[peer as usize],
                token,
            );
            // SAFETY: the local slice stays untouched until the batch's completions are in;
            // the remote range lies in the peer's registered region (this rank's stripe).
            unsafe { j.links[self.me as usize].rdma(peer, o) }.unwrap();
            posted.insert(
                token,
                Posted {
                    peer,
                    kind,
                    local_off,
                    expect,
                },
            );
            local_off += len;
        }
    }

    /// One completion: exactly once, success, and a read's bytes as expected.
    fn complete(
        &self,
        posted: &mut HashMap<u64, Posted>,
        peer: Rank,
        token: u64,
        result: Result<(), LinkError>,
    ) {
        let p = posted
            .remove(&token)
            .unwrap_or_else(|| panic!("rank {}: token {token:#x} unknown or twice", self.me));
        assert_eq!(p.peer, peer, "token {token:#x} reported for the wrong peer");
        assert_eq!(result, Ok(()), "token {token:#x}");
        if p.kind == RdmaKind::Read {
            // SAFETY: the op completed; no other op uses this slice of the batch.
            let got = unsafe { &self.local.bytes()[p.local_off..p.local_off + p.expect.len()] };
            assert!(got == p.expect, "rank {}: read {token:#x} differs", self.me);
        }
    }
}

/// Every rank's stripe at every target equals its shadow.
fn check_regions(j: &Job, inits: &[Initiator]) {
    for (t, region) in j.regions.iter().enumerate() {
        // SAFETY: called when no op is outstanding.
        let bytes = unsafe { region.bytes() };
        for i in inits.iter().filter(|i| i.me as usize != t) {
            let s = &bytes[i.me as usize * j.stripe..(i.me as usize + 1) * j.stripe];
            if let Some(bad) = s.iter().zip(&i.shadow[t]).position(|(a, b)| a != b) {
                panic!(
                    "rank {t}'s region, stripe of {}: first bad byte {bad}",
                    i.me
                );
            }
        }
    }
}

/// Manual delivery, several seeds: rounds of random ops from every rank, delivered in an order
/// the seed picks; every op completes once, successfully, byte-exact.
#[test]
fn random_writes_and_reads_land_byte_exact_manual() {
    for seed in 0..12u64 {
        let size = 2 + (seed % 4) as u32;
        let j = job(size, seed, Delivery::Manual, 4096);
        let mut inits: Vec<Initiator> = (0..size)
            .map(|r| Initiator::new(r, size, j.stripe, 64 << 10, seed * 100 + u64::from(r)))
            .collect();
        for _round in 0..6 {
            let mut posted: Vec<HashMap<u64, Posted>> = (0..size).map(|_| HashMap::new()).collect();
            for (i, init) in inits.iter_mut().enumerate() {
                init.post_batch(&j, 40, 3000, &mut posted[i]);
            }
            let total: usize = posted.iter().map(HashMap::len).sum();
            assert_eq!(
                j.net.steps(100_000),
                total,
                "every op is in flight until stepped"
            );
            for (i, init) in inits.iter().enumerate() {
                for e in drain(&j.links[i]) {
                    match e {
                        Ev::Done(peer, token, result) => {
                            init.complete(&mut posted[i], peer, token, result)
                        }
                        other => panic!("unexpected {other:?}"),
                    }
                }
                assert!(posted[i].is_empty(), "rank {i}: ops never reported");
            }
        }
        check_regions(&j, &inits);
        assert_eq!(j.net.overruns(), 0);
    }
}

/// Auto delivery: an initiator's own poll runs its ops, even if the target never polls.
#[test]
fn auto_delivery_needs_no_target_poll() {
    let j = job(2, 3, Delivery::Auto, 4096);
    let mut init = Initiator::new(0, 2, j.stripe, 64 << 10, 5);
    let mut posted = HashMap::new();
    init.post_batch(&j, 50, 2000, &mut posted);
    let n = posted.len();
    let mut seen = 0;
    for e in drain(&j.links[0]) {
        if let Ev::Done(peer, token, result) = e {
            init.complete(&mut posted, peer, token, result);
            seen += 1;
        }
    }
    assert_eq!(seen, n);
    let inits = [init, Initiator::new(1, 2, j.stripe, 1, 0)];
    check_regions(&j, &inits);
}

/// Put then notify: a WRITE followed by a SEND on one pair; when the message is handled, the
/// written bytes are already in place, whatever order the seed delivers pairs in (a write to
/// another rank, posted before, makes the pick matter).
#[test]
fn write_then_send_arrives_in_order() {
    for seed in 0..64u64 {
        let delivery = if seed % 2 == 0 {
            Delivery::Manual
        } else {
            Delivery::Auto
        };
        let j = job(3, seed, delivery, 1024);
        let src = Buf::new(1024, 0);
        let data = pattern(seed, 1000);
        // SAFETY: no op posted yet.
        unsafe { src.write(0, &data) };
        for (k, peer) in [(2u64, 2), (1, 1)] {
            let remote = j.regions[peer as usize].addr();
            let o = op(
                RdmaKind::Write,
                src.addr(),
                1000,
                remote,
                j.rkeys[peer as usize],
                k,
            );
            // SAFETY: `src` is not written again; both ranges lie in registered regions.
            unsafe { j.links[0].rdma(peer, o) }.unwrap();
        }
        j.links[0].send(1, b"notify").unwrap();
        if delivery == Delivery::Manual {
            j.net.steps(100);
        }
        let mut checked = false;
        j.links[1]
            .poll(&mut |e| {
                if let LinkEvent::Recv { data: m, .. } = e {
                    assert_eq!(m, b"notify");
                    // SAFETY: the only op to this region was the WRITE, which arrived before
                    // the message on this pair.
                    let got = unsafe { &j.regions[1].bytes()[..1000] };
                    assert!(got == &data[..], "seed {seed}: notify overtook the write");
                    checked = true;
                }
            })
            .unwrap();
        assert!(checked, "seed {seed}: the notify never arrived");
        let mut dones = drain(&j.links[0]);
        dones.sort_by_key(|e| match e {
            Ev::Done(_, t, _) => *t,
            _ => 0,
        });
        assert_eq!(
            dones,
            vec![Ev::Done(1, 1, Ok(())), Ev::Done(2, 2, Ok(()))],
            "seed {seed}: each op reported once"
        );
    }
}

/// A wrong rkey, a range past the region's end, a write to a read-only region, a deregistered
/// key: the op fails with `RemoteAccess`, the ops posted behind it fail with `PeerLost` before
/// the `PeerLost` event, both ends lose the connection, later ops are refused.
#[test]
fn remote_access_errors_fail_the_op_and_lose_the_peer() {
    /// Makes the bad op's remote address, key and kind (may register or deregister).
    type MakeBad = fn(&Job, &SimNet) -> (u64, u32, RdmaKind);
    let cases: [(&str, MakeBad); 4] = [
        ("wrong rkey", |j, _| {
            (j.regions[1].addr(), j.rkeys[2], RdmaKind::Write)
        }),
        ("past the end", |j, _| {
            (
                j.regions[1].addr() + j.regions[1].len as u64 - 8,
                j.rkeys[1],
                RdmaKind::Read,
            )
        }),
        ("read-only region", |j, net| {
            // SAFETY: as `job`'s regions (the same buffer, a second key).
            let k = unsafe { net.register_access(1, j.regions[1].addr(), 64, Access::REMOTE_READ) };
            (j.regions[1].addr(), k, RdmaKind::Write)
        }),
        ("deregistered", |j, net| {
            assert!(net.deregister(j.rkeys[1]));
            assert!(!net.deregister(j.rkeys[1]), "twice");
            (j.regions[1].addr(), j.rkeys[1], RdmaKind::Write)
        }),
    ];
    for (what, make) in cases {
        for delivery in [Delivery::Manual, Delivery::Auto] {
            let j = job(3, 9, delivery, 256);
            let local = Buf::new(256, 7);
            let (remote, rkey, kind) = make(&j, &j.net);
            let good = op(
                RdmaKind::Write,
                local.addr(),
                16,
                j.regions[1].addr(),
                j.rkeys[1],
                1,
            );
            // SAFETY: `local` outlives the ops; the ranges are registered or rejected.
            unsafe {
                if what != "deregistered" {
                    j.links[0].rdma(1, good).unwrap();
                }
                j.links[0]
                    .rdma(1, op(kind, local.addr(), 16, remote, rkey, 2))
                    .unwrap();
                j.links[0].rdma(1, RdmaOp { token: 3, ..good }).unwrap();
                j.links[0].send(1, b"behind").unwrap();
                j.links[0]
                    .rdma(
                        2,
                        RdmaOp {
                            token: 4,
                            rkey: j.rkeys[2],
                            remote_addr: j.regions[2].addr(),
                            ..good
                        },
                    )
                    .unwrap();
            }
            if delivery == Delivery::Manual {
                j.net.steps(100);
            }
            let mut want = vec![];
            if what != "deregistered" {
                want.push(Ev::Done(1, 1, Ok(())));
            }
            want.extend([
                Ev::Done(1, 2, Err(LinkError::RemoteAccess(1))),
                Ev::Done(1, 3, Err(LinkError::PeerLost(1))),
                Ev::Lost(1),
            ]);
            let mut got = drain(&j.links[0]);
            // The op to rank 2 is on another pair: it completes, in an order the seed picks.
            let other = got.iter().position(|e| matches!(e, Ev::Done(2, ..)));
            assert_eq!(got.remove(other.unwrap()), Ev::Done(2, 4, Ok(())), "{what}");
            assert_eq!(got, want, "{what} {delivery:?}");
            let at1 = drain(&j.links[1]);
            assert_eq!(
                at1,
                vec![Ev::Lost(0)],
                "{what}: the target loses it too, no message"
            );
            // SAFETY: refused before anything is posted.
            let again = unsafe { j.links[0].rdma(1, good) };
            assert_eq!(again, Err(LinkError::PeerLost(1)), "{what}");
            assert!(
                drain(&j.links[0]).is_empty(),
                "a refused op is never reported"
            );
        }
    }
}

/// Refused with nothing posted and no event: zero length, too long, wrapping ranges, bad
/// ranks, the own rank; the solo link refuses everything.
#[test]
fn bad_arguments_are_refused() {
    let j = job(2, 1, Delivery::Auto, 64);
    let l = &j.links[0];
    let good = op(RdmaKind::Read, 4096, 8, j.regions[1].addr(), j.rkeys[1], 1);
    let cases = [
        (1, RdmaOp { len: 0, ..good }, LinkError::ZeroLength),
        (
            1,
            RdmaOp {
                len: l.max_rdma() + 1,
                ..good
            },
            LinkError::TooLong {
                len: l.max_rdma() + 1,
                max: l.max_rdma(),
            },
        ),
        (
            1,
            RdmaOp {
                local_addr: u64::MAX - 3,
                ..good
            },
            LinkError::Overflow,
        ),
        (
            1,
            RdmaOp {
                remote_addr: u64::MAX,
                ..good
            },
            LinkError::Overflow,
        ),
        (2, good, LinkError::BadRank(2)),
        (0, good, LinkError::BadRank(0)),
    ];
    for (peer, o, want) in cases {
        // SAFETY: every one of these is refused before anything is posted or copied.
        assert_eq!(unsafe { l.rdma(peer, o) }, Err(want));
    }
    assert!(drain(l).is_empty());
    assert_eq!(j.net.rdma_done(), 0);
    let solo = SoloLink {
        recv_slots: 8,
        max_msg: 64,
    };
    assert_eq!(solo.max_rdma(), 0);
    // SAFETY: refused.
    assert_eq!(unsafe { solo.rdma(0, good) }, Err(LinkError::BadRank(0)));
}

/// Connection dropped, or target silenced, with ops in flight: each op reports `PeerLost`
/// once, before the peer's `PeerLost`.
#[test]
fn loss_fails_outstanding_ops_first() {
    for silence in [false, true] {
        let j = job(3, 4, Delivery::Manual, 256);
        let local = Buf::new(256, 1);
        for t in 0..5u64 {
            let o = op(
                RdmaKind::Write,
                local.addr(),
                32,
                j.regions[1].addr(),
                j.rkeys[1],
                t,
            );
            // SAFETY: registered target range; `local` outlives the ops.
            unsafe { j.links[0].rdma(1, o) }.unwrap();
        }
        if silence {
            j.net.silence(1);
        } else {
            j.net.drop_connection(0, 1);
        }
        let mut want: Vec<Ev> = (0..5)
            .map(|t| Ev::Done(1, t, Err(LinkError::PeerLost(1))))
            .collect();
        want.push(Ev::Lost(1));
        assert_eq!(drain(&j.links[0]), want, "silence={silence}");
        assert_eq!(j.net.rdma_done(), 5);
        // SAFETY: untouched region: no op ran.
        assert!(unsafe { j.regions[1].bytes() }.iter().all(|&b| b == 0));
    }
    // An op to a rank silenced before it was posted: it times out like a probe.
    let j = job(2, 4, Delivery::Auto, 64);
    let local = Buf::new(64, 1);
    j.net.silence(1);
    let o = op(
        RdmaKind::Read,
        local.addr(),
        8,
        j.regions[1].addr(),
        j.rkeys[1],
        9,
    );
    // SAFETY: as above.
    unsafe { j.links[0].rdma(1, o) }.unwrap();
    assert_eq!(
        drain(&j.links[0]),
        vec![Ev::Done(1, 9, Err(LinkError::PeerLost(1))), Ev::Lost(1)]
    );
}

/// 16 ranks, one thread each, all posting random ops to every peer while polling; every token
/// completes once, byte-exact.
#[test]
fn sixteen_threads_post_concurrently() {
    const SIZE: u32 = 16;
    let j = Arc::new(job(SIZE, 77, Delivery::Auto, 8192));
    let start = Arc::new(Barrier::new(SIZE as usize));
    let threads: Vec<_> = (0..SIZE)
        .map(|r| {
            let (j, start) = (j.clone(), start.clone());
            std::thread::spawn(move || {
                let mut init = Initiator::new(r, SIZE, j.stripe, 128 << 10, 1000 + u64::from(r));
                start.wait();
                for _ in 0..8 {
                    let mut posted = HashMap::new();
                    init.post_batch(&j, 60, 2000, &mut posted);
                    let deadline = Instant::now() + Duration::from_secs(30);
                    while !posted.is_empty() {
                        assert!(Instant::now() < deadline, "rank {r}: ops never completed");
                        for e in drain(&j.links[r as usize]) {
                            match e {
                                Ev::Done(peer, token, result) => {
                                    init.complete(&mut posted, peer, token, result)
                                }
                                other => panic!("rank {r}: unexpected {other:?}"),
                            }
                        }
                        j.links[r as usize].wait(Duration::from_millis(1)).unwrap();
                    }
                }
                init
            })
        })
        .collect();
    let inits: Vec<Initiator> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    check_regions(&j, &inits);
}

/// Several threads share one link: tokens from all of them come back once each, to whichever
/// thread polls; none is lost or duplicated.
#[test]
fn threads_sharing_one_link_see_each_token_once() {
    let j = Arc::new(job(4, 5, Delivery::Auto, 4096));
    let seen = Arc::new(Mutex::new(HashMap::<u64, u32>::new()));
    let posted_total = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..16u64)
        .map(|t| {
            let (j, seen, posted_total) = (j.clone(), seen.clone(), posted_total.clone());
            std::thread::spawn(move || {
                let local = Buf::new(64, t as u8);
                for i in 0..200u64 {
                    let peer = 1 + (i % 3) as Rank;
                    // Reads only: concurrent threads of one rank never write the same bytes.
                    let o = op(
                        RdmaKind::Read,
                        local.addr(),
                        64,
                        j.regions[peer as usize].addr(),
                        j.rkeys[peer as usize],
                        (t << 32) | i,
                    );
                    // SAFETY: `local` is only written by these reads (all of one region, whose
                    // bytes are all 0) and outlives them: the thread polls until all are seen.
                    unsafe { j.links[0].rdma(peer, o) }.unwrap();
                    posted_total.fetch_add(1, Ordering::Relaxed);
                    j.links[0]
                        .poll(&mut |e| {
                            if let LinkEvent::RdmaDone { token, result, .. } = e {
                                assert_eq!(result, Ok(()));
                                *seen.lock().unwrap().entry(token).or_default() += 1;
                            }
                        })
                        .unwrap();
                }
                let deadline = Instant::now() + Duration::from_secs(30);
                while (0..200u64).any(|i| !seen.lock().unwrap().contains_key(&((t << 32) | i))) {
                    assert!(Instant::now() < deadline);
                    j.links[0]
                        .poll(&mut |e| {
                            if let LinkEvent::RdmaDone { token, .. } = e {
                                *seen.lock().unwrap().entry(token).or_default() += 1;
                            }
                        })
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len() as u64, posted_total.load(Ordering::Relaxed));
    assert!(seen.values().all(|&c| c == 1), "a token reported twice");
}

/// A second user chains onto the endpoint's RDMA handler (`rdma_handler`): it keeps its own
/// tokens and passes the others on, so both see exactly their completions.
#[test]
fn rdma_handler_can_be_chained() {
    let net = SimNet::new(SimConfig::new(2, 1, Delivery::Auto));
    let region = Buf::new(64, 0);
    // SAFETY: `region` outlives the endpoints and is read only after the ops completed.
    let rkey = unsafe { net.register(1, region.addr(), region.len) };
    let am0 = Am::new(net.link(0), NetSettings::default()).unwrap();
    let _am1 = Am::new(net.link(1), NetSettings::default()).unwrap();
    assert!(am0.rdma_handler().is_none());
    let first = Arc::new(Mutex::new(Vec::new()));
    let f = first.clone();
    am0.set_rdma_handler(Some(Box::new(move |_, token, _| {
        f.lock().unwrap().push(token)
    })));
    let prev = am0.rdma_handler().expect("the handler just set");
    let mine = Arc::new(Mutex::new(Vec::new()));
    let m = mine.clone();
    am0.set_rdma_handler(Some(Box::new(move |peer, token, result| {
        if token >> 63 == 1 {
            m.lock().unwrap().push(token);
        } else {
            prev(peer, token, result);
        }
    })));
    let local = Buf::new(64, 0x5A);
    let o = op(RdmaKind::Write, local.addr(), 8, region.addr(), rkey, 7);
    // SAFETY: registered range; `local` outlives the ops.
    unsafe {
        am0.link().rdma(1, o).unwrap();
        am0.link()
            .rdma(
                1,
                RdmaOp {
                    token: 1 << 63 | 9,
                    ..o
                },
            )
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while am0.stats().rdma_ok < 2 {
        assert!(Instant::now() < deadline);
        am0.progress().unwrap();
    }
    assert_eq!(*first.lock().unwrap(), vec![7]);
    assert_eq!(*mine.lock().unwrap(), vec![1 << 63 | 9]);
}

/// The AM endpoint passes `RdmaDone` up to its handler from `progress`; without one it only
/// counts them.
#[test]
fn am_passes_rdma_completions_to_its_handler() {
    let net = SimNet::new(SimConfig::new(2, 1, Delivery::Auto));
    let region = Buf::new(128, 0);
    // SAFETY: `region` outlives the endpoints and is read only after the ops completed.
    let rkey = unsafe { net.register(1, region.addr(), region.len) };
    let am0 = Am::new(net.link(0), NetSettings::default()).unwrap();
    let _am1 = Am::new(net.link(1), NetSettings::default()).unwrap();
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    am0.set_rdma_handler(Some(Box::new(move |peer, token, result| {
        g.lock().unwrap().push((peer, token, result));
    })));
    let local = Buf::new(128, 0xAB);
    let o = op(RdmaKind::Write, local.addr(), 100, region.addr(), rkey, 42);
    // SAFETY: registered range; `local` outlives the op.
    unsafe { am0.link().rdma(1, o) }.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline);
        am0.progress().unwrap();
    }
    assert_eq!(*got.lock().unwrap(), vec![(1, 42, Ok(()))]);
    // SAFETY: the op completed.
    assert!(unsafe { region.bytes() }[..100].iter().all(|&b| b == 0xAB));
    assert_eq!(unsafe { region.bytes() }[100], 0, "not one byte more");
    am0.set_rdma_handler(None);
    // SAFETY: as above.
    unsafe { am0.link().rdma(1, RdmaOp { token: 43, ..o }) }.unwrap();
    while am0.stats().rdma_ok < 2 {
        assert!(Instant::now() < deadline);
        am0.progress().unwrap();
    }
    assert_eq!(got.lock().unwrap().len(), 1, "removed handler not called");
    assert_eq!(am0.stats().rdma_failed, 0);
}

/// An inline WRITE (`len <= max_inline_write()`) carries the bytes the source held when it was
/// posted: the caller may reuse the source at once (how `Rma` posts short puts with no local
/// registration). Without inline, the op reads the source when it runs, so the same reuse
/// lands the new bytes: the check can tell the two apart.
#[test]
fn inline_write_takes_its_bytes_at_post_time() {
    for inline in [0usize, 64] {
        let net = SimNet::new(SimConfig::new(2, 5, Delivery::Manual));
        net.set_max_inline_write(inline);
        let (a, b) = (net.link(0), net.link(1));
        assert_eq!(a.max_inline_write(), inline);
        let target = Buf::new(64, 0);
        // SAFETY: `target` outlives every op (drained below) and is read only after.
        let rkey = unsafe { net.register(1, target.addr(), 64) };
        let src = Buf::new(8, 0x11);
        // SAFETY: both ranges are live; the source is rewritten below only to show the
        // difference (the contract allows it for an inline op only).
        unsafe {
            a.rdma(
                1,
                op(RdmaKind::Write, src.addr(), 8, target.addr(), rkey, 9),
            )
            .unwrap();
            src.write(0, &[0x22; 8]);
        }
        net.steps(100);
        assert_eq!(drain(&a), vec![Ev::Done(1, 9, Ok(()))]);
        assert!(drain(&b).is_empty());
        // SAFETY: the op is done.
        let got = unsafe { target.bytes() }[..8].to_vec();
        let want = if inline > 0 { 0x11 } else { 0x22 };
        assert_eq!(got, vec![want; 8], "inline {inline}");
    }
}

/// `fail_rdma_posts`: the chosen post is refused with `Device` (nothing posted, no `RdmaDone`),
/// the posts around it run, the connection stays up; `OneIn` refuses about one in n.
#[test]
fn refused_posts_report_nothing_and_keep_the_connection() {
    let j = job(2, 6, Delivery::Manual, 256);
    let local = Buf::new(256, 0x5A);
    let post = |t: u64| {
        let o = op(
            RdmaKind::Write,
            local.addr() + 32 * t,
            32,
            j.regions[1].addr() + 32 * t,
            j.rkeys[1],
            t,
        );
        // SAFETY: registered target range; `local` outlives the ops (drained below).
        unsafe { j.links[0].rdma(1, o) }
    };
    j.net.fail_rdma_posts(PostFault::Nth(1));
    let got: Vec<_> = (0..4).map(post).collect();
    assert!(matches!(got[1], Err(LinkError::Device(_))), "{got:?}");
    assert!(got.iter().enumerate().all(|(i, r)| i == 1 || r.is_ok()));
    assert_eq!(j.net.posts_refused(), 1);
    j.net.steps(100);
    let want: Vec<Ev> = [0, 2, 3].iter().map(|&t| Ev::Done(1, t, Ok(()))).collect();
    assert_eq!(
        drain(&j.links[0]),
        want,
        "no completion for the refused post"
    );
    assert!(drain(&j.links[1]).is_empty(), "nobody lost");
    // SAFETY: every op is done.
    let region = unsafe { j.regions[1].bytes() };
    assert!(region[..32].iter().all(|&b| b == 0x5A));
    assert!(
        region[32..64].iter().all(|&b| b == 0),
        "the refused one wrote nothing"
    );
    assert!(region[64..128].iter().all(|&b| b == 0x5A));

    j.net.fail_rdma_posts(PostFault::OneIn(4));
    let refused = (0..400u64)
        .filter(|t| matches!(post(t % 8), Err(LinkError::Device(_))))
        .count();
    assert!((50..150).contains(&refused), "{refused} of 400 refused");
    assert_eq!(j.net.posts_refused(), 1 + refused as u64);
    j.net.fail_rdma_posts(PostFault::Off);
    assert!(post(0).is_ok());
    j.net.steps(10_000);
    let done = drain(&j.links[0]);
    assert_eq!(done.len(), 400 - refused + 1);
    assert!(done.iter().all(|e| matches!(e, Ev::Done(1, _, Ok(())))));
}
