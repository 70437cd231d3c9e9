//! Shared helpers for tests/monitor_*.rs: a recording listener with a preallocated buffer (it runs
//! in hook context, so it must not allocate), a per-file serial lock (patching is process-wide and
//! tests in one file run on parallel threads), anonymous mappings, and re-exec of one test in a
//! child process (for tests that need a fresh process or malloc settings from the environment).
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use firehose::monitor::{self, MemoryListener, MonitorOptions, MonitorStatus, Subscription};

const N: usize = 1 << 16;

/// A test binary's monitor and the recorder subscribed to it.
pub struct Env {
    pub rec: Arc<Recorder>,
    _sub: Subscription,
}

/// The monitor installed once per test binary with `opts` (`check` judges what it installed) and
/// a recorder subscribed to it.
pub fn env_with(opts: MonitorOptions, check: fn(&MonitorStatus)) -> &'static Env {
    static E: OnceLock<Env> = OnceLock::new();
    E.get_or_init(|| {
        check(&monitor::install(opts));
        let rec = Recorder::new();
        let sub = monitor::subscribe(rec.clone());
        assert!(sub.is_active());
        Env { rec, _sub: sub }
    })
}

pub struct Recorder {
    start: Box<[AtomicUsize]>,
    len: Box<[AtomicUsize]>,
    next: AtomicUsize,
}

impl Recorder {
    pub fn new() -> Arc<Recorder> {
        let r = Arc::new(Recorder {
            start: (0..N).map(|_| AtomicUsize::new(0)).collect(),
            len: (0..N).map(|_| AtomicUsize::new(0)).collect(),
            next: AtomicUsize::new(0),
        });
        // The zeroed buffers come from calloc, untouched: fault them in now, or the first 2^16
        // events grow RSS by up to 1 MiB (which the RSS test, run alone, took for a leak).
        r.clear();
        r
    }

    pub fn clear(&self) {
        for i in 0..N {
            self.start[i].store(0, SeqCst);
            self.len[i].store(0, SeqCst);
        }
        self.next.store(0, SeqCst);
    }

    pub fn count(&self) -> usize {
        self.next.load(SeqCst)
    }

    fn any(&self, f: impl Fn(usize, usize) -> bool) -> bool {
        let n = self.next.load(SeqCst).min(N);
        (0..n).any(|i| {
            let l = self.len[i].load(SeqCst);
            l != 0 && f(self.start[i].load(SeqCst), l)
        })
    }

    /// Some event overlaps [addr, addr+len).
    pub fn saw_overlap(&self, addr: usize, len: usize) -> bool {
        self.any(|s, l| s < addr + len && addr < s + l)
    }

    /// Some single event covers all of [addr, addr+len).
    pub fn saw_cover(&self, addr: usize, len: usize) -> bool {
        self.any(|s, l| s <= addr && addr + len <= s + l)
    }

    /// Wait (uffd events are asynchronous) until an event covers the range, or time out.
    pub fn wait_cover(&self, addr: usize, len: usize) -> bool {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(2) {
            if self.saw_cover(addr, len) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        false
    }

    /// Wait long enough that a pending asynchronous event would have arrived, then check.
    pub fn settle_then_overlap(&self, addr: usize, len: usize) -> bool {
        std::thread::sleep(Duration::from_millis(200));
        self.saw_overlap(addr, len)
    }
}

impl MemoryListener for Recorder {
    fn on_unmap(&self, addr: usize, len: usize) {
        let i = self.next.fetch_add(1, SeqCst) % N;
        self.start[i].store(addr, SeqCst);
        self.len[i].store(len, SeqCst);
    }
}

static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

pub const PAGE: usize = 4096;

/// Anonymous private read/write mapping, touched so it has pages.
pub fn map(len: usize) -> usize {
    // SAFETY: new anonymous mapping; the caller owns it.
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
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: the mapping is ours and writable.
    unsafe { std::ptr::write_bytes(p as *mut u8, 1, len) };
    p as usize
}

/// Run `name` alone in a child copy of this test binary with extra environment; the child sees
/// `FH_CHILD=1`. Returns after asserting the child passed.
pub fn run_in_child(name: &str, env: &[(&str, &str)]) {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args([name, "--exact", "--test-threads=1", "--nocapture"])
        .env("FH_CHILD", "1")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child {name} failed: {text}");
    assert!(
        text.contains("1 passed"),
        "child did not run {name}: {text}"
    );
}

pub fn in_child() -> bool {
    std::env::var_os("FH_CHILD").is_some()
}

/// Resident set size in bytes.
pub fn rss() -> usize {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    s.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<usize>()
        .unwrap()
        * PAGE
}

/// Patches libc (every hook must be in) for the revoke tests, and returns whether this build tells
/// libc's own calls apart (needs naked functions); if not, prints a SKIP line.
pub fn patch_libc_telling_callers_apart() -> bool {
    let st = firehose::monitor::install(firehose::monitor::MonitorOptions {
        patch_libc: true,
        userfaultfd: false,
    });
    assert_eq!(st.patched, 0b11_1111, "{st:?}");
    if !firehose::monitor::tells_libc_apart() {
        eprintln!(
            "SKIP: this build cannot tell libc's own calls apart (needs Rust >= 1.88, x86_64)"
        );
        return false;
    }
    true
}

/// A revocation (8 queue slots) with these limits, not started.
pub fn revocation(
    timeout: std::time::Duration,
    stall: std::time::Duration,
) -> firehose::rma::revoke::Revocation {
    firehose::rma::revoke::Revocation::new(
        firehose::rma::revoke::RevokeSettings {
            enabled: true,
            timeout,
            stall,
        },
        8,
    )
}
