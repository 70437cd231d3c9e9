//! rdma-link: one-sided RDMA through `VerbsLink` (`Link::rdma`, `LinkEvent::RdmaDone`) on a real
//! device. Five ranks as threads of one process (bootstrap: `LocalGroup`), each with its own PD,
//! link, a registered region (remote read + write) of one stripe per rank, and a registered
//! local buffer; regions' (addr, rkey) are swapped through the bootstrap allgather. Ranks 0..4
//! do the traffic; rank 4 only serves the last phase, so the connections it breaks matter to
//! no one else.
//!   1. argument errors: zero length, longer than max_rdma, a wrapping range, the own rank and
//!      a rank out of range are refused, with no completion ever reported for them; so is an
//!      `rdma_batch` with one zero-length op among good ones, whole, before any is posted;
//!   2. random WRITEs and READs (1 B .. 32 KiB, random offsets in the initiator's own stripe at
//!      each peer) in batches that overfill the send queue, every other round posted through
//!      `rdma_batch` in runs of up to 20 ops to one peer (chains split, runs that wait for room):
//!      every token reported exactly once, successfully, every READ byte-exact against what the
//!      initiator wrote there before;
//!   3. a final WRITE of each stripe, then every target checks its whole region byte by byte
//!      (so data really lands at the target, not only where reads look);
//!   4. write-then-send: each rank WRITEs a fresh pattern to every peer's stripe and sends a
//!      notify right after (no wait): when the notify arrives, the write must already be there;
//!      then rank 0, with a message from rank 1 waiting, polls twice, each poll reporting a READ
//!      that completed before it: the message must come by the second (a poll that reports
//!      RDMA results may leave receives to the next one, never to two);
//!   5. remote access errors, all to rank 4: rank 0 uses another PD's rkey, rank 1 a range past
//!      the region's end, rank 2 a READ with a garbage rkey; each op reports RemoteAccess(4), the
//!      op queued behind it reports PeerLost(4) (flushed), then PeerLost(4) comes once, within
//!      seconds: no hang, no crash. Rank 3's connection to rank 4 still works.
//!
//! Exit: 0 pass, 77 skip (no RDMA device), 1 fail. FH_TEST_BREAK=1 corrupts one expected byte
//! once (rank 0's first READ check) to prove the byte check can fail: the run must then fail
//! with "data mismatch". Environment: FH_RDMA_DEV or FH_DEVICE, FH_IB_PORT (1), FH_GID_INDEX,
//! FH_AM_RECV_DEPTH / FH_AM_MAX_SIZE (the link's settings), FH_TEST_ROUNDS (default 12).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use firehose::internals::net::bootstrap::local::LocalBootstrap;
use firehose::internals::net::verbs::VerbsLink;
use firehose::internals::net::{Bootstrap, Link, LinkError, LinkEvent, Rank, RdmaKind, RdmaOp};
use firehose::internals::pin::verbs::{Context, Mr};
use firehose::internals::pin::Access;
use firehose_verbs_tests::buffer::PageBuf;
use firehose_verbs_tests::link_ranks::{run_link_test, Options};
use firehose_verbs_tests::pattern::{compare, pattern};

const RANKS: u32 = 5;
/// Ranks 0..WORKERS do phases 1-4; rank WORKERS is the target of phase 5.
const WORKERS: u32 = 4;
const VICTIM: Rank = WORKERS;
const STRIPE: usize = 64 << 10;
const LOCAL: usize = 1 << 20;
const MAX_OP: u64 = 32 << 10;
const BATCH: usize = 48;
/// Longest run of ops `random_batch` posts through one `rdma_batch` (odd rounds).
const MAX_RUN: usize = 20;
const NOTIFY_ROUNDS: u32 = 20;
const NOTIFY: u8 = 7;
/// The message `recv_bound` waits for.
const BOUND: u8 = 9;
/// Generous: TCG guests are slow.
const PHASE_TIMEOUT: Duration = Duration::from_secs(120);
/// "Within seconds": an access error is a NAK, not a timeout.
const ERROR_WITHIN: Duration = Duration::from_secs(10);

static BREAK_ONCE: AtomicBool = AtomicBool::new(false);

fn main() {
    std::process::exit(run_link_test(
        "rdma-link",
        RANKS,
        Duration::from_secs(900),
        ("FH_TEST_ROUNDS", 12),
        &BREAK_ONCE,
        rank_main,
    ));
}

/// Where a rank's region is, as the others need it.
#[derive(Clone, Copy, Debug)]
struct Remote {
    addr: u64,
    rkey: u32,
}

/// Volatile reads and writes of a buffer the device also writes.
fn read(buf: &PageBuf, off: usize, len: usize) -> Vec<u8> {
    assert!(off + len <= buf.len());
    (0..len)
        // SAFETY: inside the live mapping; volatile because DMA may have written it.
        .map(|i| unsafe { (buf.addr() as *const u8).add(off + i).read_volatile() })
        .collect()
}

fn write(buf: &PageBuf, off: usize, data: &[u8]) {
    assert!(off + data.len() <= buf.len());
    for (i, &b) in data.iter().enumerate() {
        // SAFETY: inside the live mapping, in a slice no posted work request uses.
        unsafe { (buf.addr() as *mut u8).add(off + i).write_volatile(b) };
    }
}

fn check(what: &str, expected: &[u8], got: &[u8]) -> Result<(), String> {
    match compare(expected, got) {
        None => Ok(()),
        Some(m) => Err(format!(
            "{what}: data mismatch: first bad offset {} (expected {:#04x}, got {:#04x}), {} bad \
             byte(s) of {}",
            m.offset,
            m.expected,
            m.got,
            m.count,
            expected.len()
        )),
    }
}

/// What a posted op must come back as.
struct Posted {
    peer: Rank,
    kind: RdmaKind,
    local_off: usize,
    expect: Vec<u8>,
}

struct RankState {
    rank: Rank,
    link: VerbsLink,
    local: PageBuf,
    local_mr: Mr,
    region: PageBuf,
    remotes: Vec<Remote>,
    rng: fastrand::Rng,
    /// What this rank last wrote into its stripe at each peer (phases 2-3).
    shadow: Vec<Vec<u8>>,
}

fn rank_main(ctx: &Arc<Context>, mut b: LocalBootstrap, opts: &Options) -> Result<String, String> {
    let rank = b.rank();
    let pd = ctx.alloc_pd().map_err(|e| e.to_string())?;
    let link =
        VerbsLink::new(&pd, &mut b, &opts.link.cfg).map_err(|e| format!("VerbsLink::new: {e}"))?;
    let map = |e: std::io::Error| format!("mmap: {e}");
    let region = PageBuf::new(STRIPE * RANKS as usize).map_err(map)?;
    let local = PageBuf::new(LOCAL).map_err(map)?;
    let remote_rw = Access::LOCAL_WRITE
        .union(Access::REMOTE_WRITE)
        .union(Access::REMOTE_READ);
    let region_mr = Mr::register(&pd, region.addr(), region.len(), remote_rw)
        .map_err(|e| format!("register region: {e}"))?;
    let local_mr = Mr::register(&pd, local.addr(), local.len(), Access::LOCAL_WRITE)
        .map_err(|e| format!("register local buffer: {e}"))?;
    let mut mine = (region.addr() as u64).to_le_bytes().to_vec();
    mine.extend_from_slice(&region_mr.rkey().to_le_bytes());
    let all = b.allgather(&mine).map_err(|e| e.to_string())?;
    let remotes: Vec<Remote> = all
        .chunks_exact(12)
        .map(|c| Remote {
            addr: u64::from_le_bytes(c[..8].try_into().unwrap()),
            rkey: u32::from_le_bytes(c[8..].try_into().unwrap()),
        })
        .collect();
    let mut r = RankState {
        rank,
        link,
        local,
        local_mr,
        region,
        remotes,
        rng: fastrand::Rng::with_seed(0xF1E5 + u64::from(rank)),
        shadow: vec![vec![0; STRIPE]; RANKS as usize],
    };
    let mut notes = format!(
        "rank {rank}: max_rdma {}, recv_slots {}",
        r.link.max_rdma(),
        r.link.recv_slots()
    );
    let barrier = |b: &mut LocalBootstrap| b.barrier().map_err(|e| e.to_string());

    if rank < WORKERS {
        notes += &arguments(&r)?;
        let t = Instant::now();
        let mut ops = 0;
        for round in 0..opts.count {
            ops += random_batch(&mut r, round)?;
        }
        notes += &format!(
            "; {ops} random ops in {:.2?} (odd rounds through rdma_batch)",
            t.elapsed()
        );
        final_fill(&mut r)?;
    }
    barrier(&mut b)?; // every final fill is complete
    if rank < WORKERS {
        check_region(&r)?;
    }
    barrier(&mut b)?; // every region checked before phase 4 writes again
    for round in 0..NOTIFY_ROUNDS {
        if rank < WORKERS {
            write_then_send(&mut r, round)?;
        }
        barrier(&mut b)?; // every notify checked before the next round's writes
    }
    if rank < WORKERS {
        notes += &format!("; {NOTIFY_ROUNDS} write-then-send rounds ordered");
    }
    // A poll that reports RDMA results may leave the receive CQ to the next poll, never to two.
    if rank == 1 {
        r.link
            .send(0, &[BOUND])
            .map_err(|e| format!("bound message to 0: {e}"))?;
    }
    barrier(&mut b)?; // the message is on its way before rank 0 polls
    if rank == 0 {
        notes += &recv_bound(&mut r)?;
    }
    barrier(&mut b)?;
    notes += &access_errors(&mut r)?;
    barrier(&mut b)?; // rank 4 keeps its QPs until everyone has its verdict
    drop(region_mr);
    Ok(notes)
}

fn expect_refused(link: &VerbsLink, peer: Rank, op: RdmaOp, want: LinkError) -> Result<(), String> {
    // SAFETY: each of these is refused before anything is posted.
    match unsafe { link.rdma(peer, op) } {
        Err(e) if e == want => Ok(()),
        other => Err(format!(
            "rdma({peer}, {op:?}): want Err({want}), got {other:?}"
        )),
    }
}

fn arguments(r: &RankState) -> Result<String, String> {
    let peer = (r.rank + 1) % WORKERS;
    let good = RdmaOp {
        kind: RdmaKind::Write,
        local_addr: r.local.addr() as u64,
        lkey: r.local_mr.lkey(),
        len: 8,
        remote_addr: r.remotes[peer as usize].addr,
        rkey: r.remotes[peer as usize].rkey,
        token: 1,
    };
    let max = r.link.max_rdma();
    expect_refused(
        &r.link,
        peer,
        RdmaOp { len: 0, ..good },
        LinkError::ZeroLength,
    )?;
    expect_refused(
        &r.link,
        peer,
        RdmaOp {
            kind: RdmaKind::Read,
            len: 0,
            ..good
        },
        LinkError::ZeroLength,
    )?;
    expect_refused(
        &r.link,
        peer,
        RdmaOp {
            len: max + 1,
            ..good
        },
        LinkError::TooLong { len: max + 1, max },
    )?;
    expect_refused(
        &r.link,
        peer,
        RdmaOp {
            remote_addr: u64::MAX - 4,
            ..good
        },
        LinkError::Overflow,
    )?;
    expect_refused(&r.link, r.rank, good, LinkError::BadRank(r.rank))?;
    expect_refused(&r.link, RANKS, good, LinkError::BadRank(RANKS))?;
    // A batch with one bad op is refused whole, before anything is posted: no event may come
    // for its good ops (a later phase's `complete_all` fails on an unknown token).
    let bad = [good, RdmaOp { len: 0, ..good }, good];
    // SAFETY: refused before anything is posted (checked here).
    match unsafe { r.link.rdma_batch(peer, &bad) } {
        Err((0, LinkError::ZeroLength)) => {}
        other => return Err(format!("rdma_batch with a zero-length op: {other:?}")),
    }
    // SAFETY: as above.
    match unsafe { r.link.rdma_batch(r.rank, &[good, good]) } {
        Err((0, LinkError::BadRank(_))) => {}
        other => return Err(format!("rdma_batch to the own rank: {other:?}")),
    }
    Ok("; argument errors refused".into())
}

/// Polls until every op in `posted` has reported (each exactly once, successfully, READs
/// byte-exact); no message or loss may arrive meanwhile.
fn complete_all(
    r: &RankState,
    posted: &mut HashMap<u64, Posted>,
    what: &str,
) -> Result<(), String> {
    let start = Instant::now();
    while !posted.is_empty() {
        if start.elapsed() > PHASE_TIMEOUT {
            return Err(format!(
                "{what}: {} op(s) never reported in {PHASE_TIMEOUT:?}",
                posted.len()
            ));
        }
        let mut err = None;
        r.link
            .poll(&mut |ev| {
                let res = match ev {
                    LinkEvent::RdmaDone {
                        peer,
                        token,
                        result,
                    } => done(r, posted, peer, token, result),
                    LinkEvent::Recv { peer, .. } => Err(format!("unexpected message from {peer}")),
                    LinkEvent::PeerLost { peer, reason } => {
                        Err(format!("unexpected PeerLost({peer}): {reason}"))
                    }
                };
                if let Err(e) = res {
                    err.get_or_insert(format!("{what}: {e}"));
                }
            })
            .map_err(|e| format!("poll: {e}"))?;
        if let Some(e) = err {
            return Err(e);
        }
        if !posted.is_empty() {
            r.link
                .wait(Duration::from_millis(50))
                .map_err(|e| format!("wait: {e}"))?;
        }
    }
    Ok(())
}

fn done(
    r: &RankState,
    posted: &mut HashMap<u64, Posted>,
    peer: Rank,
    token: u64,
    result: Result<(), LinkError>,
) -> Result<(), String> {
    let p = posted
        .remove(&token)
        .ok_or_else(|| format!("RdmaDone for token {token:#x}: unknown or reported twice"))?;
    if p.peer != peer {
        return Err(format!(
            "token {token:#x}: reported for rank {peer}, posted to {}",
            p.peer
        ));
    }
    result.map_err(|e| format!("token {token:#x} to rank {peer} failed: {e}"))?;
    if p.kind == RdmaKind::Read {
        let mut expect = p.expect;
        if r.rank == 0 && BREAK_ONCE.swap(false, Ordering::SeqCst) {
            expect[0] ^= 0xff;
        }
        let got = read(&r.local, p.local_off, expect.len());
        check(&format!("READ {token:#x} from rank {peer}"), &expect, &got)?;
    }
    Ok(())
}

/// Up to BATCH random ops to random peers, each with its own slice of the local buffer. In odd
/// rounds the ops go out through `rdma_batch`, in runs of 1..=MAX_RUN to one peer (longer than
/// the link's chain of 16, and, with 4 send-queue entries, longer than the room it has).
fn random_batch(r: &mut RankState, round: u32) -> Result<usize, String> {
    let batched = round % 2 == 1;
    let mut posted = HashMap::new();
    let mut local_off = 0;
    let mut run: Vec<RdmaOp> = Vec::new();
    let mut run_peer = r.rank;
    let mut run_len = 0;
    for i in 0..BATCH {
        if batched && run.len() >= run_len {
            flush_run(r, run_peer, &mut run, round)?;
            run_len = 1 + r.rng.usize(..MAX_RUN);
            run_peer = other_worker(r);
        }
        let peer = if batched { run_peer } else { other_worker(r) };
        let cap = [16, 256, 4096, MAX_OP][r.rng.u64(..4) as usize];
        let len = 1 + r.rng.u64(..cap) as usize;
        if local_off + len > LOCAL {
            break;
        }
        let off = r.rng.u64(..(STRIPE - len + 1) as u64) as usize;
        let kind = if r.rng.u64(..2) == 0 {
            RdmaKind::Write
        } else {
            RdmaKind::Read
        };
        // Tokens use all 64 bits: the link must hand them back unchanged.
        let token = r.rng.u64(..) | (1 << 63);
        let shadow = &mut r.shadow[peer as usize][off..off + len];
        let expect = match kind {
            RdmaKind::Write => {
                let data = pattern(token ^ u64::from(round), len);
                write(&r.local, local_off, &data);
                shadow.copy_from_slice(&data);
                Vec::new()
            }
            RdmaKind::Read => shadow.to_vec(),
        };
        let op = RdmaOp {
            kind,
            local_addr: (r.local.addr() + local_off) as u64,
            lkey: r.local_mr.lkey(),
            len,
            remote_addr: r.remotes[peer as usize].addr + (r.rank as usize * STRIPE + off) as u64,
            rkey: r.remotes[peer as usize].rkey,
            token,
        };
        if batched {
            run.push(op);
        } else {
            // SAFETY: the local slice is registered and untouched until its completion (each op
            // of the batch has its own); the remote range is this rank's stripe of the peer's
            // region.
            unsafe { r.link.rdma(peer, op) }
                .map_err(|e| format!("round {round} op {i}: rdma({peer}): {e}"))?;
        }
        if posted
            .insert(
                token,
                Posted {
                    peer,
                    kind,
                    local_off,
                    expect,
                },
            )
            .is_some()
        {
            return Err("the test drew one token twice".into());
        }
        local_off += len;
    }
    flush_run(r, run_peer, &mut run, round)?;
    let n = posted.len();
    complete_all(r, &mut posted, &format!("random round {round}"))?;
    Ok(n)
}

/// A random worker other than this rank.
fn other_worker(r: &mut RankState) -> Rank {
    loop {
        let p = r.rng.u64(..u64::from(WORKERS)) as Rank;
        if p != r.rank {
            break p;
        }
    }
}

/// Posts the run of ops to `peer` gathered by `random_batch` as one `rdma_batch`: all of them.
fn flush_run(r: &RankState, peer: Rank, run: &mut Vec<RdmaOp>, round: u32) -> Result<(), String> {
    if run.is_empty() {
        return Ok(());
    }
    // SAFETY: as `rdma` in `random_batch`, for each op of the run.
    unsafe { r.link.rdma_batch(peer, run) }.map_err(|(n, e)| {
        format!(
            "round {round}: rdma_batch({peer}) of {}: {n} posted, then {e}",
            run.len()
        )
    })?;
    run.clear();
    Ok(())
}

fn fill_pattern(writer: Rank, target: Rank) -> Vec<u8> {
    pattern(0xF111 + u64::from(writer) * 31 + u64::from(target), STRIPE)
}

/// WRITE the whole stripe at every peer with a pattern the target can compute.
fn final_fill(r: &mut RankState) -> Result<(), String> {
    let mut posted = HashMap::new();
    let peers: Vec<Rank> = (0..WORKERS).filter(|&p| p != r.rank).collect();
    for (i, &peer) in peers.iter().enumerate() {
        let data = fill_pattern(r.rank, peer);
        write(&r.local, i * STRIPE, &data);
        r.shadow[peer as usize].copy_from_slice(&data);
        let token = 0xF000 + u64::from(peer);
        let op = RdmaOp {
            kind: RdmaKind::Write,
            local_addr: (r.local.addr() + i * STRIPE) as u64,
            lkey: r.local_mr.lkey(),
            len: STRIPE,
            remote_addr: r.remotes[peer as usize].addr + (r.rank as usize * STRIPE) as u64,
            rkey: r.remotes[peer as usize].rkey,
            token,
        };
        // SAFETY: as in `random_batch`.
        unsafe { r.link.rdma(peer, op) }.map_err(|e| format!("final fill to {peer}: {e}"))?;
        posted.insert(
            token,
            Posted {
                peer,
                kind: RdmaKind::Write,
                local_off: 0,
                expect: Vec::new(),
            },
        );
    }
    complete_all(r, &mut posted, "final fill")
}

/// Every other worker's stripe of our region holds its final fill.
fn check_region(r: &RankState) -> Result<(), String> {
    for w in (0..WORKERS).filter(|&w| w != r.rank) {
        let got = read(&r.region, w as usize * STRIPE, STRIPE);
        check(
            &format!("rank {}'s region, stripe of rank {w}", r.rank),
            &fill_pattern(w, r.rank),
            &got,
        )?;
    }
    Ok(())
}

fn notify_pattern(writer: Rank, target: Rank, round: u32) -> Vec<u8> {
    let len = 1
        + ((u64::from(writer) * 7919 + u64::from(target) * 104_729 + u64::from(round) * 31)
            % STRIPE as u64) as usize;
    pattern(
        0xA0_0000 + u64::from(round) * 64 + u64::from(writer) * 8 + u64::from(target),
        len,
    )
}

/// WRITE then SEND (no wait in between) to every peer; every arriving notify finds its write.
fn write_then_send(r: &mut RankState, round: u32) -> Result<(), String> {
    let mut posted = HashMap::new();
    let peers: Vec<Rank> = (0..WORKERS).filter(|&p| p != r.rank).collect();
    for (i, &peer) in peers.iter().enumerate() {
        let data = notify_pattern(r.rank, peer, round);
        write(&r.local, i * STRIPE, &data);
        let token = (u64::from(round) << 8) | u64::from(peer);
        let op = RdmaOp {
            kind: RdmaKind::Write,
            local_addr: (r.local.addr() + i * STRIPE) as u64,
            lkey: r.local_mr.lkey(),
            len: data.len(),
            remote_addr: r.remotes[peer as usize].addr + (r.rank as usize * STRIPE) as u64,
            rkey: r.remotes[peer as usize].rkey,
            token,
        };
        // SAFETY: as in `random_batch`.
        unsafe { r.link.rdma(peer, op) }.map_err(|e| format!("notify write to {peer}: {e}"))?;
        let mut msg = vec![NOTIFY];
        msg.extend_from_slice(&round.to_le_bytes());
        r.link
            .send(peer, &msg)
            .map_err(|e| format!("notify to {peer}: {e}"))?;
        posted.insert(
            token,
            Posted {
                peer,
                kind: RdmaKind::Write,
                local_off: 0,
                expect: Vec::new(),
            },
        );
    }
    let mut notified = vec![false; WORKERS as usize];
    notified[r.rank as usize] = true;
    let start = Instant::now();
    // Poll until our writes completed and every peer's notify was checked.
    loop {
        let mut on_msg = |from: Rank, m: &[u8]| -> Result<(), String> {
            let want = [&[NOTIFY][..], &round.to_le_bytes()[..]].concat();
            if m != want.as_slice() || from >= WORKERS || notified[from as usize] {
                return Err(format!(
                    "round {round}: unexpected message {m:?} from {from}"
                ));
            }
            notified[from as usize] = true;
            // The notify is being handled: its WRITE, posted just before it on the same QP,
            // must have landed already.
            let expect = notify_pattern(from, r.rank, round);
            let got = read(&r.region, from as usize * STRIPE, expect.len());
            check(
                &format!("round {round}: notify from rank {from} overtook its write"),
                &expect,
                &got,
            )
        };
        let mut err = None;
        r.link
            .poll(&mut |ev| {
                let res = match ev {
                    LinkEvent::RdmaDone {
                        peer,
                        token,
                        result,
                    } => done(r, &mut posted, peer, token, result),
                    LinkEvent::Recv { peer, data } => on_msg(peer, data),
                    LinkEvent::PeerLost { peer, reason } => {
                        Err(format!("unexpected PeerLost({peer}): {reason}"))
                    }
                };
                if let Err(e) = res {
                    err.get_or_insert(e);
                }
            })
            .map_err(|e| format!("poll: {e}"))?;
        if let Some(e) = err {
            return Err(e);
        }
        if posted.is_empty() && notified.iter().all(|&n| n) {
            return Ok(());
        }
        if start.elapsed() > PHASE_TIMEOUT {
            return Err(format!(
                "round {round}: {} write(s) unreported, notifies {notified:?}",
                posted.len()
            ));
        }
        r.link
            .wait(Duration::from_millis(50))
            .map_err(|e| format!("wait: {e}"))?;
    }
}

/// Rank 0, with rank 1's `BOUND` message waiting in its receive CQ: two polls, each reporting a
/// READ that completed before it. The link may leave receives to the next poll after one that
/// reported RDMA results (`VerbsLink::poll`), but never twice in a row: the message must have
/// come by the end of the second.
fn recv_bound(r: &mut RankState) -> Result<String, String> {
    // Time for the message to land (the bootstrap's barrier does not touch the link).
    std::thread::sleep(Duration::from_secs(1));
    let mut delivered = false;
    for i in 0..2u64 {
        let token = 0xB0 + i;
        let op = RdmaOp {
            kind: RdmaKind::Read,
            local_addr: r.local.addr() as u64 + i * 4096,
            lkey: r.local_mr.lkey(),
            len: 64,
            remote_addr: r.remotes[1].addr,
            rkey: r.remotes[1].rkey,
            token,
        };
        // SAFETY: a registered local slice nobody else uses now; rank 1's region, readable.
        unsafe { r.link.rdma(1, op) }.map_err(|e| format!("bound read {i}: {e}"))?;
        // Its completion is in the send CQ well before this (a 64-byte READ on rxe).
        std::thread::sleep(Duration::from_secs(1));
        let (mut reported, mut err) = (false, None);
        r.link
            .poll(&mut |ev| match ev {
                LinkEvent::RdmaDone {
                    token: t, result, ..
                } if t == token => {
                    reported = true;
                    if let Err(e) = result {
                        err.get_or_insert(format!("bound read {i}: {e}"));
                    }
                }
                LinkEvent::Recv { peer: 1, data } if data == [BOUND] && !delivered => {
                    delivered = true
                }
                LinkEvent::RdmaDone { token, .. } => {
                    err.get_or_insert(format!("unexpected RDMA result {token:#x}"));
                }
                LinkEvent::Recv { peer, .. } => {
                    err.get_or_insert(format!("unexpected message from {peer}"));
                }
                LinkEvent::PeerLost { peer, reason } => {
                    err.get_or_insert(format!("unexpected PeerLost({peer}): {reason}"));
                }
            })
            .map_err(|e| format!("poll: {e}"))?;
        if let Some(e) = err {
            return Err(e);
        }
        if !reported {
            return Err(format!(
                "poll {i}: its READ not reported 1 s after the post"
            ));
        }
    }
    if !delivered {
        return Err(
            "a waiting message was not delivered by two polls that each reported an \
                    RDMA result: the receive CQ was left alone twice in a row"
                .into(),
        );
    }
    Ok("; a waiting message came within two polls that reported RDMA".into())
}

/// Phase 5: bad ops to the victim, each followed by a good one that must be flushed.
fn access_errors(r: &mut RankState) -> Result<String, String> {
    let v = r.remotes[VICTIM as usize];
    let base = RdmaOp {
        kind: RdmaKind::Write,
        local_addr: r.local.addr() as u64,
        lkey: r.local_mr.lkey(),
        len: 64,
        remote_addr: v.addr,
        rkey: v.rkey,
        token: 0xBAD0,
    };
    let (bad, what) = match r.rank {
        // A real rkey, of rank 3's region: another PD, so not valid on this connection.
        0 => (
            RdmaOp {
                rkey: r.remotes[3].rkey,
                ..base
            },
            "another PD's rkey",
        ),
        1 => (
            RdmaOp {
                remote_addr: v.addr + (STRIPE * RANKS as usize) as u64 - 32,
                ..base
            },
            "a range past the region's end",
        ),
        2 => (
            RdmaOp {
                kind: RdmaKind::Read,
                rkey: v.rkey ^ 0x00ff_ff00,
                ..base
            },
            "a READ with a garbage rkey",
        ),
        3 => return still_works(r),
        _ => return victim_watch(r),
    };
    let start = Instant::now();
    // SAFETY: the local slice is registered and untouched until both ops report; the target
    // refuses the bad one, and the good one behind it is flushed or lands in the victim's
    // region, which nobody reads.
    unsafe {
        r.link
            .rdma(VICTIM, bad)
            .map_err(|e| format!("bad op: {e}"))?;
        r.link
            .rdma(
                VICTIM,
                RdmaOp {
                    token: 0xBAD1,
                    ..base
                },
            )
            .map_err(|e| format!("op behind the bad one: {e}"))?;
    }
    let mut events = Vec::new();
    while !events.iter().any(|e: &String| e.starts_with("lost")) {
        if start.elapsed() > ERROR_WITHIN {
            return Err(format!(
                "{what}: after {ERROR_WITHIN:?} only {events:?} (a hang, not an error report)"
            ));
        }
        r.link
            .poll(&mut |ev| match ev {
                LinkEvent::RdmaDone {
                    peer,
                    token,
                    result,
                } => events.push(format!("done {peer} {token:#x} {result:?}")),
                LinkEvent::PeerLost { peer, .. } => events.push(format!("lost {peer}")),
                LinkEvent::Recv { peer, .. } => events.push(format!("message from {peer}")),
            })
            .map_err(|e| format!("poll: {e}"))?;
        r.link
            .wait(Duration::from_millis(20))
            .map_err(|e| format!("wait: {e}"))?;
    }
    // Nothing more comes (each op and the loss reported once).
    for _ in 0..10 {
        r.link
            .poll(&mut |ev| events.push(format!("late {ev:?}")))
            .map_err(|e| format!("poll: {e}"))?;
        r.link
            .wait(Duration::from_millis(20))
            .map_err(|e| format!("wait: {e}"))?;
    }
    let want = [
        format!("done {VICTIM} 0xbad0 Err(RemoteAccess({VICTIM}))"),
        format!("done {VICTIM} 0xbad1 Err(PeerLost({VICTIM}))"),
        format!("lost {VICTIM}"),
    ];
    if events != want {
        return Err(format!("{what}: events {events:?}, want {want:?}"));
    }
    // SAFETY: refused: the peer is lost.
    let again = unsafe { r.link.rdma(VICTIM, base) };
    if again != Err(LinkError::PeerLost(VICTIM)) {
        return Err(format!("{what}: rdma after the loss: {again:?}"));
    }
    Ok(format!(
        "; {what}: RemoteAccess, flush, PeerLost after {:.2?}",
        start.elapsed()
    ))
}

/// Rank 3: its connection to the victim is untouched by the others' errors.
fn still_works(r: &mut RankState) -> Result<String, String> {
    // Let the others' errors happen first (they take well under a second).
    std::thread::sleep(Duration::from_secs(2));
    let data = pattern(0x5717, 4096);
    write(&r.local, 0, &data);
    let v = r.remotes[VICTIM as usize];
    let w = RdmaOp {
        kind: RdmaKind::Write,
        local_addr: r.local.addr() as u64,
        lkey: r.local_mr.lkey(),
        len: data.len(),
        remote_addr: v.addr + (3 * STRIPE) as u64,
        rkey: v.rkey,
        token: 1,
    };
    let rd = RdmaOp {
        kind: RdmaKind::Read,
        local_addr: (r.local.addr() + 8192) as u64,
        token: 2,
        ..w
    };
    // SAFETY: two disjoint registered local slices, untouched until both report; the remote
    // range is rank 3's stripe of the victim's region.
    unsafe {
        r.link
            .rdma(VICTIM, w)
            .map_err(|e| format!("write to victim: {e}"))?;
        r.link
            .rdma(VICTIM, rd)
            .map_err(|e| format!("read from victim: {e}"))?;
    }
    let mut posted = HashMap::new();
    posted.insert(
        1,
        Posted {
            peer: VICTIM,
            kind: RdmaKind::Write,
            local_off: 0,
            expect: vec![],
        },
    );
    posted.insert(
        2,
        Posted {
            peer: VICTIM,
            kind: RdmaKind::Read,
            local_off: 8192,
            expect: data,
        },
    );
    complete_all(r, &mut posted, "rank 3 to the victim")?;
    Ok("; its connection to the victim still works (write + read back)".into())
}

/// Rank 4: watch what the broken connections look like from the target side (not asserted:
/// whether a responder QP goes to error on an access NAK is the provider's business).
fn victim_watch(r: &mut RankState) -> Result<String, String> {
    let start = Instant::now();
    let mut lost = Vec::new();
    while start.elapsed() < Duration::from_secs(4) {
        let mut bad = None;
        r.link
            .poll(&mut |ev| match ev {
                LinkEvent::PeerLost { peer, .. } => lost.push(peer),
                other => bad = Some(format!("{other:?}")),
            })
            .map_err(|e| format!("poll: {e}"))?;
        if let Some(b) = bad {
            return Err(format!("victim: unexpected {b}"));
        }
        r.link
            .wait(Duration::from_millis(50))
            .map_err(|e| format!("wait: {e}"))?;
    }
    lost.sort_unstable();
    Ok(format!(
        "; as target of the bad ops it saw PeerLost from {lost:?}"
    ))
}
