//! What tracking a registration for the helper thread costs its caller: register + deregister of
//! one of two 512 KiB buffers (alternating, always a hit), timed apart from the transfer, with
//!
//! - `off`: no helper (the lazy cache alone);
//! - `track`: a helper bound to core 1 whose planner never pins or unpins, so what remains is
//!   the tracking (the use event, the helper's loop);
//! - `sleeper`: no helper, but a thread on core 1 that wakes every 500 us and does nothing (what
//!   another thread's wake-ups alone do to the program's core on this host).
//!
//! The program runs on core 0. Usage: `track_profile off|track|sleeper [N] [copy] [COMPUTE_US]`
//! (N communications, default 100000; `copy`: copy the buffer between register and
//! deregister, as a transfer would; COMPUTE_US of busy loop between communications, default 5).
//! Prints ns per communication: in all, in `register`, in the copy, in `deregister`. Run the
//! modes alternately and compare medians: the host's noise moves single runs by 10 %.
use std::sync::Arc;
use std::time::{Duration, Instant};

use firehose::internals::cache::{Cache, Limits};
use firehose::internals::helper::PlannerConfig;
use firehose::internals::helper::{Helper, HelperConfig, Placement};
use firehose::internals::pin::{Access, Pinner};

fn spin(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let mode = a.get(1).map(String::as_str).unwrap_or("off");
    if !matches!(mode, "off" | "track" | "sleeper") {
        eprintln!("usage: track_profile off|track|sleeper [N] [copy] [COMPUTE_US]");
        std::process::exit(2);
    }
    let n: usize = a.get(2).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let copy = a.get(3).is_some_and(|s| s == "copy");
    let compute = Duration::from_micros(a.get(4).and_then(|s| s.parse().ok()).unwrap_or(5));
    let backend: Arc<dyn Pinner> = Arc::new(firehose::internals::pin::MlockPinner::new());
    let pinner = if mode == "track" {
        firehose::internals::helper::wrap_backend(backend)
    } else {
        backend
    };
    let limits = Limits {
        max_pinned: 1 << 40,
        max_regions: 16384,
    };
    let cache = Cache::new(pinner, limits, None);
    if mode == "sleeper" {
        std::thread::spawn(|| {
            let _ = firehose::internals::helper::placement::bind_current_thread(1);
            loop {
                std::thread::sleep(Duration::from_micros(500));
            }
        });
    }
    let h = if mode == "track" {
        let h = Helper::start(
            &cache,
            HelperConfig {
                placement: Placement::Cpu(1),
                planner: PlannerConfig::never_acting(),
                ..HelperConfig::default()
            },
        );
        h.wait_started(Duration::from_secs(5));
        h
    } else {
        Helper::off("not this mode")
    };
    if let Err(e) = firehose::internals::helper::placement::bind_current_thread(0) {
        eprintln!("track_profile: cannot bind to core 0: errno {e}");
    }
    let len = 512 << 10;
    let buf = vec![1u8; 2 * len + 4096];
    let mut dst = vec![0u8; len];
    let base = (buf.as_ptr() as usize + 4095) & !4095;
    let access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_READ.0);
    let (mut reg, mut cp, mut dereg) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    for i in 0..n {
        let addr = base + (i & 1) * len;
        let t0 = Instant::now();
        let r = h
            .register(&cache, 0x1000 + (i & 1), addr, len, access)
            .expect("register");
        let t1 = Instant::now();
        if copy {
            // SAFETY: both are live, distinct buffers of at least `len` bytes.
            unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, dst.as_mut_ptr(), len) };
            std::hint::black_box(&mut dst);
        }
        let t2 = Instant::now();
        h.deregister(&cache, r.handle).expect("deregister");
        let t3 = Instant::now();
        reg += t1 - t0;
        cp += t2 - t1;
        dereg += t3 - t2;
        spin(compute);
    }
    let per = |d: Duration| d.as_nanos() as f64 / n as f64;
    println!(
        "{mode}: {:.1} ns per communication: register {:.1}, copy {:.1}, deregister {:.1}",
        per(reg + cp + dereg),
        per(reg),
        per(cp),
        per(dereg)
    );
}
