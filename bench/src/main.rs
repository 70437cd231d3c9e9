//! firehose-bench: our registration cache side by side with UCX's rcache (libucs) and the raw
//! pinning backend, all in one run, on the same harness and the same backend.
//!
//! `cargo run --release -p firehose-bench -- [--json] [--quick] [--backend mlock|verbs|null]`

mod arena;
mod args;
mod backend;
mod hit;
mod impls;
mod memlock;
mod metadata;
mod miss;
mod ofi;
mod report;
mod summary;
mod targets;
mod ucx;

use std::sync::Arc;

use firehose::cache::Limits;
use firehose::pin::Pinner;

use arena::{page_size, Arena};
use backend::CountingBackend;
use hit::{HitConfig, HitRow, Pattern};
use impls::{unbounded, Ceiling, Ours, RegCache};
use ucx::Ucx;

#[global_allocator]
static GLOBAL: metadata::CountingAlloc = metadata::CountingAlloc;

/// Miss sizes.
const MISS_SIZES: [usize; 3] = [4 << 10, 64 << 10, 1 << 20];

fn main() {
    let args = match args::parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("firehose-bench: {e}");
            }
            eprint!("{}", args::USAGE);
            std::process::exit(if e.is_empty() { 0 } else { 2 });
        }
    };
    if let Some((imp, n)) = &args.internal_metadata {
        match metadata::measure_here(imp, *n) {
            Ok(line) => println!("{line}"),
            Err(e) => {
                eprintln!("firehose-bench metadata: {e}");
                std::process::exit(1);
            }
        }
        return;
    }
    if let Err(e) = run(&args) {
        eprintln!("firehose-bench: {e}");
        std::process::exit(1);
    }
}

fn run(args: &args::Args) -> Result<(), String> {
    let memlock = memlock::raise();
    let with_ofi = args.backend == "verbs";
    if with_ofi {
        ofi::Ofi::configure_env(*args.regions.iter().max().unwrap_or(&1));
    }
    let backend = backend::open(&args.backend)?;
    let threads: &[usize] = if args.quick { &[1, 2] } else { &[1, 2, 4] };
    let cfg = HitConfig {
        batch: if args.quick { 20_000 } else { 50_000 },
        batches: if args.quick { 10 } else { 100 },
    };
    let info = report::RunInfo {
        backend: backend.name().to_string(),
        memlock: memlock.describe(),
        quick: args.quick,
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        batch: cfg.batch,
        batches: cfg.batches,
        ucx_region_struct: Ucx::region_struct_size(),
        loadavg: loadavg(),
    };
    eprintln!(
        "firehose-bench: backend {}, {}, {} cpus, load average {}",
        info.backend, info.memlock, info.cpus, info.loadavg
    );

    let hits = hit_rows(&backend, &args.regions, threads, cfg, with_ofi)?;
    let misses = miss_rows(&backend, args.quick)?;
    eprintln!("metadata: caching 100000 regions in fresh child processes (null backend)");
    let meta = vec![
        metadata::measure("ours", 100_000)?,
        metadata::measure("ucx", 100_000)?,
    ];
    let targets = targets::compute(&hits, &misses, &meta, &args.regions);

    if args.json {
        println!("{}", report::json(&info, &hits, &misses, &meta, &targets));
        return Ok(());
    }
    println!(
        "# firehose-bench  backend={}  {}  cpus={}  load average at start {}  hit batches: {} x {} ops per thread{}",
        info.backend,
        info.memlock,
        info.cpus,
        info.loadavg,
        cfg.batches,
        cfg.batch,
        if args.quick { "  (quick)" } else { "" }
    );
    println!(
        "# one op = register + deregister; latency stats are over per-batch means; UCX region struct {} B ({} B UCX + our keys)",
        info.ucx_region_struct.1, info.ucx_region_struct.0
    );
    println!("\n## Hit cost (cached ranges; each thread its own regions)");
    print!("{}", report::hit_table(&hits));
    println!("\n## Thread scaling (aggregate throughput)");
    print!("{}", report::scaling_table(&hits, &args.regions, threads));
    println!(
        "\n## Miss cost vs raw {} (every op pins and unpins)",
        info.backend
    );
    print!("{}", report::miss_table(&misses));
    println!("\n## Metadata per cached region (fresh process, null backend)");
    print!("{}", report::meta_table(&meta));
    println!("\n## Targets");
    print!("{}", report::targets_table(&targets));
    Ok(())
}

/// Every hit row: per region count and thread count, a fresh cache of each implementation.
fn hit_rows(
    backend: &Arc<dyn Pinner>,
    counts: &[usize],
    threads: &[usize],
    cfg: HitConfig,
    with_ofi: bool,
) -> Result<Vec<HitRow>, String> {
    let page = page_size();
    let max_slots = counts
        .iter()
        .max()
        .unwrap()
        .max(threads.iter().max().unwrap());
    let arena = Arena::new(max_slots * page, true);
    let mut rows = Vec::new();
    for &n in counts {
        for &t in threads {
            let addrs: Vec<usize> = (0..n.max(t)).map(|i| arena.slot(i, page)).collect();
            let slices = hit::split(&addrs, t);
            eprintln!("hit: {} regions, {t} thread(s)", addrs.len());
            let counted = CountingBackend::new(backend.clone());
            let ours = Ours::new(counted.clone(), unbounded());
            rows.extend(hit_one(&ours, Some(&counted), &addrs, &slices, page, cfg)?);
            drop(ours);
            let counted = CountingBackend::new(backend.clone());
            let ucx = Ucx::new(counted.clone(), 0)?;
            rows.extend(hit_one(&ucx, Some(&counted), &addrs, &slices, page, cfg)?);
            drop(ucx);
            if with_ofi {
                match ofi::Ofi::open("verbs") {
                    Ok(o) => rows.extend(hit_one(&o, None, &addrs, &slices, page, cfg)?),
                    Err(e) => eprintln!("hit: skipping libfabric rows: {e}"),
                }
            }
            if n == 1 {
                // Machine ceiling for the scaling ratios (needs no backend).
                let row = hit::run(&Ceiling, &slices, page, Pattern::Same, cfg);
                rows.push(row);
            }
        }
    }
    // Display order: region count (as asked, not max(n, threads)), pattern, threads, impl.
    rows.sort_by_key(|r| {
        let nominal = if r.regions <= r.threads { 1 } else { r.regions };
        (nominal, r.pattern == Pattern::Random, r.threads, r.imp)
    });
    Ok(rows)
}

/// Populate, then time both patterns; checks that the timed loops never reached the backend
/// (when the bench owns the backend: `counted` is None for libfabric, which pins by itself).
fn hit_one<C: RegCache>(
    cache: &C,
    counted: Option<&CountingBackend>,
    addrs: &[usize],
    slices: &[Vec<usize>],
    len: usize,
    cfg: HitConfig,
) -> Result<Vec<HitRow>, String> {
    for &a in addrs {
        let h = cache
            .get(a, len)
            .ok_or_else(|| format!("{}: populate failed at {a:#x}", cache.name()))?;
        cache.put(h);
    }
    let pins = || counted.map_or(0, |c| c.pins());
    let backend_failures = || counted.map_or(0, |c| c.failures());
    if counted.is_some() && pins() != addrs.len() as u64 {
        return Err(format!(
            "{}: {} backend pins to cache {} distinct regions",
            cache.name(),
            pins(),
            addrs.len()
        ));
    }
    let mut rows = Vec::new();
    for p in [Pattern::Same, Pattern::Random] {
        let before = pins();
        let row = hit::run(cache, slices, len, p, cfg);
        let extra = pins() - before;
        if extra > 0 || row.failures > 0 || backend_failures() > 0 {
            return Err(format!(
                "{} {} {} regions {}T: {extra} backend pins and {} failures in a hit run",
                cache.name(),
                p.name(),
                row.regions,
                row.threads,
                row.failures
            ));
        }
        rows.push(row);
    }
    Ok(rows)
}

/// Miss rows: raw backend, ours with nothing kept, UCX with every region invalidated.
fn miss_rows(backend: &Arc<dyn Pinner>, quick: bool) -> Result<Vec<miss::MissRow>, String> {
    let rounds = if quick { 9 } else { 40 };
    let arena = Arena::new(MISS_SIZES.iter().sum(), true);
    let mut rows = Vec::new();
    let mut offset = 0;
    for &size in &MISS_SIZES {
        let addr = arena.base() + offset;
        offset += size;
        // Keep each batch around a millisecond or more so timer and scheduling noise stay small.
        let per_batch = ((4 << 20) / size).clamp(4, 200);
        eprintln!("miss: {size} B, {rounds} rounds of {per_batch} ops");
        let raw_b = CountingBackend::new(backend.clone());
        let ours_b = CountingBackend::new(backend.clone());
        let ucx_b = CountingBackend::new(backend.clone());
        let ours = Ours::new(
            ours_b.clone(),
            Limits {
                max_pinned: usize::MAX,
                max_regions: 0,
            },
        );
        let ucx = Ucx::new(ucx_b.clone(), 0)?;
        let (raw_op, ours_op, ucx_op) = (
            miss::Raw(&raw_b),
            miss::Uncached(&ours),
            miss::UcxInvalidated(&ucx),
        );
        let contenders = [
            miss::Contender {
                op: &raw_op,
                backend: &raw_b,
            },
            miss::Contender {
                op: &ours_op,
                backend: &ours_b,
            },
            miss::Contender {
                op: &ucx_op,
                backend: &ucx_b,
            },
        ];
        rows.extend(miss::run(&contenders, addr, size, per_batch, rounds));
    }
    Ok(rows)
}

/// The 1-minute load average at start: on a shared host, a load above the CPU count means the
/// multi-thread rows measured the scheduler as much as the caches (see the "ceil" rows).
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".to_string())
}
