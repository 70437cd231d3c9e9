//! Metadata bytes per cached region, measured in a fresh child process (so earlier runs'
//! freed-but-kept heap cannot hide growth) over the null backend (so only cache bytes count).
//!
//! Three views, all "after caching n regions minus after creating the empty cache", over n:
//! - `alloc`: bytes live in Rust's global allocator (exact; ours only, UCX allocates in C);
//! - `heap`:  glibc malloc bytes in use (`mallinfo2`: uordblks + hblkhd), both sides;
//! - `rss`:   RssAnon growth: everything resident, including malloc overhead and UCX's
//!   mmap-backed pools. This is the number the target uses.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering::Relaxed};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::arena::{page_size, Arena};
use crate::backend::{CountingBackend, NullPinner};
use crate::impls::{unbounded, Ours, RegCache};
use crate::ucx::Ucx;

/// Global allocator that can count live bytes (only while enabled, so the timed runs in the
/// main process pay one relaxed load per allocation and nothing else).
pub struct CountingAlloc;

static COUNTING: AtomicBool = AtomicBool::new(false);
static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards every call unchanged to the system allocator; the counters have no effect
// on the memory returned.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNTING.load(Relaxed) {
            LIVE.fetch_add(l.size() as isize, Relaxed);
        }
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        if COUNTING.load(Relaxed) {
            LIVE.fetch_sub(l.size() as isize, Relaxed);
        }
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if COUNTING.load(Relaxed) {
            LIVE.fetch_add(new as isize - l.size() as isize, Relaxed);
        }
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(p, l, new) }
    }
}

/// Per-region bytes, three ways (see module doc). The child process prints it as JSON.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MetaSample {
    pub alloc: f64,
    pub heap: f64,
    pub rss: f64,
}

#[derive(Debug, Clone)]
pub struct MetaRow {
    pub imp: &'static str,
    pub regions: usize,
    pub per_region: MetaSample,
}

struct Snapshot {
    alloc: isize,
    heap: usize,
    rss: usize,
}

fn snapshot() -> Snapshot {
    // SAFETY: mallinfo2 only reads allocator statistics.
    let mi = unsafe { libc::mallinfo2() };
    let rss_kb = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        .unwrap_or(0);
    Snapshot {
        alloc: LIVE.load(Relaxed),
        heap: mi.uordblks + mi.hblkhd,
        rss: rss_kb * 1024,
    }
}

fn per_region(a: &Snapshot, b: &Snapshot, n: usize) -> MetaSample {
    MetaSample {
        alloc: (b.alloc - a.alloc) as f64 / n as f64,
        heap: (b.heap as f64 - a.heap as f64) / n as f64,
        rss: (b.rss as f64 - a.rss as f64) / n as f64,
    }
}

/// Child-process side: cache `n` one-page regions in a fresh cache of `imp`; the line to print.
pub fn measure_here(imp: &str, n: usize) -> Result<String, String> {
    COUNTING.store(true, Relaxed);
    let page = page_size();
    // Not populated: the null backend never touches it, so it adds no RSS.
    let arena = Arena::new(n * page, false);
    let addrs: Vec<usize> = (0..n).map(|i| arena.slot(i, page)).collect();
    let backend = CountingBackend::new(Arc::new(NullPinner));
    let sample = match imp {
        "ours" => {
            let c = Ours::new(backend.clone(), unbounded());
            fill(&c, &addrs, page)?
        }
        "ucx" => {
            let c = Ucx::new(backend.clone(), 0)?;
            fill(&c, &addrs, page)?
        }
        other => return Err(format!("unknown impl {other:?}")),
    };
    if backend.pins() != n as u64 {
        return Err(format!("{imp}: {} pins for {n} regions", backend.pins()));
    }
    serde_json::to_string(&sample).map_err(|e| e.to_string())
}

fn fill<C: RegCache>(c: &C, addrs: &[usize], len: usize) -> Result<MetaSample, String> {
    // One region first so lazily-created structures (thread-local slots, first tree node)
    // count as fixed cost, not per region.
    let h = c.get(addrs[0], len).ok_or("get failed")?;
    c.put(h);
    let before = snapshot();
    for &a in &addrs[1..] {
        let h = c.get(a, len).ok_or("get failed")?;
        c.put(h);
    }
    let after = snapshot();
    Ok(per_region(&before, &after, addrs.len() - 1))
}

/// Parent side: run `measure_here` in a child process and parse its line.
pub fn measure(imp: &'static str, n: usize) -> Result<MetaRow, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = std::process::Command::new(exe)
        .args(["--internal-metadata", imp, &n.to_string()])
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    match serde_json::from_str::<MetaSample>(text.trim()) {
        Ok(per_region) if out.status.success() => Ok(MetaRow {
            imp,
            regions: n,
            per_region,
        }),
        _ => Err(format!(
            "metadata child for {imp} failed: {} {}",
            text.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}
