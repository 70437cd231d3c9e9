//! wake_floor: what it costs on this machine to get an answer from a thread that sleeps, without
//! RDMA: the floor under `am_bench --test attn` with a progress thread that sleeps on the
//! completion channel. Two processes, as the two ranks under mpirun (each bound to one CPU):
//! the child's "responder" thread sleeps in `poll(2)` on a pipe while the child's main thread
//! computes (then sleeps) in blocks, as am_bench's rank 1 does; the parent writes a byte at random
//! times and spins on the answer, as am_bench's requester spins in `Am::wait`. The round trip
//! is one wake-up of a sleeping thread on the other CPU plus two pipe operations: whatever an
//! event-driven progress thread does, it pays at least this (under a TCG VM, an inter-processor
//! interrupt to another vCPU and an emulated scheduler round, hundreds of microseconds).
//!
//! The answer carries the responder's CLOCK_MONOTONIC reading when it woke, so the table also
//! splits out the wake-up (request written -> responder running).

#[path = "../cli.rs"]
mod cli;
#[path = "am_bench/pace.rs"]
mod pace;
#[path = "am_bench/summary.rs"]
mod summary;

use serde_json::json;
use std::hint::black_box;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;
use summary::Summary;

const USAGE: &str = "\
usage: wake_floor [--samples 40] [--block-ms 100] [--cpus 0,1] [--json]
  A thread sleeping in poll() on CPU B answers pipe writes from a spinning process on CPU A,
  while its own process's main thread computes (phase compute), then sleeps (phase sleep), in
  --block-ms blocks: the wake-up floor under am_bench's attentiveness test (same phases, same
  random request times). Reply = write -> answer seen; wake = write -> responder running.
";

struct Args {
    samples: usize,
    block_ms: u64,
    cpus: (usize, usize),
    json: bool,
}

fn parse() -> Result<Args, String> {
    use lexopt::prelude::*;
    let mut a = Args {
        samples: 40,
        block_ms: 100,
        cpus: (0, 1),
        json: false,
    };
    let mut p = lexopt::Parser::from_env();
    cli::finish((|| {
        while let Some(arg) = p.next()? {
            match arg {
                Long("samples") => a.samples = cli::num(&mut p, "--samples")?,
                Long("block-ms") => a.block_ms = cli::num(&mut p, "--block-ms")?,
                Long("cpus") => {
                    let v = p.value()?.string()?;
                    a.cpus = v
                        .split_once(',')
                        .and_then(|(x, y)| Some((x.trim().parse().ok()?, y.trim().parse().ok()?)))
                        .ok_or_else(|| format!("--cpus {v:?}: want two CPU numbers, A,B"))?;
                }
                Long("json") => a.json = true,
                Short('h') | Long("help") => return Ok(None),
                _ => return Err(arg.unexpected()),
            }
        }
        if a.samples == 0 || a.block_ms == 0 {
            return Err("--samples and --block-ms must be > 0".into());
        }
        Ok(Some(()))
    })())?;
    Ok(a)
}

/// Messages on the request pipe (one byte each).
const REQUEST: u8 = b'r';
const COMPUTE: u8 = b'c';
const SLEEP: u8 = b's';
const QUIT: u8 = b'q';

/// The phases, in am_bench attn's order and names.
const PHASES: [(u8, &str); 2] = [(COMPUTE, "compute"), (SLEEP, "sleep")];

fn die(msg: String) -> ! {
    eprintln!("wake_floor: {msg}");
    std::process::exit(1);
}

fn mono_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Binds the calling thread (and the threads it creates later) to `cpu`.
fn bind(cpu: usize) -> Result<(), String> {
    // bind_current_thread expects a CPU its caller checked (CPU_SET indexes a fixed-size set).
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(format!("CPU {cpu} is out of range"));
    }
    firehose::internals::helper::placement::bind_current_thread(cpu).map_err(|errno| {
        format!(
            "cannot bind to CPU {cpu}: {}",
            std::io::Error::from_raw_os_error(errno)
        )
    })
}

fn write_all(fd: i32, b: &[u8]) {
    // SAFETY: `b` is valid for reads of its length. Pipe writes this small are atomic.
    let n = unsafe { libc::write(fd, b.as_ptr().cast(), b.len()) };
    if n != b.len() as isize {
        die(format!("pipe write: {}", std::io::Error::last_os_error()));
    }
}

/// The child: a responder thread sleeping in poll() on `req`, the main thread busy per phase.
fn child(req: i32, ans: i32, block: Duration) -> ! {
    let phase = Arc::new(AtomicU8::new(COMPUTE));
    let p = phase.clone();
    let responder = std::thread::spawn(move || loop {
        let mut pfd = libc::pollfd {
            fd: req,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; the pipe is blocking, so after POLLIN a read returns data.
        let (n, b) = unsafe {
            libc::poll(&mut pfd, 1, -1);
            let mut b = 0u8;
            (libc::read(req, (&mut b as *mut u8).cast(), 1), b)
        };
        let woke = mono_ns();
        if n == 0 {
            std::process::exit(0); // end of file: the parent is gone, so are we
        }
        if n != 1 {
            continue; // EINTR: poll again
        }
        if b != REQUEST {
            p.store(b, Ordering::Release);
        }
        write_all(ans, &woke.to_ne_bytes());
        if b == QUIT {
            return;
        }
    });
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    loop {
        match phase.load(Ordering::Acquire) {
            QUIT => break,
            SLEEP => std::thread::sleep(block),
            _ => x = pace::compute(block, x), // am_bench rank 1's arithmetic
        }
    }
    black_box(x);
    let _ = responder.join();
    std::process::exit(0);
}

/// Parent side: sends one byte, spins until the 8-byte answer is there; (round trip, wake) in
/// microseconds.
fn ask(req: i32, ans: i32, what: u8) -> (f64, f64) {
    let t0 = mono_ns();
    write_all(req, &[what]);
    let mut buf = [0u8; 8];
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: the tail of `buf` is valid for writes; `ans` is non-blocking.
        let n = unsafe { libc::read(ans, buf[got..].as_mut_ptr().cast(), buf.len() - got) };
        if n > 0 {
            got += n as usize;
        } else if n == 0 {
            die("the responder exited".into());
        } else {
            std::hint::spin_loop();
        }
    }
    let t2 = mono_ns();
    let woke = u64::from_ne_bytes(buf);
    (
        t2.saturating_sub(t0) as f64 / 1e3,
        woke.saturating_sub(t0) as f64 / 1e3,
    )
}

struct Phase {
    name: &'static str,
    reply: Summary,
    wake: Summary,
}

fn pipe() -> [i32; 2] {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` has room for the two descriptors.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        die(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    fds
}

fn main() {
    let a = cli::or_exit(parse(), "wake_floor", USAGE);
    let (req, ans) = (pipe(), pipe());
    let block = Duration::from_millis(a.block_ms);
    // Bind before forking, so a CPU that is not there fails here, in one process.
    bind(a.cpus.1).unwrap_or_else(|e| die(e));
    // SAFETY: no other thread exists yet; the child only uses async-signal-safe calls until it
    // creates its own threads, in a fresh single-threaded process.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        die(format!("fork: {}", std::io::Error::last_os_error()));
    }
    // Each side closes the other's ends, so that either one sees end of file when the other
    // is gone.
    if pid == 0 {
        // SAFETY: closing descriptors this process owns and no longer uses.
        unsafe {
            libc::close(req[1]);
            libc::close(ans[0]);
        }
        child(req[0], ans[1], block);
    }
    // SAFETY: as above.
    unsafe {
        libc::close(req[0]);
        libc::close(ans[1]);
    }
    bind(a.cpus.0).unwrap_or_else(|e| die(e));
    // SAFETY: `ans[0]` is our open read end.
    unsafe { libc::fcntl(ans[0], libc::F_SETFL, libc::O_NONBLOCK) };
    let mut phases = Vec::new();
    for (i, (code, name)) in PHASES.into_iter().enumerate() {
        ask(req[1], ans[0], code);
        std::thread::sleep(block); // the child is in its phase before the first request
        let mut rng = pace::rng(i);
        let (mut reply, mut wake) = (Vec::new(), Vec::new());
        for _ in 0..a.samples {
            std::thread::sleep(Duration::from_micros(rng.u64(..a.block_ms * 1000)));
            let (r, w) = ask(req[1], ans[0], REQUEST);
            reply.push(r);
            wake.push(w);
        }
        phases.push(Phase {
            name,
            reply: Summary::of(&reply),
            wake: Summary::of(&wake),
        });
    }
    ask(req[1], ans[0], QUIT);
    let mut status = 0;
    // SAFETY: `pid` is our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    print!("{}", report(&a, &phases));
}

fn report(a: &Args, phases: &[Phase]) -> String {
    if a.json {
        let ps: Vec<_> = phases
            .iter()
            .map(|p| json!({"busy": p.name, "samples": a.samples, "reply_us": p.reply, "wake_us": p.wake}))
            .collect();
        return format!(
            "{}\n",
            json!({"test": "wake", "block_ms": a.block_ms, "cpus": [a.cpus.0, a.cpus.1], "phases": ps})
        );
    }
    let mut s = format!(
        "Wake-up floor: a thread sleeping in poll() on CPU {} answers a spinning writer on CPU {}; its process busy in {} ms blocks\n \
         busy      #samples  t_min[usec]  t_typical[usec]  99% percentile[usec]  t_max[usec]  wake t_typical[usec]\n",
        a.cpus.1, a.cpus.0, a.block_ms
    );
    for p in phases {
        s += &format!(
            " {:<9} {:<9} {:<12.1} {:<16.1} {:<21.1} {:<12.1} {:.1}\n",
            p.name,
            a.samples,
            p.reply.min,
            p.reply.typical,
            p.reply.p99,
            p.reply.max,
            p.wake.typical
        );
    }
    s
}
