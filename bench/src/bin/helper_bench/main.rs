//! helper_bench: the helper thread (Li et al., "Scalable Memory Registration for High Performance
//! Networks Using Helper Threads" (CF 2011)) against the lazy cache and against no cache, on Li et
//! al.'s Figure 1 microbenchmark and on communication skeletons with the structure of NAS CG and
//! MG, side by side in one run, on one backend.
//!
//! A "communication" is what a pinning-based transport does with a user buffer: register it,
//! let the NIC read it (here: a copy of the buffer into a peer buffer, the DMA's memory traffic),
//! deregister it. Communication time is the sum over all communications of that whole span, so
//! pins on the critical path count and the computation between them does not. Computation is a
//! busy loop of the given length. Modes:
//! - `nocache`: every registration pinned and unpinned (a cache with `max_regions = 0`);
//! - `lazy`: the pin-down cache as it is (regions stay pinned until evicted);
//! - `helper`: the same cache with the helper thread, forced on (`Placement::Anywhere`: the
//!   placement policy would keep it off on a loaded 2-core host; the header says what the policy
//!   said);
//! - `tracked` (with `--tracked`): the helper thread with a planner that never pins or unpins, so
//!   the row shows what tracking alone costs the program (the events, the helper's own loop)
//!   apart from what its pins and unpins do.
//!
//! Pinned bytes are recorded at every pin and unpin of the backend (exact, the same way for every
//! mode); time-averaged over the run. Modes run in rotating order over `--reps` repetitions;
//! medians are reported, and `comm_step`: each communication's median over the repetitions,
//! summed, which the communication-time target is judged on (on a shared host a preemption
//! lands in a few communications of one repetition and can decide a median of whole runs).
//! `--cores A,B` binds the program to core A and the helper to core B, the idle core the
//! paper's placement policy gives a helper. `--series DIR` writes each mode's pinned-bytes
//! series of the last repetition as CSV (`scripts/bench-helper` plots them).

#[path = "../../cli.rs"]
mod cli;
#[path = "../../memlock.rs"]
mod memlock;
mod model;
mod recorder;
mod report;
mod workload;

use std::sync::Arc;
use std::time::{Duration, Instant};

use firehose::internals::cache::{Cache, Limits};
use firehose::internals::helper::PlannerConfig;
use firehose::internals::helper::{self, Helper, HelperConfig, HelperStats, Placement};
use firehose::internals::pin::{Access, Pinner};

use recorder::{PinnedLog, Recorder};
use workload::Program;

pub struct Args {
    quick: bool,
    json: bool,
    reps: usize,
    backend: String,
    series: Option<std::path::PathBuf>,
    json_file: Option<std::path::PathBuf>,
    only: Option<String>,
    cores: Option<(usize, usize)>,
    tracked: bool,
    /// `--compute-scale`: a factor, or `None` for `auto`.
    compute_scale: Option<f64>,
}

const USAGE: &str = "\
usage: helper_bench [--quick] [--json] [--reps 3] [--backend mlock|verbs] [--series DIR]
                    [--json-file PATH] [--only fig1|cg|mg] [--cores A,B] [--tracked]
                    [--compute-scale F|auto]
  The helper thread vs the lazy cache vs no cache on Li et al.'s Figure 1 and on NAS CG / MG
  communication skeletons: communication time, time-averaged and peak pinned bytes, the
  helper's predictions; measured here, then modelled (the planner on a modelled clock with
  the costs calibrated here). --series DIR: pinned bytes over time as CSV, one file per run,
  and each communication's median time per mode (<program>-<mode>-steps.csv).
  --json-file PATH: the JSON document there as well as the table on stdout.
  --cores A,B: the program runs on core A (every mode), the helper on core B: the idle core
  the placement policy asks for (default: both unbound, the helper forced on).
  --tracked: a fourth measured mode, the helper thread with a planner that never acts: what
  tracking alone costs (not modelled, no target).
  --compute-scale F|auto: every computation times F (default 1). auto: F is how much slower
  than the reference machine this one copies 512 KiB, when that is 2x or more (an emulated
  guest, where a wall-clock spin keeps its length but every copy is 10-30x slower); else 1.
  FH_HELPER_CLOCK=auto|tsc|monotonic: the helper's clock, as in the library (the header
  says which one ran).
";

/// `--compute-scale`: a positive finite factor, or `auto` (`None`).
fn compute_scale(v: &str) -> Result<Option<f64>, lexopt::Error> {
    if v == "auto" {
        return Ok(None);
    }
    match v.parse::<f64>() {
        Ok(f) if f.is_finite() && f > 0.0 => Ok(Some(f)),
        _ => Err(format!("--compute-scale {v:?}: want a positive number or auto").into()),
    }
}

/// `A,B` of `--cores`: two different core numbers.
fn cores(v: &str) -> Result<(usize, usize), lexopt::Error> {
    let bad = || lexopt::Error::from(format!("--cores {v:?}: want A,B, two different cores"));
    let (a, b) = v.split_once(',').ok_or_else(bad)?;
    let a: usize = a.trim().parse().map_err(|_| bad())?;
    let b: usize = b.trim().parse().map_err(|_| bad())?;
    if a == b {
        return Err(bad());
    }
    Ok((a, b))
}

fn parse() -> Result<Args, String> {
    use lexopt::prelude::*;
    let mut a = Args {
        quick: false,
        json: false,
        reps: 3,
        backend: "mlock".into(),
        series: None,
        json_file: None,
        only: None,
        cores: None,
        tracked: false,
        compute_scale: Some(1.0),
    };
    let mut p = lexopt::Parser::from_env();
    cli::finish((|| {
        while let Some(arg) = p.next()? {
            match arg {
                Long("quick") => a.quick = true,
                Long("json") => a.json = true,
                Long("reps") => a.reps = cli::num(&mut p, "--reps")?,
                Long("backend") => a.backend = p.value()?.string()?,
                Long("series") => a.series = Some(p.value()?.string()?.into()),
                Long("json-file") => a.json_file = Some(p.value()?.string()?.into()),
                Long("only") => a.only = Some(p.value()?.string()?),
                Long("cores") => a.cores = Some(cores(&p.value()?.string()?)?),
                Long("tracked") => a.tracked = true,
                Long("compute-scale") => a.compute_scale = compute_scale(&p.value()?.string()?)?,
                Short('h') | Long("help") => return Ok(None),
                _ => return Err(arg.unexpected()),
            }
        }
        if a.reps == 0 {
            return Err("--reps must be > 0".into());
        }
        Ok(Some(()))
    })())?;
    Ok(a)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    NoCache,
    Lazy,
    Helper,
    /// The helper thread, never acting (`--tracked`).
    Tracked,
}

impl Mode {
    /// The modes that are modelled and judged.
    pub const ALL: [Mode; 3] = [Mode::NoCache, Mode::Lazy, Mode::Helper];
    pub fn name(self) -> &'static str {
        match self {
            Mode::NoCache => "nocache",
            Mode::Lazy => "lazy",
            Mode::Helper => "helper",
            Mode::Tracked => "tracked",
        }
    }

    /// A helper thread runs (its columns are shown).
    pub fn has_helper(self) -> bool {
        matches!(self, Mode::Helper | Mode::Tracked)
    }

    /// The helper's planner in this mode.
    pub fn planner(self) -> PlannerConfig {
        if self == Mode::Tracked {
            PlannerConfig::never_acting()
        } else {
            PlannerConfig::default()
        }
    }
}

/// One run of one program in one mode.
pub struct Run {
    pub comm_ns: u64,
    /// Each communication's time, in program order (for `report`'s per-step medians).
    pub step_ns: Vec<u64>,
    pub total_ns: u64,
    pub pinned: PinnedLog,
    pub helper: Option<HelperStats>,
}

/// Private anonymous memory, touched (resident, as communication buffers are).
struct Mem {
    addr: usize,
    len: usize,
}

impl Mem {
    fn new(len: usize) -> Mem {
        // SAFETY: a fresh anonymous mapping; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "mmap {len}");
        // SAFETY: writable mapping of `len` bytes.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 7, len) };
        Mem {
            addr: p as usize,
            len,
        }
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        // SAFETY: our own mapping.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

/// This thread bound to one core until dropped (then its previous mask again).
struct Bound(libc::cpu_set_t);

impl Bound {
    fn to(cpu: usize) -> Bound {
        // SAFETY: an all-zero cpu_set_t is a valid empty set; sched_getaffinity fills it for
        // this thread.
        let old = unsafe {
            let mut old: libc::cpu_set_t = std::mem::zeroed();
            let size = std::mem::size_of::<libc::cpu_set_t>();
            assert_eq!(libc::sched_getaffinity(0, size, &mut old), 0);
            old
        };
        if let Err(e) = helper::placement::bind_current_thread(cpu) {
            panic!("helper_bench: cannot bind the program to core {cpu}: errno {e}");
        }
        Bound(old)
    }
}

impl Drop for Bound {
    fn drop(&mut self) {
        // SAFETY: a mask this thread had; affects this thread only.
        unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.0) };
    }
}

fn spin(us: u64) {
    let t = Instant::now();
    let d = Duration::from_micros(us);
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

const ACCESS: Access = Access(1 | 4); // local write, remote read: a send buffer

/// `cores`: (the program's core, the helper's core), from `--cores`; `None`: both unbound.
/// `FH_HELPER_CLOCK` (a bad value exits with the reason, as the library's settings do).
fn helper_clock() -> firehose::internals::helper::clock::ClockChoice {
    firehose::internals::config::helper_clock_from_env().unwrap_or_else(|_| std::process::exit(2))
}

fn run(p: &Program, mode: Mode, backend: &Arc<dyn Pinner>, cores: Option<(usize, usize)>) -> Run {
    let rec = Recorder::new(backend.clone());
    let limits = Limits {
        max_pinned: 1 << 40,
        max_regions: if mode == Mode::NoCache { 0 } else { 16384 },
    };
    let pinner: Arc<dyn Pinner> = if mode.has_helper() {
        helper::wrap_backend(rec.clone())
    } else {
        rec.clone()
    };
    let cache = Cache::new(pinner, limits, None);
    let h = if mode.has_helper() {
        let h = Helper::start(
            &cache,
            HelperConfig {
                placement: match cores {
                    Some((_, helper_cpu)) => Placement::Cpu(helper_cpu),
                    None => Placement::Anywhere,
                },
                planner: mode.planner(),
                clock: helper_clock(),
                ..HelperConfig::default()
            },
        );
        // Wait for its calibration (its pins are not the program's).
        h.wait_started(Duration::from_secs(5));
        h
    } else {
        Helper::off("not this mode")
    };
    // Bound after the helper started (it checks its core against this thread's mask).
    let _bound = cores.map(|(program_cpu, _)| Bound::to(program_cpu));
    let bufs: Vec<Mem> = p.bufs.iter().map(|&l| Mem::new(l)).collect();
    let peer = Mem::new(*p.bufs.iter().max().unwrap());
    rec.start();
    let t_start = Instant::now();
    let mut comm = Duration::ZERO;
    let mut step_ns = Vec::with_capacity(p.steps.len());
    for s in &p.steps {
        let b = &bufs[s.buf];
        let t0 = Instant::now();
        let reg = h
            .register(&cache, s.site, b.addr, b.len, ACCESS)
            .expect("register");
        // SAFETY: both are live mappings of at least `b.len` bytes, distinct.
        unsafe { std::ptr::copy_nonoverlapping(b.addr as *const u8, peer.addr as *mut u8, b.len) };
        h.deregister(&cache, reg.handle).expect("deregister");
        let d = t0.elapsed();
        comm += d;
        step_ns.push(d.as_nanos() as u64);
        spin(s.compute_us);
    }
    let total = t_start.elapsed();
    let pinned = rec.finish();
    let helper = mode.has_helper().then(|| h.stats());
    drop(h);
    drop(cache);
    Run {
        comm_ns: comm.as_nanos() as u64,
        step_ns,
        total_ns: total.as_nanos() as u64,
        pinned,
        helper,
    }
}

fn open_backend(name: &str) -> Result<Arc<dyn Pinner>, String> {
    match name {
        "mlock" => Ok(Arc::new(firehose::internals::pin::MlockPinner::new())),
        "verbs" => {
            use firehose::internals::pin::verbs::{open_device, VerbsPinner};
            let pd = open_device(None)
                .and_then(|ctx| ctx.alloc_pd())
                .map_err(|e| format!("verbs backend: {e:?}"))?;
            Ok(Arc::new(VerbsPinner::new(pd)))
        }
        other => Err(format!("unknown backend {other:?} (mlock or verbs)")),
    }
}

fn main() {
    let args = cli::or_exit(parse(), "helper_bench", USAGE);
    let memlock = memlock::raise();
    if let Some((a, b)) = args.cores {
        let allowed = helper::placement::allowed_cpus();
        if !allowed.contains(&a) || !allowed.contains(&b) {
            eprintln!("helper_bench: --cores {a},{b}: not both in the affinity mask {allowed:?}");
            std::process::exit(1);
        }
    }
    let backend = match open_backend(&args.backend) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("helper_bench: {e}");
            std::process::exit(1);
        }
    };
    let placement = match helper::placement::decide(Placement::Auto) {
        Ok(_) => "an idle core is available".to_string(),
        Err(why) => why,
    };
    let (scale, scale_why) = match args.compute_scale {
        Some(f) => (f, "--compute-scale".to_string()),
        None => {
            let ns = model::copy_ns(workload::SCALE_PROBE_BYTES);
            (
                workload::auto_scale(ns),
                format!(
                    "auto: 512 KiB copied in {:.1} us here, {:.1} us on the reference machine",
                    ns as f64 / 1e3,
                    workload::REFERENCE_COPY_NS as f64 / 1e3
                ),
            )
        }
    };
    let programs: Vec<Program> = [
        workload::figure1(args.quick),
        workload::cg(args.quick),
        workload::mg(args.quick),
    ]
    .into_iter()
    .filter(|p| match args.only.as_deref() {
        None => true,
        Some(o) => o == p.name,
    })
    .map(|mut p| {
        p.stretch_compute(scale);
        p
    })
    .collect();
    let costs = model::costs(&backend);
    let mut modelled = Vec::new();
    for p in &programs {
        let steps = model::steps(p);
        let runs: Vec<(Mode, firehose::internals::helper::sim::Outcome)> = Mode::ALL
            .iter()
            .map(|&m| (m, model::run(&steps, m, costs)))
            .collect();
        if let Some(dir) = &args.series {
            if let Err(e) = report::write_model_series(dir, p, &runs) {
                eprintln!("helper_bench: --series {}: {e}", dir.display());
                std::process::exit(1);
            }
        }
        modelled.push(report::summarize_model(&runs));
    }
    let mut modes = Mode::ALL.to_vec();
    if args.tracked {
        modes.push(Mode::Tracked);
    }
    let mut results = Vec::new();
    for p in &programs {
        let mut runs: Vec<(Mode, Run)> = Vec::new();
        for rep in 0..args.reps {
            for i in 0..modes.len() {
                let mode = modes[(i + rep) % modes.len()];
                if !args.json {
                    eprintln!(
                        "{}: {} (rep {}/{})",
                        p.name,
                        mode.name(),
                        rep + 1,
                        args.reps
                    );
                }
                runs.push((mode, run(p, mode, &backend, args.cores)));
            }
        }
        if let Some(dir) = &args.series {
            if let Err(e) = report::write_series(dir, p, &runs) {
                eprintln!("helper_bench: --series {}: {e}", dir.display());
                std::process::exit(1);
            }
        }
        results.push(report::summarize(&modes, &runs));
    }
    let header = report::Header {
        backend: backend.name().to_string(),
        memlock: memlock.describe(),
        placement,
        binding: match args.cores {
            Some((a, b)) => format!("program on core {a}, helper on core {b}"),
            None => "unbound".into(),
        },
        reps: args.reps,
        quick: args.quick,
        compute_scale: scale,
        compute_scale_why: scale_why,
        costs: format!(
            "pin {:.1} us + {:.3} us/page, unpin {:.1} us + {:.3} us/page",
            costs.pin.0 as f64 / 1e3,
            costs.pin.1 as f64 / 1e3,
            costs.unpin.0 as f64 / 1e3,
            costs.unpin.1 as f64 / 1e3
        ),
    };
    let doc = report::json(&header, &programs, &results, &modelled);
    if let Some(path) = &args.json_file {
        if let Err(e) = std::fs::write(path, &doc) {
            eprintln!("helper_bench: --json-file {}: {e}", path.display());
            std::process::exit(1);
        }
    }
    if args.json {
        println!("{doc}");
    } else {
        print!("{}", report::table(&header, &programs, &results, &modelled));
    }
}
