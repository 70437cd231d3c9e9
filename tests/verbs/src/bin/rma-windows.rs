//! Memory windows on the device (`FH_MW`): a key rank 0 grants to rank 1 works on rank 1's
//! connection only. Three ranks as threads of one process (`LocalGroup` bootstrap), each with
//! its own device context, protection domain, queue pairs and `Rma`:
//!
//! 1. rank 1 puts a pattern into rank 0's buffer with `Rma` (a Firehose move, then RDMA with the
//!    key rank 0 granted), and reads back its firehoses on rank 0 (`Rma::firehoses_on`);
//! 2. rank 2 replays that key over its own connection to rank 0 (a raw RDMA WRITE on its link,
//!    outside Firehose): with windows the device refuses it (`RemoteAccess`);
//! 3. rank 0 checks its buffer holds rank 1's pattern, untouched by rank 2.
//!
//! `FH_MW=off` gives rank 1 the region's key, which any connection may use: the replay then lands
//! and the program FAILs (run by the suite as the proof that the check can fail).
//! `FH_REMOTE_INVALIDATION=0`: the ranks share one process, and its memory monitor.

use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use firehose::internals::cache::{Cache, Limits};
use firehose::internals::net::bootstrap::local::LocalBootstrap;
use firehose::internals::net::{LinkError, LinkEvent, Peers, PeersConfig, RdmaKind, RdmaOp};
use firehose::internals::pin::verbs::{Context, Mr, VerbsPinner};
use firehose::internals::pin::Access;
use firehose::internals::rma::Rma;
use firehose_verbs_tests::buffer::PageBuf;
use firehose_verbs_tests::link_ranks::run_ranks;
use firehose_verbs_tests::pattern::{compare, pattern};
use firehose_verbs_tests::EXIT_FAIL;

const LEN: usize = 64 << 10;

#[derive(Default)]
struct Shared {
    /// Rank 0's buffer.
    target: Mutex<u64>,
    /// The key rank 1 holds on rank 0's buffer.
    key: Mutex<Option<u32>>,
    /// Rank 2's verdict on its replay.
    replay: Mutex<Option<Result<(), LinkError>>>,
}

struct Opts {
    shared: Shared,
    step: Barrier,
}

fn main() {
    if std::env::var_os("FH_REMOTE_INVALIDATION").is_none() {
        std::env::set_var("FH_REMOTE_INVALIDATION", "0");
    }
    let device = std::env::var("FH_DEVICE")
        .ok()
        .or_else(|| std::env::var("FH_RDMA_DEV").ok());
    let opts = Opts {
        shared: Shared::default(),
        step: Barrier::new(3),
    };
    let code = run_ranks(
        "rma-windows",
        3,
        device.as_deref(),
        Duration::from_secs(300),
        opts,
        rank_main,
    );
    std::process::exit(if code == 0 { 0 } else { code.max(EXIT_FAIL) });
}

fn rank_main(_ctx: &Arc<Context>, b: LocalBootstrap, o: &Opts) -> Result<String, String> {
    let mut pc = PeersConfig::from_env().map_err(|e| format!("config: {e:?}"))?;
    pc.bootstrap = Some(Box::new(b));
    pc.defer_progress = true;
    let peers = Arc::new(Peers::new(pc).map_err(|e| format!("Peers::new: {e:?}"))?);
    let me = peers.rank();
    let pd = peers.pd().ok_or("no protection domain")?.clone();
    let limits = Limits {
        max_pinned: usize::MAX,
        max_regions: usize::MAX,
    };
    let cache = Cache::new(Arc::new(VerbsPinner::new(pd.clone())), limits, None);
    let rma = Rma::new(peers.clone(), Some(cache)).map_err(|e| format!("Rma::new: {e:?}"))?;
    // Rank 2 polls its link itself (its replay's completion is the verdict): no progress
    // thread there; ranks 0 and 1 are served by theirs.
    if me != 2 {
        peers
            .start_progress()
            .map_err(|e| format!("progress: {e:?}"))?;
    }
    let s = &o.shared;
    let mut buf = PageBuf::new(LEN).map_err(|e| e.to_string())?;
    if me == 0 {
        buf.fill(&vec![0u8; LEN]);
        *s.target.lock().unwrap() = buf.addr() as u64;
    }
    o.step.wait();
    let target = *s.target.lock().unwrap();
    let data = pattern(11, LEN);
    let mut verdict = String::new();
    if me == 1 {
        buf.fill(&data);
        // SAFETY: `buf` outlives the wait.
        let h = unsafe {
            rma.start(
                RdmaKind::Write,
                0,
                target,
                buf.addr() as *mut u8,
                LEN,
                false,
            )
        }
        .map_err(|e| format!("put: {e:?}"))?;
        rma.wait(h).map_err(|e| format!("put wait: {e:?}"))?;
        let held = rma.firehoses_on(0);
        let key = held
            .iter()
            .find(|f| f.0 <= target && target < f.0 + f.1)
            .map(|f| f.2)
            .ok_or(format!(
                "no firehose over the target after the put: {held:?}"
            ))?;
        *s.key.lock().unwrap() = Some(key);
        verdict = format!("holds {} firehose(s) on rank 0, key {key:#x}", held.len());
    }
    o.step.wait();
    if me == 2 {
        let key = s.key.lock().unwrap().ok_or("rank 1 published no key")?;
        let r = replay(&peers, &pd, &mut buf, target, key);
        verdict = format!("replay of rank 1's key {key:#x}: {r:?}");
        *s.replay.lock().unwrap() = Some(r);
    }
    o.step.wait();
    if me == 0 {
        let r = s.replay.lock().unwrap().clone();
        if r != Some(Err(LinkError::RemoteAccess(0))) {
            return Err(format!(
                "rank 2 replayed rank 1's key: {r:?} (a window would refuse it: RemoteAccess)"
            ));
        }
        let got = buf.snapshot();
        if let Some(m) = compare(&data, &got) {
            return Err(format!("rank 0's buffer is not rank 1's put: {m:?}"));
        }
        let st = rma.stats().windows;
        if !st.on || st.bound == 0 {
            return Err(format!("no windows bound: {st:?}"));
        }
        verdict = format!("buffer intact, replay refused, windows {st:?}");
    }
    o.step.wait();
    drop(rma);
    Ok(verdict)
}

/// Rank 2: an RDMA WRITE of 64 bytes of 0xEE to rank 0 at `target` with `key`, outside
/// Firehose; waits (bounded) for its completion.
fn replay(
    peers: &Peers,
    pd: &Arc<firehose::internals::pin::verbs::Pd>,
    buf: &mut PageBuf,
    target: u64,
    key: u32,
) -> Result<(), LinkError> {
    buf.fill(&[0xEE; 64]);
    let mr = Mr::register(pd, buf.addr(), 64, Access::LOCAL_WRITE)
        .map_err(|e| LinkError::Device(e.to_string()))?;
    let op = RdmaOp {
        kind: RdmaKind::Write,
        local_addr: buf.addr() as u64,
        lkey: mr.lkey(),
        len: 64,
        remote_addr: target,
        rkey: key,
        token: 0xF00D,
    };
    let link = peers.link();
    // SAFETY: the local range is registered (`mr`) and kept until the completion below; the
    // remote side is the device's to check.
    unsafe { link.rdma(0, op) }?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut got = None;
        link.poll(&mut |e| {
            if let LinkEvent::RdmaDone {
                token: 0xF00D,
                result,
                ..
            } = e
            {
                got = Some(result);
            }
        })?;
        if let Some(r) = got {
            return r;
        }
        if Instant::now() > deadline {
            return Err(LinkError::Device("the replay never completed".into()));
        }
        std::thread::yield_now();
    }
}
