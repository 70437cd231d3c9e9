//! The runtime layer: the bottom of the crate. Owns what every other layer leans on and that
//! knows nothing of caches, pins, networks or hooks. It may call only `std` and `libc`: no file
//! here imports another layer of this crate (`scripts/check-layers` checks it).
//!
//! - `inside`: "this thread is inside the library" (per-thread slots a hook reads without a
//!   thread-local);
//! - `fork`: the `pthread_atfork` handlers and the table of fork hooks that lock owners register
//!   (each with its place in the lock order), and the fork generation;
//! - `raw_thread`, `race_once`, `monotonic`, `counted`: threads that never touch the allocator's
//!   thread-locals, a first-use initialiser that never waits, the monotonic clock, an in-flight
//!   count guard;
//! - `futex`, `lock`: futex wait and wake as raw system calls, and the mutex without poisoning
//!   of the hottest lock (the remote-pinning engine's);
//! - `log`: the one logging path (`FH_LOG`, the host's callback), std only;
//! - `range_counts`: per-address counts of overlapping ranges (the mlock pinner's locked pages,
//!   the userfaultfd's watches);
//! - `seam`: the two traits where the cache and the monitor meet. Both layers implement or call
//!   them and neither may import the other, so the traits live below both;
//!
//! `config` (the environment's settings) is not here: it parses into types of `helper` and
//! `pin`, so it sits above them, in `src/config/`.

pub(crate) mod counted;
pub(crate) mod fork;
pub(crate) mod futex;
pub mod inside;
pub(crate) mod lock;
pub mod log;
pub(crate) mod monotonic;
/// A first-use initialiser that never makes a thread wait (fork-safe); shared with the shim.
#[doc(hidden)]
pub mod race_once;
pub(crate) mod range_counts;
pub(crate) mod raw_thread;
pub mod seam;
