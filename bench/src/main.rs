//! firehose-bench: our registration cache side by side with UCX's rcache (libucs) and the raw
//! pinning backend, all in one run, on the same harness and the same backend.
//!
//! `cargo run --release -p firehose-bench -- [--json] [--quick] [--backend mlock|verbs|null]`

mod arena;
mod args;
mod backend;
mod cli;
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

use firehose::internals::cache::Limits;
use firehose::internals::pin::Pinner;

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
    let args = match args::parse(std::env::args_os().skip(1)) {
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
        "# firehose-bench  backend={}  {}  cpus={}  load average at start {}  hit batches: {} x {} ops per thread (thread t on CPU t mod {}){}",
        info.backend,
        info.memlock,
        info.cpus,
        info.loadavg,
        cfg.batches,
        cfg.batch,
        info.cpus,
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
            let slices = &hit::split(&addrs, t);
            eprintln!("hit: {} regions, {t} thread(s)", addrs.len());
            // Every implementation is populated up front and then measured in alternating
            // segments, so load that comes and goes on a shared host lands on all of them.
            let ours_b = CountingBackend::new(backend.clone());
            let ours = Ours::new(ours_b.clone(), unbounded());
            populate(&ours, Some(&ours_b), &addrs, page)?;
            let ucx_b = CountingBackend::new(backend.clone());
            let ucx = Ucx::new(ucx_b.clone(), 0)?;
            populate(&ucx, Some(&ucx_b), &addrs, page)?;
            let ofi = if with_ofi {
                match ofi::Ofi::open("verbs") {
                    Ok(o) => {
                        populate(&o, None, &addrs, page)?;
                        Some(o)
                    }
                    Err(e) => {
                        eprintln!("hit: skipping libfabric rows: {e}");
                        None
                    }
                }
            } else {
                None
            };
            let mut contenders: Vec<HitFn<'_>> = vec![
                Box::new(|p, c| timed(&ours, Some(&ours_b), slices, page, p, c).map(Some)),
                Box::new(|p, c| timed(&ucx, Some(&ucx_b), slices, page, p, c).map(Some)),
            ];
            if let Some(o) = &ofi {
                contenders.push(Box::new(move |p, c| {
                    timed(o, None, slices, page, p, c).map(Some)
                }));
            }
            if n == 1 {
                // Machine ceiling for the scaling ratios (needs no backend, one pattern).
                contenders.push(Box::new(|p, c| {
                    Ok((p == Pattern::Same).then(|| hit::run(&Ceiling, slices, page, p, c)))
                }));
            }
            for p in [Pattern::Same, Pattern::Random] {
                rows.extend(alternate(&mut contenders, p, cfg)?);
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

/// One implementation's timed run of a pattern for some batches (None: not measured).
type HitFn<'a> = Box<dyn FnMut(Pattern, HitConfig) -> Result<Option<HitRow>, String> + 'a>;

/// Segments per row: each implementation runs `batches / SEGMENTS` batches at a time, in
/// rotating order, until every one has run all of its batches.
const SEGMENTS: usize = 5;

fn alternate(
    contenders: &mut [HitFn<'_>],
    p: Pattern,
    cfg: HitConfig,
) -> Result<Vec<HitRow>, String> {
    let segs = SEGMENTS.min(cfg.batches);
    let mut rows: Vec<Option<HitRow>> = vec![None; contenders.len()];
    for seg in 0..segs {
        let seg_cfg = HitConfig {
            batch: cfg.batch,
            batches: cfg.batches * (seg + 1) / segs - cfg.batches * seg / segs,
        };
        for j in 0..contenders.len() {
            let i = (j + seg) % contenders.len();
            if let Some(r) = (contenders[i])(p, seg_cfg)? {
                match &mut rows[i] {
                    Some(acc) => acc.merge(r),
                    slot => *slot = Some(r),
                }
            }
        }
    }
    Ok(rows.into_iter().flatten().collect())
}

/// Cache every region once (get + put) and check each cost exactly one backend pin.
fn populate<C: RegCache>(
    cache: &C,
    counted: Option<&CountingBackend>,
    addrs: &[usize],
    len: usize,
) -> Result<(), String> {
    for &a in addrs {
        let h = cache
            .get(a, len)
            .ok_or_else(|| format!("{}: populate failed at {a:#x}", cache.name()))?;
        cache.put(h);
    }
    match counted {
        Some(c) if c.pins() != addrs.len() as u64 => Err(format!(
            "{}: {} backend pins to cache {} distinct regions",
            cache.name(),
            c.pins(),
            addrs.len()
        )),
        _ => Ok(()),
    }
}

/// One timed segment; fails if the backend saw a single pin during it (not a pure hit run) —
/// checked when the bench owns the backend (`counted` is None for libfabric, which pins itself).
fn timed<C: RegCache>(
    cache: &C,
    counted: Option<&CountingBackend>,
    slices: &[Vec<usize>],
    len: usize,
    p: Pattern,
    cfg: HitConfig,
) -> Result<HitRow, String> {
    let pins = || counted.map_or(0, |c| c.pins());
    let before = pins();
    let row = hit::run(cache, slices, len, p, cfg);
    let extra = pins() - before;
    let backend_failures = counted.map_or(0, |c| c.failures());
    if extra > 0 || row.failures > 0 || backend_failures > 0 {
        return Err(format!(
            "{} {} {} regions {}T: {extra} backend pins, {} failed gets, {backend_failures} \
             failed pins in a hit run",
            cache.name(),
            p.name(),
            row.regions,
            row.threads,
            row.failures
        ));
    }
    Ok(row)
}

/// Miss rows: raw backend, ours with nothing kept, raw in the evicting order, ours full and
/// evicting (against raw-lru), UCX with every region invalidated.
fn miss_rows(backend: &Arc<dyn Pinner>, quick: bool) -> Result<Vec<miss::MissRow>, String> {
    // A round costs ~5 ms at most (all rows, all sizes: ~13 ms), and the per-round ratios are noisy on
    // a shared host: 200 rounds keep the median steady to a few tenths of a percent.
    let rounds = if quick { 20 } else { 200 };
    // Each size twice: the evicting row alternates between two ranges.
    let total: usize = MISS_SIZES.iter().sum();
    let arena = Arena::new(2 * total, true);
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
        let lru_b = CountingBackend::new(backend.clone());
        let raw_lru_b = CountingBackend::new(backend.clone());
        let ucx_b = CountingBackend::new(backend.clone());
        let ours = Ours::new(
            ours_b.clone(),
            Limits {
                max_pinned: usize::MAX,
                max_regions: 0,
            },
        );
        let one = Ours::new(
            lru_b.clone(),
            Limits {
                max_pinned: usize::MAX,
                max_regions: 1,
            },
        );
        let ucx = Ucx::new(ucx_b.clone(), 0)?;
        let (raw_op, ours_op, ucx_op) = (
            miss::Raw(&raw_b),
            miss::CacheMiss {
                cache: &ours,
                name: "ours",
            },
            miss::UcxInvalidated(&ucx),
        );
        let lru_op = miss::CacheMiss {
            cache: &one,
            name: "ours-lru",
        };
        let raw_lru_op = miss::RawEvicting {
            backend: &raw_lru_b,
            held: std::cell::Cell::new(None),
        };
        let contenders = [
            miss::Contender {
                op: &raw_op,
                backend: &raw_b,
                reference: 0,
            },
            miss::Contender {
                op: &ours_op,
                backend: &ours_b,
                reference: 0,
            },
            miss::Contender {
                op: &raw_lru_op,
                backend: &raw_lru_b,
                reference: 0,
            },
            miss::Contender {
                op: &lru_op,
                backend: &lru_b,
                reference: 2,
            },
            miss::Contender {
                op: &ucx_op,
                backend: &ucx_b,
                reference: 0,
            },
        ];
        rows.extend(miss::run(
            &contenders,
            [addr, addr + total],
            size,
            per_batch,
            rounds,
        ));
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
