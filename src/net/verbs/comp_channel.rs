//! Completion channel (`ibv_comp_channel`): the file descriptor a thread sleeps on until an armed
//! CQ gets a completion. Its fd is made non-blocking so that draining events never blocks and a
//! sleep is always a `poll(2)` with a timeout (a blocking `ibv_get_cq_event` could not time out).
//!
//! Events are acknowledged as soon as they are read: `ibv_destroy_cq` waits until every event of
//! its CQ is acknowledged, so an event left unacknowledged would turn a drop into a hang.
//!
//! Next to the channel's fd a sleeper also watches an eventfd of ours, so another thread can end
//! a sleep at once ([`CompChannel::wake`]: the progress thread's stop). The progress thread can
//! then sleep long when idle instead of waking every few milliseconds to look at its stop flag:
//! an idle rank costs close to no CPU.

use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use rdma_sys::{
    ibv_ack_cq_events, ibv_comp_channel, ibv_cq, ibv_create_comp_channel, ibv_destroy_comp_channel,
    ibv_get_cq_event,
};

use crate::pin::verbs::{Context, VerbsError, VerbsResult};

/// An owned completion channel. CQs created on it hold an `Arc` of it, so it is destroyed after
/// them (`ibv_destroy_comp_channel` fails with EBUSY while a CQ still uses it).
pub struct CompChannel {
    raw: NonNull<ibv_comp_channel>,
    /// Non-blocking eventfd that `wake` makes readable (-1: none could be made; sleeps then
    /// end at their timeout only).
    wake_fd: i32,
    _ctx: Arc<Context>,
}

// SAFETY: the channel is a kernel fd plus an immutable struct; ibv_get_cq_event on a non-blocking
// fd and ibv_ack_cq_events (which locks the CQ) are safe to call from any thread.
unsafe impl Send for CompChannel {}
// SAFETY: as above; no Rust-side mutable state.
unsafe impl Sync for CompChannel {}

impl CompChannel {
    /// Create a channel on `ctx` and make its fd non-blocking.
    pub fn create(ctx: &Arc<Context>) -> VerbsResult<Arc<Self>> {
        // SAFETY: the context is open (we hold an Arc of it).
        let raw = unsafe { ibv_create_comp_channel(ctx.as_raw()) };
        let raw = NonNull::new(raw).ok_or_else(|| VerbsError::last("ibv_create_comp_channel"))?;
        // SAFETY: eventfd takes no pointers; a failure leaves -1 (no wake-ups, see the field).
        let wake_fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        let ch = CompChannel {
            raw,
            wake_fd,
            _ctx: Arc::clone(ctx),
        };
        let fd = ch.fd();
        // SAFETY: `fd` is the channel's open descriptor; F_GETFL/F_SETFL take no pointers.
        let ok = unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
        };
        if !ok {
            return Err(VerbsError::last("fcntl(comp channel, O_NONBLOCK)"));
        }
        Ok(Arc::new(ch))
    }

    pub fn as_raw(&self) -> *mut ibv_comp_channel {
        self.raw.as_ptr()
    }

    /// The channel's file descriptor (readable when an armed CQ produced an event).
    pub fn fd(&self) -> i32 {
        // SAFETY: `raw` is live until drop; `fd` is written once by ibv_create_comp_channel.
        unsafe { (*self.raw.as_ptr()).fd }
    }

    /// Sleep until the fd is readable or `timeout` passed. `Ok(true)` when readable. EINTR counts
    /// as a (spurious) wakeup: callers re-check their CQs anyway.
    /// A [`CompChannel::wake`] also ends the sleep (and is consumed): `Ok(true)` too.
    pub(crate) fn wait_readable(&self, timeout: Duration) -> VerbsResult<bool> {
        let mut pfd = [
            libc::pollfd {
                fd: self.fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.wake_fd, // poll ignores a negative fd
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // Round a sub-millisecond timeout up, so a short wait still sleeps rather than spins.
        let ms = if ms == 0 && !timeout.is_zero() { 1 } else { ms };
        // SAFETY: `pfd` is a valid array of two pollfds for the duration of the call.
        let n = unsafe { libc::poll(pfd.as_mut_ptr(), 2, ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                return Ok(true);
            }
            return Err(VerbsError::last("poll(comp channel)"));
        }
        if pfd[1].revents != 0 {
            let mut v = 0u64;
            // SAFETY: reading 8 bytes into our u64 from our non-blocking eventfd.
            unsafe { libc::read(self.wake_fd, &mut v as *mut u64 as *mut libc::c_void, 8) };
        }
        Ok(n > 0)
    }

    /// Ends a current or the next `CompChannel::wait_readable` at once. Any thread; no lock.
    pub fn wake(&self) {
        if self.wake_fd >= 0 {
            let one = 1u64;
            // SAFETY: writing 8 bytes from our u64 to our eventfd (non-blocking: a counter at
            // its maximum fails with EAGAIN, and a wake-up is pending then anyway).
            unsafe { libc::write(self.wake_fd, &one as *const u64 as *const libc::c_void, 8) };
        }
    }

    /// Read and acknowledge every pending event; returns how many there were. Never blocks.
    pub(crate) fn drain_events(&self) -> VerbsResult<usize> {
        let mut n = 0;
        loop {
            let mut cq: *mut ibv_cq = std::ptr::null_mut();
            let mut cq_ctx: *mut libc::c_void = std::ptr::null_mut();
            // SAFETY: the channel is live; both out-pointers are valid. The fd is non-blocking,
            // so with no event pending this returns -1 (EAGAIN) instead of sleeping.
            let ret = unsafe { ibv_get_cq_event(self.as_raw(), &mut cq, &mut cq_ctx) };
            if ret != 0 {
                let e = std::io::Error::last_os_error().raw_os_error();
                if e == Some(libc::EAGAIN) || e == Some(libc::EWOULDBLOCK) {
                    return Ok(n);
                }
                return Err(VerbsError::last("ibv_get_cq_event"));
            }
            // SAFETY: `cq` is a CQ created on this channel. It is still alive: ibv_destroy_cq
            // waits until every event the kernel delivered for the CQ has been acknowledged, and
            // this is the acknowledgement.
            unsafe { ibv_ack_cq_events(cq, 1) };
            n += 1;
        }
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // SAFETY: every CQ on this channel holds an Arc of it, so none is alive; destroyed once.
        unsafe { ibv_destroy_comp_channel(self.raw.as_ptr()) };
        if self.wake_fd >= 0 {
            // SAFETY: our own eventfd, closed once.
            unsafe { libc::close(self.wake_fd) };
        }
    }
}
