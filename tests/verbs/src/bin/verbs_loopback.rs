//! verbs-loopback: the first real-verbs test. Two RC QPs on one port, connected to each other,
//! move data through buffers registered by the project's `VerbsPinner`:
//! RDMA WRITE (A -> B), RDMA READ (A <- B), SEND/RECV (A -> B), each with a distinct pattern and
//! every byte checked on the receiving side; then an RDMA WRITE into memory registered without
//! remote-write rights must fail with a remote access error (registration rights are enforced).
//!
//! Exit: 0 pass, 77 skip (no RDMA device), 1 fail (first bad offset, expected vs got).
//! `--break-check` or `FH_TEST_BREAK=1` corrupts one expected byte to prove the check can fail.
//! Environment: FH_DEVICE or FH_RDMA_DEV (device, default first), FH_IB_PORT (default 1),
//! FH_GID_INDEX (RoCE GID index, default: 1 if populated else 0), FH_TEST_SIZE (bytes, default
//! 65536), FH_TEST_TIMEOUT_SECS (per completion wait, default 60: TCG guests are slow).

use std::sync::Arc;
use std::time::{Duration, Instant};

use firehose::internals::net::verbs::{
    gid_index_from_env, qp_state, wc_opcode, Completion, Cq, Path, Qp, QpCaps, SendFlags, Sge,
};
use firehose::internals::pin::verbs::{Context, VerbsError, VerbsPinner};
use firehose::internals::pin::{Access, Pinned, Pinner};
use firehose_verbs_tests::buffer::PageBuf;
use firehose_verbs_tests::pattern::{compare, pattern};
use firehose_verbs_tests::{EXIT_FAIL, EXIT_PASS};

/// `IBV_WC_REM_ACCESS_ERR`: the responder refused the rkey/rights.
const WC_REM_ACCESS_ERR: u32 = 10;

struct Options {
    device: Option<String>,
    port: u8,
    gid_index: Option<u8>,
    size: usize,
    timeout: Duration,
    break_check: bool,
}

impl Options {
    fn parse() -> Result<Self, String> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let num = |k: &str, default: u64| -> Result<u64, String> {
            env(k).map_or(Ok(default), |v| {
                v.parse().map_err(|_| format!("{k}={v:?} is not a number"))
            })
        };
        let mut break_check = env("FH_TEST_BREAK").is_some_and(|v| v != "0");
        let mut size = num("FH_TEST_SIZE", 65536)? as usize;
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--break-check" => break_check = true,
                "--size" => {
                    let v = args.next().ok_or("--size needs a value")?;
                    size = v.parse().map_err(|_| format!("bad --size {v:?}"))?;
                }
                "-h" | "--help" => {
                    println!("usage: verbs-loopback [--break-check] [--size BYTES]");
                    std::process::exit(EXIT_PASS);
                }
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        if size == 0 || size > u32::MAX as usize {
            return Err(format!("size {size} out of range"));
        }
        let port = num("FH_IB_PORT", 1)?;
        Ok(Options {
            device: env("FH_DEVICE").or_else(|| env("FH_RDMA_DEV")),
            port: u8::try_from(port).map_err(|_| format!("FH_IB_PORT={port} out of range"))?,
            gid_index: gid_index_from_env().map_err(|e| e.to_string())?,
            size,
            timeout: Duration::from_secs(num("FH_TEST_TIMEOUT_SECS", 60)?),
            break_check,
        })
    }
}

fn main() {
    std::process::exit(run());
}

fn run() -> i32 {
    let opts = match Options::parse() {
        Ok(o) => o,
        Err(e) => {
            println!("FAIL: {e}");
            return EXIT_FAIL;
        }
    };
    // No device at all is a skip; a device that exists but cannot be used is a failure.
    let ctx = match firehose_verbs_tests::open_device_or_verdict(opts.device.as_deref()) {
        Ok(c) => c,
        Err(code) => return code,
    };
    match loopback(&ctx, &opts) {
        Ok(()) => {
            println!("PASS: verbs-loopback on {}", ctx.name());
            EXIT_PASS
        }
        Err(e) => {
            println!("FAIL: {e}");
            EXIT_FAIL
        }
    }
}

/// Unpins on drop, so an early error return leaves no registration behind.
struct PinGuard<'p> {
    pinner: &'p VerbsPinner,
    pinned: Pinned,
    addr: usize,
    len: usize,
}

impl PinGuard<'_> {
    fn new<'p>(
        pinner: &'p VerbsPinner,
        buf: &PageBuf,
        access: Access,
    ) -> Result<PinGuard<'p>, String> {
        let pinned = pinner
            .pin(buf.addr(), buf.len(), access)
            .map_err(|e| format!("VerbsPinner::pin({:#x}, {}): {e:?}", buf.addr(), buf.len()))?;
        if pinned.token == 0 {
            return Err("VerbsPinner::pin returned a null token".into());
        }
        Ok(PinGuard {
            pinner,
            pinned,
            addr: buf.addr(),
            len: buf.len(),
        })
    }

    fn sge(&self) -> Sge {
        Sge {
            addr: self.addr as u64,
            len: self.len as u32,
            lkey: self.pinned.lkey,
        }
    }
}

impl Drop for PinGuard<'_> {
    fn drop(&mut self) {
        self.pinner.unpin(self.pinned, self.addr, self.len);
    }
}

fn verr(e: VerbsError) -> String {
    e.to_string()
}

/// Wait for exactly `n` completions and require success for each.
fn wait_ok(cq: &Cq, n: usize, opts: &Options, what: &str) -> Result<Vec<Completion>, String> {
    let wcs = cq
        .wait(n, opts.timeout)
        .map_err(|e| format!("{what}: {e}"))?;
    for wc in &wcs {
        wc.into_result().map_err(|e| format!("{what}: {e}"))?;
    }
    Ok(wcs)
}

/// Require one completion with `wr_id`, `opcode` and `qpn` among `wcs`.
fn expect_wc(
    wcs: &[Completion],
    wr_id: u64,
    opcode: u32,
    qpn: u32,
    what: &str,
) -> Result<Completion, String> {
    let wc = wcs
        .iter()
        .find(|w| w.wr_id == wr_id)
        .ok_or_else(|| format!("{what}: no completion for wr_id {wr_id} in {wcs:?}"))?;
    if wc.opcode != opcode || wc.qp_num != qpn {
        return Err(format!(
            "{what}: completion {wc:?}, expected opcode {opcode} on qp {qpn}"
        ));
    }
    Ok(*wc)
}

/// Compare `buf` with the pattern for `seed`; with `corrupt`, one expected byte is flipped first.
fn check(step: &str, buf: &PageBuf, seed: u64, corrupt: bool) -> Result<(), String> {
    let mut expected = pattern(seed, buf.len());
    if corrupt {
        let at = expected.len() / 2;
        expected[at] ^= 0x5a;
        println!("break-check: corrupted the expected byte at offset {at} of {step}");
    }
    match compare(&expected, &buf.snapshot()) {
        None => Ok(()),
        Some(m) => Err(format!(
            "{step}: data mismatch: first bad offset {} expected {:#04x} got {:#04x} ({} of {} bytes differ)",
            m.offset,
            m.expected,
            m.got,
            m.count,
            buf.len()
        )),
    }
}

fn loopback(ctx: &Arc<Context>, opts: &Options) -> Result<(), String> {
    let path = Path::discover(ctx, opts.port, opts.gid_index).map_err(verr)?;
    let pd = ctx.alloc_pd().map_err(verr)?;
    let pinner = VerbsPinner::new(Arc::clone(&pd));
    let cq = ctx.create_cq(64).map_err(verr)?;
    let qa = Qp::create_rc(&pd, &cq, &cq, QpCaps::default()).map_err(verr)?;
    let qb = Qp::create_rc(&pd, &cq, &cq, QpCaps::default()).map_err(verr)?;
    let (psn_a, psn_b) = (0x00_1234, 0x00_5678);
    let (ea, eb) = (qa.endpoint(&path, psn_a), qb.endpoint(&path, psn_b));
    let remote = Access::REMOTE_WRITE.union(Access::REMOTE_READ);
    qa.connect(&path, psn_a, remote, &eb).map_err(verr)?;
    qb.connect(&path, psn_b, remote, &ea).map_err(verr)?;
    for (name, qp) in [("A", &qa), ("B", &qb)] {
        let st = qp.state().map_err(verr)?;
        if st != qp_state::IBV_QPS_RTS {
            return Err(format!(
                "QP {name} is in state {st} after connect, expected RTS"
            ));
        }
    }
    println!(
        "device {} port {} gid_index {:?} gid {} mtu_enum {} qpn A {} <-> B {} (RTS)",
        ctx.name(),
        path.port,
        path.gid_index,
        path.gid,
        path.mtu,
        qa.qpn(),
        qb.qpn()
    );

    let mut a = PageBuf::new(opts.size).map_err(|e| format!("mmap: {e}"))?;
    let mut b = PageBuf::new(opts.size).map_err(|e| format!("mmap: {e}"))?;
    let n = a.len();
    let rights = Access::LOCAL_WRITE
        .union(Access::REMOTE_WRITE)
        .union(Access::REMOTE_READ);
    let pa = PinGuard::new(&pinner, &a, rights)?;
    let pb = PinGuard::new(&pinner, &b, rights)?;
    println!(
        "pinned A {:#x}+{n} lkey {:#x} rkey {:#x}; B {:#x}+{n} lkey {:#x} rkey {:#x} (backend {})",
        pa.addr,
        pa.pinned.lkey,
        pa.pinned.rkey,
        pb.addr,
        pb.pinned.lkey,
        pb.pinned.rkey,
        pinner.name()
    );

    // 1. RDMA WRITE: A's pattern lands in B without B's CPU.
    a.fill(&pattern(0xA1, n));
    b.fill(&vec![0; n]);
    let t = Instant::now();
    // SAFETY: both buffers are registered and alive until after the completion is polled, and
    // nothing touches B until then.
    unsafe {
        qa.post_rdma_write(
            1,
            pa.sge(),
            pb.addr as u64,
            pb.pinned.rkey,
            SendFlags::SIGNALED,
        )
    }
    .map_err(verr)?;
    let wcs = wait_ok(&cq, 1, opts, "rdma_write")?;
    expect_wc(
        &wcs,
        1,
        wc_opcode::IBV_WC_RDMA_WRITE,
        qa.qpn(),
        "rdma_write",
    )?;
    check("rdma_write", &b, 0xA1, opts.break_check)?;
    println!("PASS rdma_write {n} bytes in {:?}", t.elapsed());

    // 2. RDMA READ: B's new pattern is pulled into A.
    b.fill(&pattern(0xB2, n));
    a.fill(&vec![0; n]);
    let t = Instant::now();
    // SAFETY: as above; A is written by the device and untouched until the completion.
    unsafe {
        qa.post_rdma_read(
            2,
            pa.sge(),
            pb.addr as u64,
            pb.pinned.rkey,
            SendFlags::SIGNALED,
        )
    }
    .map_err(verr)?;
    let wcs = wait_ok(&cq, 1, opts, "rdma_read")?;
    expect_wc(&wcs, 2, wc_opcode::IBV_WC_RDMA_READ, qa.qpn(), "rdma_read")?;
    check("rdma_read", &a, 0xB2, false)?;
    println!("PASS rdma_read {n} bytes in {:?}", t.elapsed());

    // 3. SEND/RECV: B posts a receive, A sends a third pattern into it.
    b.fill(&vec![0; n]);
    a.fill(&pattern(0xC3, n));
    let t = Instant::now();
    // SAFETY: B is registered, alive, and untouched until its receive completion.
    unsafe { qb.post_recv(3, pb.sge()) }.map_err(verr)?;
    // SAFETY: A is registered, alive and unmodified until the send completion.
    unsafe { qa.post_send(4, pa.sge(), SendFlags::SIGNALED) }.map_err(verr)?;
    let wcs = wait_ok(&cq, 2, opts, "send/recv")?;
    expect_wc(&wcs, 4, wc_opcode::IBV_WC_SEND, qa.qpn(), "send")?;
    let recv = expect_wc(&wcs, 3, wc_opcode::IBV_WC_RECV, qb.qpn(), "recv")?;
    if recv.byte_len as usize != n {
        return Err(format!("recv: byte_len {} expected {n}", recv.byte_len));
    }
    check("send/recv", &b, 0xC3, false)?;
    println!("PASS send/recv {n} bytes in {:?}", t.elapsed());

    // 4. Rights are enforced: an RDMA WRITE into memory pinned without REMOTE_WRITE must fail
    // with a remote access error, and the bytes must stay untouched. This breaks QP A (error
    // state), so it runs last.
    let mut c = PageBuf::new(4096).map_err(|e| format!("mmap: {e}"))?;
    c.fill(&pattern(0xD4, c.len()));
    let pc = PinGuard::new(&pinner, &c, Access::REMOTE_READ)?;
    let small = Sge {
        len: c.len() as u32,
        ..pa.sge()
    };
    // SAFETY: A is registered and alive; the target is expected to be refused by the responder.
    unsafe {
        qa.post_rdma_write(
            5,
            small,
            pc.addr as u64,
            pc.pinned.rkey,
            SendFlags::SIGNALED,
        )
    }
    .map_err(verr)?;
    let wcs = cq
        .wait(1, opts.timeout)
        .map_err(|e| format!("rights check: {e}"))?;
    match wcs[0] {
        Completion {
            wr_id: 5,
            status: WC_REM_ACCESS_ERR,
            ..
        } => {}
        wc => {
            return Err(format!(
                "rights check: RDMA WRITE into a REMOTE_READ-only registration completed with {wc:?} ({}), expected remote access error",
                wc.status_text()
            ))
        }
    }
    check("rights check (target untouched)", &c, 0xD4, false)?;
    println!(
        "PASS rights: write into REMOTE_READ-only memory refused ({})",
        wcs[0].status_text()
    );

    drop((pc, pa, pb));
    if pinner.dereg_failures() != 0 {
        return Err(format!(
            "{} ibv_dereg_mr calls failed",
            pinner.dereg_failures()
        ));
    }
    Ok(())
}
