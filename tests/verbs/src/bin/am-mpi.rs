//! Active messages between processes started by `mpirun` (PMIx bootstrap, verbs RC link), run in
//! the Soft-RoCE VM by tests/verbs-suite.d/61-am-mpi.sh with 2 and 4 ranks. Modes (`argv[1]`):
//!
//! - `storm`: every rank runs `FH_TEST_THREADS` threads, each with up to 8 requests in flight to
//!   random peers (itself included) with random payload sizes up to the largest; every reply is
//!   checked byte for byte. Plus one-way floods to every peer, checked in the handler and counted.
//! - `garbage`: rank 1 sends malformed messages straight through the link to every other rank
//!   (one of each kind); they must be rejected and counted exactly, and a storm must then work
//!   among everybody, rank 1 included.
//! - `exit-silent` / `exit-bye`: the last rank leaves after the first barrier, without (or with)
//!   saying goodbye; every other rank's request to it must fail with PeerLost (never a
//!   hang, never success), and the survivors must still talk to each other.
//!
//! Exit 0 on success; 1 with a `FAIL:` line otherwise.

use firehose::internals::net::bootstrap::{self, Bootstrap, BootstrapError};
use firehose::internals::net::wire::{Header, Kind, HEADER_LEN};
use firehose::internals::net::NetError;
use firehose::internals::net::{Peers, PeersConfig, Rank};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const XFORM: u16 = 1;
const FLOOD: u16 = 2;

fn fail(msg: String) -> ! {
    eprintln!("FAIL: {msg}");
    // mpirun may kill the job before it has forwarded this rank's last stderr line, so a test
    // that must see the failure reads it from FH_TEST_FAIL_LOG instead.
    if let Some(path) = std::env::var_os("FH_TEST_FAIL_LOG") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
        {
            let _ = writeln!(f, "FAIL: {msg}");
            let _ = f.sync_all();
        }
    }
    std::process::exit(1);
}

fn env_u64(k: &str, d: u64) -> u64 {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

/// Payload bytes from a seed (the seeded RNG), reproducible on both sides.
fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fastrand::Rng::with_seed(seed).fill(&mut v);
    v
}

/// The reply the XFORM handler of `responder` gives: its rank, then each byte xor'ed with it.
fn transformed(responder: Rank, p: &[u8]) -> Vec<u8> {
    let mut out = responder.to_le_bytes().to_vec();
    out.extend(p.iter().map(|b| b ^ (0x5A ^ responder as u8)));
    out
}

/// A bootstrap the test can finalize (PMIx) before the process leaves without `fh_finalize`:
/// mpirun treats a PMIx client that exits without finalizing as a crash and kills the job.
struct Shared(Arc<Mutex<Option<Box<dyn Bootstrap>>>>);

impl Bootstrap for Shared {
    fn rank(&self) -> Rank {
        self.0.lock().unwrap().as_ref().map_or(0, |b| b.rank())
    }
    fn size(&self) -> u32 {
        self.0.lock().unwrap().as_ref().map_or(0, |b| b.size())
    }
    fn allgather(&mut self, mine: &[u8]) -> Result<Vec<u8>, BootstrapError> {
        match self.0.lock().unwrap().as_mut() {
            Some(b) => b.allgather(mine),
            None => Err(BootstrapError("finalized".into())),
        }
    }
    fn barrier(&mut self) -> Result<(), BootstrapError> {
        match self.0.lock().unwrap().as_mut() {
            Some(b) => b.barrier(),
            None => Err(BootstrapError("finalized".into())),
        }
    }
}

struct Flood {
    got: AtomicU64,
    bad: AtomicBool,
}

type Setup = (
    Peers,
    Arc<Mutex<Option<Box<dyn Bootstrap>>>>,
    Arc<Flood>,
    Arc<AtomicBool>,
);

fn setup() -> Setup {
    let boot = bootstrap::from_env().unwrap_or_else(|e| fail(format!("bootstrap: {e}")));
    let shared = Arc::new(Mutex::new(Some(boot)));
    let mut cfg = PeersConfig::from_env().unwrap_or_else(|e| fail(format!("config: {e:?}")));
    cfg.bootstrap = Some(Box::new(Shared(shared.clone())));
    let peers = Peers::new(cfg).unwrap_or_else(|e| fail(format!("Peers::new: {e:?}")));
    let me = peers.rank();
    let leaving = Arc::new(AtomicBool::new(false));
    let gone = leaving.clone();
    // FH_TEST_BREAK=1: rank 0 corrupts one byte of its 5th reply, so the storm must fail (proves
    // the check can fail).
    let break_at = AtomicU64::new(
        if std::env::var("FH_TEST_BREAK").is_ok_and(|v| v == "1") && me == 0 {
            5
        } else {
            0
        },
    );
    peers
        .am()
        .register_request(XFORM, move |_from, p, replier| {
            if gone.load(Ordering::Relaxed) {
                // A rank on its way out answers nothing (dropping the replier): whoever asks can
                // only learn that it left.
                return;
            }
            let mut r = transformed(me, p);
            if break_at.load(Ordering::Relaxed) > 0 && break_at.fetch_sub(1, Ordering::Relaxed) == 1
            {
                r[0] ^= 1;
            }
            if replier.reply(&r).is_err() {
                eprintln!("rank {me}: reply failed");
            }
        });
    let flood = Arc::new(Flood {
        got: AtomicU64::new(0),
        bad: AtomicBool::new(false),
    });
    let f = flood.clone();
    peers.am().register_oneway(FLOOD, move |from, p| {
        // Payload: 8-byte seed, then payload(seed, rest).
        let ok = p.len() >= 8 && {
            let seed = u64::from_le_bytes(p[..8].try_into().unwrap());
            (seed >> 32) as Rank == from && p[8..] == payload(seed, p.len() - 8)[..]
        };
        if !ok {
            f.bad.store(true, Ordering::Relaxed);
        }
        f.got.fetch_add(1, Ordering::Relaxed);
    });
    (peers, shared, flood, leaving)
}

/// Requests from `threads` threads to random peers among `targets`, all replies checked.
fn storm(peers: &Peers, targets: &[Rank], threads: u64, reqs: u64) {
    // The reply is 4 bytes longer than the request.
    let max = peers.am().max_payload() - 4;
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                let mut inflight = std::collections::VecDeque::new();
                let mut rng = fastrand::Rng::with_seed(((peers.rank() as u64) << 40) ^ (t << 32));
                for i in 0..reqs {
                    let seed = rng.u64(..);
                    let peer = targets[(seed % targets.len() as u64) as usize];
                    let len = match seed % 4 {
                        0 => 0,
                        1 => (seed >> 8) as usize % 64,
                        2 => max,
                        _ => (seed >> 8) as usize % (max + 1),
                    };
                    let p = payload(seed, len);
                    let ticket = peers
                        .am()
                        .request(peer, XFORM, &p)
                        .unwrap_or_else(|e| fail(format!("request to {peer}: {e:?}")));
                    inflight.push_back((ticket, peer, p));
                    while inflight.len() >= 8 || (i + 1 == reqs && !inflight.is_empty()) {
                        let (ticket, peer, p) = inflight.pop_front().unwrap();
                        let got = peers
                            .am()
                            .wait(ticket, None)
                            .unwrap_or_else(|e| fail(format!("reply from {peer}: {e:?}")));
                        if got != transformed(peer, &p) {
                            fail(format!(
                                "rank {}: reply from {peer} to a {}-byte request differs",
                                peers.rank(),
                                p.len()
                            ));
                        }
                    }
                }
            });
        }
    });
}

/// `n` one-way messages to every other rank; returns how many this rank must receive.
fn flood(peers: &Peers, n: u64) -> u64 {
    let max = peers.am().max_payload() - 8;
    let me = peers.rank();
    let mut rng = fastrand::Rng::with_seed(me as u64);
    for _ in 0..n {
        for peer in (0..peers.size()).filter(|&r| r != me) {
            let seed = ((me as u64) << 32) | rng.u64(..1 << 32);
            let mut m = seed.to_le_bytes().to_vec();
            m.extend(payload(seed, (seed as usize >> 3) % (max + 1)));
            peers
                .am()
                .send_oneway(peer, FLOOD, &m)
                .unwrap_or_else(|e| fail(format!("one-way to {peer}: {e:?}")));
        }
    }
    n * (peers.size() as u64 - 1)
}

fn barrier(peers: &Peers, what: &str) {
    peers
        .barrier()
        .unwrap_or_else(|e| fail(format!("rank {}: barrier ({what}): {e:?}", peers.rank())));
}

fn check_flood(peers: &Peers, f: &Flood, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while f.got.load(Ordering::Relaxed) < want && Instant::now() < deadline {
        let _ = peers.progress();
    }
    let got = f.got.load(Ordering::Relaxed);
    if got != want || f.bad.load(Ordering::Relaxed) {
        fail(format!(
            "rank {}: one-way flood: {got} of {want} received, corrupt: {}",
            peers.rank(),
            f.bad.load(Ordering::Relaxed)
        ));
    }
}

fn raw(kind: u8, handler: u16, token: u32, p: &[u8]) -> Vec<u8> {
    let h = Header {
        kind: Kind::OneWay,
        handler,
        credits: 0,
        token,
        len: p.len() as u32,
    };
    let mut m = vec![0; HEADER_LEN + p.len()];
    h.encode(&mut m);
    m[2] = kind;
    m[HEADER_LEN..].copy_from_slice(p);
    m
}

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "storm".into());
    let threads = env_u64("FH_TEST_THREADS", 2);
    let reqs = env_u64("FH_TEST_REQS", 200);
    let (peers, boot, fl, leaving) = setup();
    let (me, size) = (peers.rank(), peers.size());
    let everyone: Vec<Rank> = (0..size).collect();
    let t0 = Instant::now();
    match mode.as_str() {
        "storm" => {
            barrier(&peers, "start");
            storm(&peers, &everyone, threads, reqs);
            let want = flood(&peers, env_u64("FH_TEST_FLOOD", 300));
            check_flood(&peers, &fl, want);
            barrier(&peers, "end");
        }
        "garbage" => {
            barrier(&peers, "start");
            let bad: Vec<Vec<u8>> = vec![
                vec![0xFA, 1, 1],                                    // truncated
                raw(3, FLOOD, 0, b"x").iter().map(|b| !b).collect(), // bad magic
                raw(9, 0, 0, b""),                                   // unknown kind
                raw(3, 999, 0, b"no such handler"),                  // unknown handler
                raw(2, 0, 0xDEAD, b"forged reply"),                  // unknown token
            ];
            if me == 1 {
                for peer in (0..size).filter(|&r| r != 1) {
                    for m in &bad {
                        if let Err(e) = peers.link().send(peer, m) {
                            fail(format!("raw send to {peer}: {e}"));
                        }
                    }
                }
            }
            // Wait until every garbage message is in (the sender has no say in when).
            let deadline = Instant::now() + Duration::from_secs(30);
            while me != 1
                && peers.am().stats().rejected_total() < bad.len() as u64
                && Instant::now() < deadline
            {
                let _ = peers.progress();
            }
            barrier(&peers, "after garbage");
            storm(&peers, &everyone, threads, reqs);
            barrier(&peers, "end");
            let rejected = peers.am().stats().rejected_total();
            let want = if me == 1 { 0 } else { bad.len() as u64 };
            if rejected != want {
                fail(format!(
                    "rank {me}: {rejected} messages rejected, want {want}"
                ));
            }
        }
        "exit-silent" | "exit-bye" => {
            let leaver = size - 1;
            if me == leaver {
                leaving.store(true, Ordering::Relaxed);
            }
            barrier(&peers, "start");
            if me == leaver {
                if mode == "exit-bye" {
                    let _ = peers.finalize();
                }
                // PMIx must see a finalize (else mpirun kills the job); the link just vanishes.
                drop(boot.lock().unwrap().take());
                println!("rank {me}: leaving early ({mode})");
                // SAFETY: _exit ends the process at once; nothing of ours needs to run after.
                unsafe { libc::_exit(0) };
            }
            let started = Instant::now();
            match peers.am().call(leaver, XFORM, b"are you there") {
                Err(NetError::PeerLost) => {}
                other => fail(format!(
                    "rank {me}: request to the departed rank: {other:?}"
                )),
            }
            println!(
                "rank {me}: request to departed rank {leaver}: PeerLost after {:.2} s",
                started.elapsed().as_secs_f64()
            );
            let survivors: Vec<Rank> = (0..leaver).collect();
            storm(&peers, &survivors, 1, reqs / 2);
            // No barrier: it would need the departed rank. Let the slowest survivor finish its
            // requests before anyone leaves (each answers the others while it waits here).
            let until = Instant::now() + Duration::from_secs(3);
            while Instant::now() < until {
                let _ = peers.progress();
            }
        }
        other => fail(format!("unknown mode {other}")),
    }
    let s = peers.am().stats();
    println!(
        "rank {me}/{size} {mode}: ok in {:.2} s; sent {} msgs, received {}, credit stalls {}, credit-only {}, rejected {}, peers lost {}",
        t0.elapsed().as_secs_f64(),
        s.sent_msgs.iter().sum::<u64>(),
        s.recv_msgs.iter().sum::<u64>(),
        s.credit_stalls,
        s.credit_only_sent(),
        s.rejected_total(),
        s.peers_lost
    );
    let _ = peers.finalize();
    drop(peers);
    drop(boot.lock().unwrap().take());
}
