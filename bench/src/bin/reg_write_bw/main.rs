//! reg_write_bw: a perftest-style RDMA WRITE benchmark where the source buffer is registered and
//! deregistered around every WRITE, as an application without a registration cache does. Run it
//! plain, then under `LD_PRELOAD=libfirehose_preload.so` (the shim interposes `ibv_reg_mr` and
//! `ibv_dereg_mr` at dynamic-link time; this program calls them like any verbs application), and
//! with `--mode once` for the registered-once upper bound. `scripts/bench-preload` runs all three.
//!
//! Under TCG the emulated data path of a 64 KiB WRITE takes milliseconds, so the message rate
//! alone hides a registration cost of ~100 us: the time inside the registration calls is
//! measured separately (CLOCK_MONOTONIC via `Instant`) and reported per iteration.
//!
//! Exit: 0 ok, 77 no RDMA device, 1 failure (including a data check failure), 2 bad arguments.

mod args;
#[path = "../../cli.rs"]
mod cli;
mod clock;
mod report;
mod shim_stats;

use std::sync::Arc;
use std::time::{Duration, Instant};

use firehose::internals::net::verbs::{
    gid_index_from_env, Completion, Cq, Path, Qp, QpCaps, SendFlags, Sge,
};
use firehose::internals::pin::verbs::{DeviceList, Mr, Pd, VerbsError};
use firehose::internals::pin::Access;
use rdma_sys::{ibv_dereg_mr, ibv_mr, ibv_reg_mr};

use args::{Args, Mode};
use report::Result as RunResult;

/// perftest's rights for its buffers (every registration of the run uses the same class).
const RIGHTS: Access =
    Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0);
/// A WRITE that has not completed after this long means a broken QP, not a slow guest.
const COMPLETION_TIMEOUT: Duration = Duration::from_secs(60);

fn main() {
    let args = match args::parse(std::env::args_os().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("reg_write_bw: {e}");
            }
            eprint!("{}", args::USAGE);
            std::process::exit(if e.is_empty() { 0 } else { 2 });
        }
    };
    let list = match DeviceList::get() {
        Ok(l) if !l.is_empty() => l,
        Ok(_) | Err(VerbsError::NoDevice(_)) => {
            eprintln!("reg_write_bw: SKIP: no RDMA device");
            std::process::exit(77);
        }
        Err(e) => fail(&e.to_string()),
    };
    let ctx = list
        .open(args.device.as_deref())
        .unwrap_or_else(|e| fail(&e.to_string()));
    drop(list);
    match run(&ctx, &args) {
        Ok(r) => {
            if args.json {
                println!("{}", report::json(&args, ctx.name(), &r));
            } else {
                print!("{}", report::table(&args, ctx.name(), &r));
            }
        }
        Err(e) => fail(&e),
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("reg_write_bw: FAIL: {msg}");
    std::process::exit(1);
}

/// An anonymous private mapping: page-aligned, like perftest's buffers, and never shared with
/// another buffer's pages (so a registration for one can never cover another).
struct PageBuf {
    ptr: *mut u8,
    len: usize,
}

impl PageBuf {
    fn new(len: usize) -> Result<Self, String> {
        // SAFETY: anonymous mapping request; the kernel picks the address.
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
        if p == libc::MAP_FAILED {
            return Err(format!("mmap {len}: {}", std::io::Error::last_os_error()));
        }
        Ok(PageBuf { ptr: p.cast(), len })
    }

    fn addr(&self) -> usize {
        self.ptr as usize
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is `len` readable bytes until drop; callers read only while no
        // work request targeting this buffer is outstanding.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, writable, and `&mut self` excludes other Rust references.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PageBuf {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `new`, once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// The loopback pair: A writes into B's destination buffer; both live on one port.
struct Loop {
    pd: Arc<Pd>,
    cq: Arc<Cq>,
    qa: Qp,
    _qb: Qp,
    wcs: Vec<Completion>,
}

fn connect(ctx: &Arc<firehose::internals::pin::verbs::Context>, port: u8) -> Result<Loop, String> {
    let e = |e: VerbsError| e.to_string();
    let path = Path::discover(ctx, port, gid_index_from_env().map_err(e)?).map_err(e)?;
    let pd = ctx.alloc_pd().map_err(e)?;
    let cq = ctx.create_cq(16).map_err(e)?;
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 1,
        ..QpCaps::default()
    };
    let qa = Qp::create_rc(&pd, &cq, &cq, caps).map_err(e)?;
    let qb = Qp::create_rc(&pd, &cq, &cq, caps).map_err(e)?;
    let (psn_a, psn_b) = (0x2_0001, 0x3_0001);
    let (ea, eb) = (qa.endpoint(&path, psn_a), qb.endpoint(&path, psn_b));
    let remote = Access::REMOTE_WRITE.union(Access::REMOTE_READ);
    qa.connect(&path, psn_a, remote, &eb).map_err(e)?;
    qb.connect(&path, psn_b, remote, &ea).map_err(e)?;
    Ok(Loop {
        pd,
        cq,
        qa,
        _qb: qb,
        wcs: Vec::with_capacity(4),
    })
}

impl Loop {
    /// One signalled RDMA WRITE of `src` (lkey) to `dst` (rkey), waited for by busy polling.
    fn write(&mut self, src: Sge, dst: u64, rkey: u32) -> Result<(), String> {
        // SAFETY: the caller keeps `src` registered and unmodified, and the destination range
        // registered and unread, until this function has polled the completion.
        unsafe {
            self.qa
                .post_rdma_write(1, src, dst, rkey, SendFlags::SIGNALED)
        }
        .map_err(|e| e.to_string())?;
        let start = Instant::now();
        let mut spins = 0u32;
        self.wcs.clear();
        while self.cq.poll(1, &mut self.wcs).map_err(|e| e.to_string())? == 0 {
            // Soft-RoCE completes from kernel work: yield so it runs on a 2-CPU guest.
            std::thread::yield_now();
            spins = spins.wrapping_add(1);
            if spins & 1023 == 0 && start.elapsed() > COMPLETION_TIMEOUT {
                return Err(format!("no completion in {COMPLETION_TIMEOUT:?}"));
            }
        }
        let wc = self.wcs[0];
        wc.into_result().map(|_| ()).map_err(|e| e.to_string())
    }
}

/// `ibv_reg_mr` by symbol: exactly the call a verbs application makes (and the shim interposes).
fn reg(pd: &Pd, buf: &PageBuf, len: usize) -> Result<*mut ibv_mr, String> {
    // SAFETY: the PD is alive; the range is a live mapping of ours; registration does not touch
    // the bytes from this process.
    let mr = unsafe { ibv_reg_mr(pd.as_raw(), buf.ptr.cast(), len, RIGHTS.0 as i32) };
    if mr.is_null() {
        return Err(format!("ibv_reg_mr: {}", std::io::Error::last_os_error()));
    }
    Ok(mr)
}

fn dereg(mr: *mut ibv_mr) -> Result<(), String> {
    // SAFETY: `mr` came from `reg` and is deregistered exactly once.
    let rc = unsafe { ibv_dereg_mr(mr) };
    if rc != 0 {
        return Err(format!(
            "ibv_dereg_mr: {}",
            std::io::Error::from_raw_os_error(rc)
        ));
    }
    Ok(())
}

fn lkey(mr: *mut ibv_mr) -> u32 {
    // SAFETY: `mr` is a live MR returned by ibv_reg_mr (or the shim's wrapper with real keys).
    unsafe { (*mr).lkey }
}

/// Source byte `i` of buffer `b`: differs between buffers, so a key that points at the wrong
/// buffer shows in the check. Bytes 0..8 are overwritten by the iteration stamp.
fn pattern(b: usize, i: usize) -> u8 {
    (i.wrapping_mul(7) ^ (i >> 9) ^ b.wrapping_mul(0x3d)) as u8
}

fn run(
    ctx: &Arc<firehose::internals::pin::verbs::Context>,
    args: &Args,
) -> Result<RunResult, String> {
    let mut lp = connect(ctx, args.port)?;
    let n = args.size;
    let mut srcs = (0..args.buffers)
        .map(|_| PageBuf::new(n))
        .collect::<Result<Vec<_>, _>>()?;
    for (b, s) in srcs.iter_mut().enumerate() {
        for (i, x) in s.bytes_mut().iter_mut().enumerate() {
            *x = pattern(b, i);
        }
    }
    // One destination slot per source buffer, registered once for the whole run.
    let dst = PageBuf::new(n * args.buffers)?;
    let dst_mr = Mr::register(&lp.pd, dst.addr(), dst.len, RIGHTS).map_err(|e| e.to_string())?;
    let once: Vec<*mut ibv_mr> = match args.mode {
        Mode::Once => srcs
            .iter()
            .map(|s| reg(&lp.pd, s, n))
            .collect::<Result<_, _>>()?,
        Mode::PerIter => Vec::new(),
    };

    let clk = clock::Clock::new(args.clock);
    let total = args.warmup + args.iters;
    let mut reg_ns = Vec::with_capacity(args.iters);
    let mut iter_ns = Vec::with_capacity(args.iters);
    let mut shim_before = None;
    let mut t_start = Instant::now();
    let mut c_start = clk.now();
    for k in 0..total {
        if k == args.warmup {
            shim_before = shim_stats::snapshot();
            t_start = Instant::now();
            c_start = clk.now();
        }
        let b = k % args.buffers;
        // The stamp: which iteration wrote this slot last (checked at the end).
        srcs[b].bytes_mut()[..8].copy_from_slice(&(k as u64).to_le_bytes());
        let slot = (dst.addr() + b * n) as u64;
        let sge = |key| Sge {
            addr: srcs[b].addr() as u64,
            len: n as u32,
            lkey: key,
        };
        // Raw clock readings (see clock.rs); a difference is clamped at 0 should the thread
        // move to a CPU whose counter lags.
        let t0 = clk.now();
        let (reg_ticks, t1) = match args.mode {
            Mode::PerIter => {
                let mr = reg(&lp.pd, &srcs[b], n)?;
                let ta = clk.now();
                lp.write(sge(lkey(mr)), slot, dst_mr.rkey())?;
                let tb = clk.now();
                dereg(mr)?;
                let t1 = clk.now();
                (ta.saturating_sub(t0) + t1.saturating_sub(tb), t1)
            }
            Mode::Once => {
                lp.write(sge(lkey(once[b])), slot, dst_mr.rkey())?;
                (0, clk.now())
            }
        };
        if k >= args.warmup {
            reg_ns.push(reg_ticks);
            iter_ns.push(t1.saturating_sub(t0));
        }
    }
    let span = t_start.elapsed();
    let f = clock::ns_per_tick(
        args.clock,
        clk.now().saturating_sub(c_start),
        span.as_nanos() as u64,
    );
    for v in reg_ns.iter_mut().chain(iter_ns.iter_mut()) {
        *v = (*v as f64 * f) as u64;
    }
    let shim_after = shim_stats::snapshot();
    for mr in once {
        dereg(mr)?;
    }
    let verified = verify(&srcs, &dst, total, args.buffers)?;
    drop(dst_mr);
    let mut r = RunResult::new(reg_ns, iter_ns, span, verified, shim_before.zip(shim_after));
    (r.clock_us, r.tick_read_us) = clock::read_costs_us(&clk);
    Ok(r)
}

/// Every destination slot must hold its source buffer's bytes, stamped with the last iteration
/// that wrote it: a registration that resolved to the wrong pages (or a stale write) fails here.
/// Returns the number of bytes checked.
fn verify(srcs: &[PageBuf], dst: &PageBuf, total: usize, buffers: usize) -> Result<usize, String> {
    let n = srcs[0].len;
    let mut checked = 0;
    for (b, src) in srcs.iter().enumerate().take(total.min(buffers)) {
        let last = (total - 1 - b) / buffers * buffers + b;
        let got = &dst.bytes()[b * n..(b + 1) * n];
        let stamp = u64::from_le_bytes(got[..8].try_into().expect("8 bytes"));
        if stamp != last as u64 {
            return Err(format!(
                "slot {b}: stamp {stamp}, expected iteration {last}"
            ));
        }
        if let Some(i) = (8..n).find(|&i| got[i] != src.bytes()[i]) {
            return Err(format!(
                "slot {b}: byte {i} is {:#04x}, source has {:#04x}",
                got[i],
                src.bytes()[i]
            ));
        }
        checked += n;
    }
    Ok(checked)
}
