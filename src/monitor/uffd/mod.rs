//! userfaultfd event source: catches what no libc hook can see (raw `syscall(SYS_munmap)`, brk
//! shrinking by glibc's internal `__sbrk`, other libraries' private syscall stubs) for ranges a
//! [`UffdWatcher`] watches.
//!
//! - Mode WP only: registering does not take over page faults (nothing is ever write-protected).
//! - Exactly the pinned ranges are registered, and only while pinned: the cache calls `watch` after
//!   each cached pin and one `unwatch` with the same values when that region is unpinned. A pinned
//!   range is already its own VMA(s) (mlock sets VM_LOCKED, `ibv_reg_mr` MADV_DONTFORK), so
//!   registering it splits nothing the pin did not split, and unregistering at unpin lets the
//!   kernel merge the VMAs back. Nothing outside a watched range is ever registered: registering a
//!   whole VMA read from /proc/self/maps (the old way) raced with other threads mapping and
//!   unmapping next to it, split their mappings and made their `mremap` fail with EFAULT.
//! - `watch` always issues UFFDIO_REGISTER (a no-op in the kernel for what this context already
//!   has). No "already registered" state is trusted: another thread may have unmapped the range
//!   and mapped new memory there before the reader even read the UNMAP event, and that new memory
//!   must be registered too, or its own unmap goes unseen.
//! - A process-wide count of live watches per address ([`RangeCounts`], under [`STATE`]'s mutex,
//!   updated together with the ioctls) decides what `unwatch` unregisters: only what no live watch
//!   covers any more (two caches may pin the same pages).
//! - A watch whose memory was unmapped or moved away is stale: its `unwatch` may come much later
//!   (a region is unpinned when its cache next drains, or when its holder releases it), and until
//!   then its count would keep registered whatever memory was mapped there since, splitting the
//!   new owner's mapping (its `mremap` then fails with EFAULT; since Linux 6.17 a same-size
//!   MREMAP_FIXED move of several VMAs even moves the part before the registered one first). So
//!   the reader puts every unmapped/moved range into a ring, and each `watch`/`unwatch` first
//!   marks the watches over them stale ([`sync_events`]); a stale watch no longer counts. Its own
//!   `unwatch` then only unregisters what no live watch covers: UFFDIO_UNREGISTER of memory that
//!   is unmapped or not registered is a no-op.
//! - The kernel blocks a thread that unmaps a registered range until the event is *read*, so the
//!   reader thread (`fh-uffd`) never waits for a lock: it reads a batch and runs the listeners.
//! - The event arrives *after* the pages are gone: between the unmap and the listener call, a
//!   cache could still hand out the stale registration. [`quiesce`] closes that for the thread
//!   that unmapped; only the synchronous hooks close it for other threads.
//! - If the reader cannot go on (poll/read error, its fd closed under it) userfaultfd is turned off
//!   for good and the fd closed, which unregisters everything (see [`retire`]).
//! - brk: when glibc trims the heap (`__sbrk` with a negative increment) the kernel sends UNMAP
//!   for the released part of a registered heap range.
//! - After fork the child's mappings are no longer registered (no EVENT_FORK) and the inherited
//!   context belongs to the parent: the child forgets the counts and opens its own fd on its first
//!   watch.
//!
//! Files, by job: `abi.rs` (the kernel ABI, from linux-raw-sys), `state.rs` (what the watch side
//! and the reader share), `watch.rs` (watch counting, registration), `reader.rs` (the `fh-uffd`
//! thread, `quiesce`, `retire`), `hooks.rs` (the fork hook and the test hook).

mod abi;
mod hooks;
mod reader;
mod state;
mod watch;

#[cfg(any(test, feature = "test-support"))]
pub(super) use hooks::test_fail_reader;
pub(super) use hooks::FORK_HOOK;
pub use reader::quiesce;
pub(super) use state::fill_status;
pub use state::{watch_costs, WatchCosts};
pub use watch::UffdWatcher;
pub(super) use watch::{open, start_reader, unwatch, watch};
