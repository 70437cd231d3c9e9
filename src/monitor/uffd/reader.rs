//! The `fh-uffd` reader thread: poll, read a batch of events, hand the ranges to the watch side
//! (the ring) and to the listeners; [`quiesce`] for a caller that must not run ahead of it; and
//! its way out when it cannot go on ([`retire`]).

use std::sync::atomic::Ordering::SeqCst;
use std::sync::TryLockError;
use std::time::Duration;

use libc::c_int;

use super::super::guard::notify_guarded;
use super::abi::{self, errno, Msg, EVENT_REMAP, EVENT_REMOVE, EVENT_UNMAP};
use super::state::*;
use crate::rt::seam::UnmapEvent;

/// Wait until every userfaultfd event the reader has already read is dispatched to the listeners.
///
/// Why: the kernel lets an unmapping thread continue as soon as its UNMAP event is *read*, before
/// the reader has told any listener. Without this, a registration made right after `munmap`
/// returned -- even on the same thread -- could still find the old region (seen on Soft-RoCE with
/// userfaultfd as the only path: munmap, mmap at the same address, register, stale hit). The
/// reader counts a batch as started before `read` and as finished once it is dispatched; a caller
/// waits only for the batch under way when it looked (not for a steady stream of later ones, which
/// cannot contain its own event). One load when idle; never blocks on a lock. Called by the glue
/// before a registration (`fh_register`, the shim), never by a listener.
#[inline]
pub fn quiesce() {
    let b = BATCHES.load(SeqCst);
    if (b >> 32) as u32 != b as u32 {
        quiesce_slow((b >> 32) as u32);
    }
}

#[cold]
fn quiesce_slow(started: u32) {
    if super::super::guard::in_hook() {
        return; // on the reader thread itself (or inside a hook): waiting would never end
    }
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    while READER_PID.load(SeqCst) == me {
        let finished = BATCHES.load(SeqCst) as u32;
        if finished.wrapping_sub(started) as i32 >= 0 {
            return;
        }
        std::thread::yield_now();
    }
}

/// Entry of the `fh-uffd` thread (see [`ensure_reader`]); `arg` is the fd. A panic in the reader
/// (a listener's) takes the reader's failure path: it keeps reading and dispatching until it can
/// [`retire`], so no unmap waits forever for an event nobody reads.
pub(super) extern "C" fn reader_main(arg: *mut libc::c_void) -> *mut libc::c_void {
    let fd = arg as isize as c_int;
    // SAFETY: naming this thread (at most 15 bytes and the NUL): prctl, no allocation.
    unsafe { libc::pthread_setname_np(libc::pthread_self(), c"fh-uffd".as_ptr()) };
    let mut dying = None;
    loop {
        let run = std::panic::AssertUnwindSafe(|| reader(fd, &mut dying));
        if std::panic::catch_unwind(run).is_ok() {
            break;
        }
        // The batch under way is over: nobody may wait for the rest of it (see `quiesce`).
        let started = (BATCHES.load(SeqCst) >> 32) as u32;
        BATCHES.store(pack(started, started), SeqCst);
        fail(&mut dying, true, libc::EIO);
    }
    std::ptr::null_mut()
}

/// The `fh-uffd` thread: poll, read a batch, notify. Never waits for a lock and never allocates
/// in the loop. `dying`: Some(fd_still_ours) once something failed (see `retire`); kept by the
/// caller across a panic.
fn reader(fd: c_int, dying: &mut Option<bool>) {
    const BATCH: usize = 64;
    let mut msgs = abi::msgs::<BATCH>();
    // Touch the thread-locals the loop uses now (a dlopen'ed library's TLS may be allocated on
    // first use), then declare the thread ready: from here on nothing allocates or locks.
    let _ = super::super::guard::in_hook();
    let _ = errno();
    let delay = test_delay();
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    READER_PID.store(me, SeqCst);
    READER_READY.store(true, SeqCst);
    let mut done: u32 = BATCHES.load(SeqCst) as u32;
    loop {
        if let Some(fd_ours) = *dying {
            if retire(fd, fd_ours, me) {
                break;
            }
            if !fd_ours {
                // The fd number is not ours any more: nothing to read; the context is gone or
                // goes with whoever holds it.
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
        }
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let timeout = if dying.is_some() { 1 } else { -1 };
        // SAFETY: one pollfd on our stack.
        let r = unsafe { libc::poll(&mut pfd, 1, timeout) };
        if r < 0 {
            let e = errno();
            if e != libc::EINTR {
                fail(dying, true, e);
            }
            continue;
        }
        if r == 0 {
            continue;
        }
        if pfd.revents & libc::POLLNVAL != 0 {
            // Someone closed our fd number: it may already name someone else's file.
            fail(dying, false, libc::EBADF);
            continue;
        }
        if pfd.revents & libc::POLLERR != 0 {
            fail(dying, true, libc::EIO);
            continue;
        }
        if FAIL_NEXT_READ.swap(false, SeqCst) {
            fail(dying, true, libc::EIO);
            continue;
        }
        if let Some(d) = delay {
            std::thread::sleep(d); // nanosleep: no allocation, no lock
        }
        // Before `read`: the unmapping thread is released by the read itself (see `quiesce`).
        BATCHES.store(pack(done.wrapping_add(1), done), SeqCst);
        // SAFETY: reading whole messages into our stack array.
        let n = unsafe { libc::read(fd, msgs.as_mut_ptr().cast(), std::mem::size_of_val(&msgs)) };
        let read_errno = if n < 0 { errno() } else { 0 };
        let count = if n > 0 {
            n as usize / std::mem::size_of::<Msg>()
        } else {
            0
        };
        EVENTS.fetch_add(count as u64, SeqCst);
        // Before the batch counts as finished (see `sync_events`).
        for m in &msgs[..count] {
            match abi::words(m) {
                (EVENT_UNMAP, a, b, _) => RING.push(a as usize, b as usize),
                (EVENT_REMAP, a, _, c) => RING.push(a as usize, (a + c) as usize),
                _ => {}
            }
        }
        for m in &msgs[..count] {
            match abi::words(m) {
                // [start, end)
                (EVENT_UNMAP | EVENT_REMOVE, a, b, _) => {
                    notify_guarded(a as usize, (b - a) as usize, UnmapEvent::Late);
                }
                // from, to, len: the pages left `from`.
                (EVENT_REMAP, a, _, c) => {
                    notify_guarded(a as usize, c as usize, UnmapEvent::Late);
                }
                _ => {}
            }
        }
        done = done.wrapping_add(1);
        BATCHES.store(pack(done, done), SeqCst);
        if n < 0 && read_errno != libc::EAGAIN && read_errno != libc::EINTR {
            fail(dying, true, read_errno);
        }
    }
    BATCHES.store(pack(done, done), SeqCst);
    READER_PID.store(0, SeqCst);
}

/// `FH_TEST_UFFD_DELAY_US`: a test switch that makes the reader sleep this long between seeing
/// events and reading them, so that the window in which an unmapped range's event is queued but
/// unread (another thread may already map the hole) is wide enough for a test to land in. Read
/// once, with `getenv` (no allocation), before the reader declares itself ready.
fn test_delay() -> Option<Duration> {
    // SAFETY: a NUL-terminated name; the value is read at once, before anything could change it.
    let v = unsafe { libc::getenv(c"FH_TEST_UFFD_DELAY_US".as_ptr()) };
    if v.is_null() {
        return None;
    }
    // SAFETY: getenv returned a NUL-terminated string.
    let us: u64 = unsafe { std::ffi::CStr::from_ptr(v) }
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (us > 0).then(|| Duration::from_micros(us.min(10_000_000)))
}

/// The reader hit error `e`: from now on it only works towards [`retire`].
fn fail(dying: &mut Option<bool>, fd_ours: bool, e: i32) {
    if dying.is_none() {
        ERRNO.store(e, SeqCst);
    } else {
        std::thread::sleep(Duration::from_millis(1)); // failing again: do not spin
    }
    *dying = Some(dying.unwrap_or(true) && fd_ours);
}

/// The reader cannot go on: turn userfaultfd off for good in this process and leave nothing
/// registered, or the next unmap of a registered range would wait forever for a reader.
///
/// `ACTIVE` goes false first, so no new `watch` gets past its first check. Then, under
/// [`STATE`]'s lock (so no `watch`/`unwatch` is between its check and its ioctl on this fd number),
/// the fd is closed: closing a userfaultfd releases its context, which unregisters every range it
/// had (`userfaultfd_release`) and wakes every thread waiting for its event to be read. The lock
/// is only tried: its holder may be inside malloc, trimming a registered heap and waiting for us
/// to read that event. Returns false if the lock was busy; the reader then keeps reading and
/// dispatching events and tries again. `fd_ours` false: the fd number was closed by someone else
/// and may name another file now: it is forgotten, not closed.
fn retire(fd: c_int, fd_ours: bool, me: libc::pid_t) -> bool {
    ACTIVE.store(false, SeqCst);
    let mut guard = match STATE.try_lock() {
        Ok(g) => g,
        Err(TryLockError::Poisoned(p)) => p.into_inner(),
        Err(TryLockError::WouldBlock) => return false,
    };
    if let Some(st) = guard.as_mut().filter(|st| st.pid == me && st.fd == fd) {
        // The counts stay as they are (nothing looks at them once `fd` is -1): clearing them
        // would call free() here, and a thread holding malloc's lock may be the one waiting for
        // an event (with `fd_ours` false nobody may ever read it).
        st.fd = -1;
    }
    if fd_ours {
        // SAFETY: the number is ours, and nobody uses it any more: `st.fd` is -1 and we hold the
        // lock, so no watch/unwatch is between its check and its ioctl.
        unsafe { libc::close(fd) };
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quiesce_returns_when_idle_and_for_a_foreign_reader() {
        quiesce();
        // A batch marked started by a reader of another process (as a forked child inherits it):
        // no wait.
        let saved = (BATCHES.load(SeqCst), READER_PID.load(SeqCst));
        if saved.1 == 0 {
            BATCHES.store(pack(7, 6), SeqCst);
            READER_PID.store(1, SeqCst);
            quiesce();
            BATCHES.store(saved.0, SeqCst);
            READER_PID.store(saved.1, SeqCst);
        }
    }
}
