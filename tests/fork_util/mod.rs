//! What the fork tests share: fork a child that runs one function and leaves with its result,
//! wait for it under a timeout (a child stuck on a lock inherited from the parent is killed and
//! reported), the first core this process may run on, and a stderr write that does not lock.
#![allow(dead_code)] // each test uses a part

use std::ffi::c_void;
use std::time::{Duration, Instant};

use firehose::ffi::*;
use firehose::status::fh_status;

/// A child that needs longer than this is stuck (each does a few system calls and pins).
pub const CHILD_TIMEOUT: Duration = Duration::from_secs(10);

/// Fork; the child runs `f` and exits with its result (99 if it panicked). Returns the pid.
pub fn fork_run(f: impl FnOnce() -> i32) -> libc::pid_t {
    // SAFETY: the child only runs `f` (allocation is fork-safe in glibc) and leaves with _exit,
    // never returning into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let rc = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(99);
        // SAFETY: leave the child without running the parent's atexit or test machinery.
        unsafe { libc::_exit(rc) };
    }
    pid
}

/// Wait for child `pid` to exit 0; kill it after [`CHILD_TIMEOUT`].
pub fn wait_child(pid: libc::pid_t) -> Result<(), String> {
    let t0 = Instant::now();
    let mut status = 0;
    loop {
        // SAFETY: waiting for our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break;
        }
        if t0.elapsed() > CHILD_TIMEOUT {
            // SAFETY: our child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return Err(format!("child {pid} hung (killed after {CHILD_TIMEOUT:?})"));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        Ok(())
    } else {
        Err(format!("child {pid} status {status:#x}"))
    }
}

/// Register `[p, p + len)` for local writes; the handle, or the status.
pub fn register(c: *mut fh_cache, p: usize, len: usize) -> Result<u64, fh_status> {
    let mut mr = std::mem::MaybeUninit::<fh_mr>::uninit();
    // SAFETY: live cache, valid out pointer.
    match unsafe {
        fh_register(
            c,
            p as *const c_void,
            len,
            FH_ACCESS_LOCAL_WRITE,
            mr.as_mut_ptr(),
        )
    } {
        // SAFETY: written on FH_OK.
        fh_status::FH_OK => Ok(unsafe { mr.assume_init() }.handle),
        e => Err(e),
    }
}

/// The first core this process may run on (the tests bind a forced helper to it: the machines
/// they run on seldom have an idle core).
pub fn first_cpu() -> u32 {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the call fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer and size.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    assert_eq!(rc, 0, "sched_getaffinity");
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `set` was filled above.
        .find(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .expect("no allowed cpu") as u32
}

/// Write to stderr with one system call (a child must not take the parent's stderr lock).
pub fn say(msg: &str) {
    // SAFETY: writing our own bytes to fd 2.
    unsafe { libc::write(2, msg.as_ptr() as *const c_void, msg.len()) };
}

/// A cache through the C API: `fh_config_init`'s defaults, then what `set` changes.
pub fn cache_with(set: impl FnOnce(&mut fh_config)) -> Result<*mut fh_cache, fh_status> {
    let mut cfg = std::mem::MaybeUninit::<fh_config>::uninit();
    // SAFETY: valid for one fh_config write.
    let rc = unsafe { fh_config_init(cfg.as_mut_ptr()) };
    if rc != fh_status::FH_OK {
        return Err(rc);
    }
    // SAFETY: initialised by fh_config_init (FH_OK).
    let mut cfg = unsafe { cfg.assume_init() };
    set(&mut cfg);
    let mut c = std::ptr::null_mut();
    // SAFETY: a valid config and out pointer.
    match unsafe { fh_cache_new(&cfg, &mut c) } {
        fh_status::FH_OK => Ok(c),
        e => Err(e),
    }
}
