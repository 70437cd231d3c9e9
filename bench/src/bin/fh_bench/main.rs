//! fh_bench: the Firehose paper's experiments (Bell & Bonachea, "A New DMA Registration Strategy
//! for Pinning-Based High Performance Networks", IPDPS 2003; Figs. 3-5, Table 3) on a
//! real link, under `mpirun`: Firehose puts (`rma::Rma`, fh_put's engine) side by side with
//! Rendezvous no-unpin, Rendezvous with-unpin and the registered-once floor, all four built on
//! the same `net::Peers` endpoint (transport.rs). Rank 0 measures, rank 1 is the target
//! (sweep.rs); `--test app` runs a bitonic sort on every rank (app.rs); `--test rma` measures
//! Firehose puts and gets against the floor with the library's defaults (rma.rs). Perftest-style tables
//! or one JSON document (report.rs), with the targets as PASS/MISS lines.

#[path = "../../cli.rs"]
mod cli;
// The TSC interval clock of reg_write_bw (a clock_gettime is microseconds under TCG).
#[allow(dead_code)]
#[path = "../reg_write_bw/clock.rs"]
mod clock;

mod app;
mod args;
mod report;
mod rma;
mod served;
mod sweep;
mod transport;

use std::alloc::{alloc_zeroed, Layout};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use firehose::internals::cache::{Cache, Limits};
use firehose::internals::net::bootstrap;
use firehose::internals::net::{Peers, PeersConfig};
use firehose::internals::pin::verbs::VerbsPinner;
use firehose::internals::rma::Rma;
use firehose_proto::FirehoseConfig;

use served::Served;
use transport::{LocalKeys, Raw};

pub fn fail(msg: impl std::fmt::Display) -> ! {
    eprintln!("fh_bench: FAIL: {msg}");
    std::process::exit(1);
}

/// Everything the parts share.
pub struct Ctx {
    pub peers: Arc<Peers>,
    pub rma: Arc<Rma>,
    pub raw: Arc<Raw>,
    pub served: Arc<Served>,
    pub local_keys: Arc<LocalKeys>,
    /// The algorithm's settings as every rank has them (FH_M, FH_MAXVICTIM, ...).
    pub fh: FirehoseConfig,
    /// Source of every put (pattern-filled).
    pub src: &'static [u8],
    /// Sweeps: rank 1's target buffer (rank 0 learns its address through INFO).
    pub target_len: usize,
    /// `rma`: the destination of gets (registered once for the floor; through the pin-down
    /// cache for Firehose), `dst_len` bytes; written only by the NIC.
    pub dst: *mut u8,
    pub dst_len: usize,
    /// App: this rank's keys (pointer, count) and the buffer peers put their block into (as
    /// many keys). Raw: both are handed to the NIC, and views are made only where no put or
    /// peer write is in flight (see app.rs).
    pub app_own: (*mut u64, usize),
    pub app_recv: *const u64,
}

impl Ctx {
    pub fn barrier(&self, what: &str) {
        if let Err(e) = self.peers.barrier() {
            fail(format!(
                "rank {}: barrier ({what}): {e:?}",
                self.peers.rank()
            ));
        }
    }

    /// A non-rank-0 rank's loop between tests: progress until rank 0 says STOP.
    pub fn serve(&self) {
        while !self.served.stop.swap(false, Ordering::AcqRel) {
            match self.rma.progress() {
                // Nothing arrived: give the CPU to whatever else is runnable (rxe's kernel work
                // on a guest with as many CPUs as ranks), as Rma::wait does.
                Ok(0) => std::thread::yield_now(),
                Ok(_) => {}
                Err(e) => fail(format!("rank {}: progress: {e:?}", self.peers.rank())),
            }
        }
    }

    /// `rma`'s target: with a progress thread (the default in a job of two) it answers
    /// everything, so this rank sleeps until STOP as an application's target rank may (busy
    /// elsewhere, asleep) instead of spinning on a vCPU the measuring rank needs; without one,
    /// `serve`.
    pub fn serve_rma(&self) {
        if !self.peers.settings().progress_thread {
            return self.serve();
        }
        while !self.served.stop.swap(false, Ordering::AcqRel) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

/// A zeroed buffer that lives to the end of the process, aligned to `align`.
pub fn leak_buf(len: usize, align: usize) -> &'static mut [u8] {
    let layout = Layout::from_size_align(len.max(1), align).expect("buffer layout");
    // SAFETY: the layout has a non-zero size; the block is never freed, so the slice may be
    // 'static; zeroed memory is a valid [u8].
    unsafe {
        let p = alloc_zeroed(layout);
        if p.is_null() {
            fail(format!("out of memory for {len} bytes"));
        }
        std::slice::from_raw_parts_mut(p, len)
    }
}

fn setup(a: &args::Args) -> Ctx {
    let mut cfg = PeersConfig::from_env().unwrap_or_else(|e| fail(format!("config: {e:?}")));
    let boot = bootstrap::from_env().unwrap_or_else(|e| fail(format!("bootstrap: {e}")));
    let (rank, size) = (boot.rank(), boot.size());
    if size < 2 {
        fail("run under mpirun -np 2 (sweeps) or -np 4 (app)");
    }
    // Every waiter busy-polls (as perftest and the other bench binaries do): what is measured
    // is the link and the protocol, not how soon a sleeping thread wakes. Not for `rma` alone,
    // which measures what an application gets from the library's defaults.
    let only_rma = a.tests.iter().all(|t| *t == args::Test::Rma);
    if std::env::var_os("FH_AM_SPIN_US").is_none() && !only_rma {
        cfg.settings.spin = std::time::Duration::from_secs(1);
    }
    cfg.bootstrap = Some(boot);
    // A progress thread (the default in a job with peers) starts once every handler below is
    // registered: a faster peer's first message to a handler not yet there would be dropped.
    cfg.defer_progress = true;
    let peers = Arc::new(Peers::new(cfg).unwrap_or_else(|e| fail(format!("Peers::new: {e:?}"))));
    let pd = peers
        .pd()
        .cloned()
        .unwrap_or_else(|| fail("no protection domain"));
    let fh = FirehoseConfig::from_env(rank, size)
        .unwrap_or_else(|e| fail(format!("{}: {}", e.var, e.msg)));
    // The source side of Firehose puts: a pin-down cache on the link's PD, as fh_init builds it
    // (no memory monitor: the bench never frees a buffer it put from).
    let cache = Cache::new(
        Arc::new(VerbsPinner::new(pd.clone())),
        Limits {
            max_pinned: 1 << 30,
            max_regions: 1 << 16,
        },
        None,
    );
    let rma = Rma::new(peers.clone(), Some(cache)).unwrap_or_else(|e| fail(format!("Rma: {e:?}")));
    // After Rma::new, which installed its own completion handler: ours chains onto it.
    let raw = Raw::install(peers.am());
    let served = Served::new(pd.clone());
    served.install(peers.am(), &rma);
    peers
        .start_progress()
        .unwrap_or_else(|e| fail(format!("progress thread: {e:?}")));

    let src_len = a
        .sizes
        .iter()
        .copied()
        .chain([a.bw_size, a.app_chunk, 4096])
        .max()
        .unwrap();
    let src = leak_buf(src_len, 4096);
    for (i, b) in src.iter_mut().enumerate() {
        *b = (i * 7 + 1) as u8;
    }
    let src: &'static [u8] = src;
    let sweeps = a
        .tests
        .iter()
        .any(|t| !matches!(t, args::Test::App | args::Test::Rma));
    let with_rma = a.tests.contains(&args::Test::Rma);
    let target_len = if sweeps {
        sweep::target_len(a, &fh)
    } else if with_rma {
        rma::target_len(a)
    } else {
        0
    };
    if (sweeps || with_rma) && rank == 1 {
        // 2 MiB aligned: every region of every working set is a whole Firehose region.
        served.expose(leak_buf(target_len, 2 << 20));
    }
    let keys = if a.tests.contains(&args::Test::App) {
        a.app_keys
    } else {
        1
    };
    let own = leak_buf(keys * 8, 4096);
    let app_own = (own.as_mut_ptr().cast::<u64>(), keys);
    let own: &'static [u8] = own;
    let mut app_recv = std::ptr::null();
    if a.tests.contains(&args::Test::App) {
        let recv = leak_buf(keys * 8, 4096);
        app_recv = recv.as_ptr().cast();
        served.expose(recv);
    }
    let dst_len = if with_rma { a.bw_size.max(4096) } else { 0 };
    let dst = leak_buf(dst_len, 4096).as_mut_ptr();
    // SAFETY: the leaked block is dst_len (at least 1) bytes for the rest of the process; the
    // view lives only for the registration below, before any get writes it.
    let dst_view: &[u8] = unsafe { std::slice::from_raw_parts(dst, dst_len.max(1)) };
    let local_keys = Arc::new(LocalKeys::new(&pd, &[src, own, dst_view]));
    Ctx {
        peers,
        rma,
        raw,
        served,
        local_keys,
        fh,
        src,
        target_len,
        dst,
        dst_len,
        app_own,
        app_recv,
    }
}

fn main() {
    let a = match args::parse(std::env::args_os().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("fh_bench: {e}");
            }
            eprint!("{}", args::USAGE);
            std::process::exit(if e.is_empty() { 0 } else { 2 });
        }
    };
    let mut ctx = setup(&a);
    let me = ctx.peers.rank();
    let mut rep = report::Report::new(&ctx, &a);
    if me == 0 && !a.json {
        print!("{}", rep.header());
    }
    for t in &a.tests {
        ctx.barrier(t.name());
        match t {
            args::Test::App => app::run(&mut ctx, &a, &mut rep),
            args::Test::Rma if me == 0 => rma::run(&ctx, &a, &mut rep),
            args::Test::Rma if me == 1 => ctx.serve_rma(),
            _ if me == 0 => sweep::run(&ctx, &a, *t, &mut rep),
            _ if me == 1 => ctx.serve(),
            _ => {}
        }
        if me == 0 && !a.json {
            print!("{}", rep.table(*t));
        }
    }
    ctx.barrier("end");
    if me == 0 {
        rep.finish();
    }
    let _ = ctx.peers.finalize();
    // The handlers hold the Rma (and so the Peers): without this the cycle keeps the bootstrap
    // from being finalized (mpirun then calls the exit improper).
    ctx.served.uninstall(ctx.peers.am());
}
