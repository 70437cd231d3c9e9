//! Puts and gets: `fh_put`, `fh_get`, their non-blocking forms, `fh_wait`, `fh_test`,
//! `fh_quiet`, `fh_get_rma_stats`. Thin: everything happens in `rma::Rma`.

use crate::rt::inside::Inside;
use std::ffi::c_void;

use crate::ffi::status::fh_status;
use crate::net::RdmaKind;

use super::ctx::{fh_ctx, here};
use super::guard::{ffi_guard, status_of};
use super::handle::{borrow, write_out};

/// A non-blocking put or get in flight. 0 is never a valid operation.
pub type fh_op = u64;

/// Counters of a context's puts and gets since `fh_init` (Firehose's own, and the driver's).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct fh_rma_stats {
    pub puts: u64,
    pub gets: u64,
    /// Operations on the own rank's memory (copied locally, no network).
    pub self_ops: u64,
    /// Operations (or pieces of them) whose target memory this rank already held pinned: one
    /// RDMA, no message.
    pub one_sided_hits: u64,
    /// Operations that needed a move (a message to the target) first.
    pub misses: u64,
    /// Misses that joined a move already in flight for the same memory.
    pub hit_pending: u64,
    /// Move requests sent.
    pub moves: u64,
    /// Small puts that travelled inside their move (no RDMA at all).
    pub puts_in_move: u64,
    /// As a target: regions pinned for peers, and unpinned.
    pub pins: u64,
    pub unpins: u64,
    /// As a target: pins served from memory still pinned (the victim FIFO).
    pub victim_hits: u64,
    /// As a target: revocations sent because memory peers held was unmapped.
    pub revokes: u64,
    /// As a target: bytes pinned for peers now, and the most so far.
    pub pinned_bytes: u64,
    pub pinned_peak: u64,
    /// Operations that failed (remote fault, lost peer, ...).
    pub failures: u64,
    /// Firehose messages from peers dropped as malformed or out of protocol.
    pub rejected: u64,
    /// RDMA operations posted.
    pub rdma_posted: u64,
    /// Remote invalidation (as a target; all 0 with `FH_REMOTE_INVALIDATION=0` or one rank):
    /// revocations started for unmapped ranges (or sweeps), and finished (every holder acked,
    /// the memory unpinned).
    pub revoke_started: u64,
    pub revoke_completed: u64,
    /// Unmapping threads that waited for a revocation, and those that stopped waiting after
    /// `FH_REVOKE_TIMEOUT` (the revocation then finishes in the background).
    pub revoke_waits: u64,
    pub revoke_timeouts: u64,
    /// Unmaps queued with nobody waiting (the library's own threads, userfaultfd events,
    /// `fh_notify_unmapped`).
    pub revoke_detached: u64,
    /// Unmaps that touched no memory pinned for peers (the hook returned at once).
    pub revoke_fast_returns: u64,
    /// Time unmapping threads spent waiting for revocations: in total, and the longest wait (ns).
    pub revoke_wait_ns: u64,
    pub revoke_wait_ns_max: u64,
    /// Small puts whose move carried no pins: this rank's firehoses on that peer were being
    /// evicted unused, so pinning would not have paid (`FH_SMALL_PUT_PINS=auto`).
    pub puts_in_move_unpinned: u64,
    /// Unmapping threads in libc's heap trimming (from `free`, `malloc_trim`) that stopped waiting
    /// for their revocation because the `fh-revoke` thread showed no progress for
    /// `FH_REVOKE_STALL` (it was most likely blocked on the malloc arena that call holds; the
    /// revocation then finishes in the background, as after a timeout).
    pub revoke_stalls: u64,
    /// As a target: moves refused (pins that fit no bucket, region or quota here), each
    /// answered with an error.
    pub moves_refused: u64,
    /// `QUOTA_SET`s (adaptive lending) from targets refused: ones an honest target would not send.
    pub bad_quota_sets: u64,
    /// Revocations ended by giving up on holders that had not acked within `FH_AM_TIMEOUT_MS`,
    /// and how many holders that was (each declared lost: also in `fh_net_stats.peers_given_up`).
    pub revoke_written_off: u64,
    pub revoke_holders_given_up: u64,
    /// Memory windows (`FH_MW`): 1 when this rank's grants are windows bound for one peer each,
    /// else 0; windows bound (one per region granted to a peer) and deallocated (the peer let go
    /// of the region: its key died then); grants refused because no window could be bound.
    pub windows_on: u64,
    pub windows_bound: u64,
    pub windows_dropped: u64,
    pub windows_failed: u64,
    /// Gets of at most 256 bytes that read into one of the library's registered bounce slots
    /// (copied to the destination when they complete; no registration of the destination), and
    /// those that found all 64 slots in use (their destination was registered instead).
    pub gets_bounced: u64,
    pub gets_bounce_full: u64,
}

impl From<&crate::rma::RmaStats> for fh_rma_stats {
    fn from(s: &crate::rma::RmaStats) -> Self {
        fh_rma_stats {
            puts: s.puts,
            gets: s.gets,
            self_ops: s.self_ops,
            one_sided_hits: s.fh.hits,
            misses: s.fh.misses,
            hit_pending: s.fh.hit_pending,
            moves: s.fh.moves_sent,
            puts_in_move: s.fh.puts_in_move,
            pins: s.fh.pins,
            unpins: s.fh.unpins,
            victim_hits: s.fh.victim_hits,
            revokes: s.fh.revokes,
            pinned_bytes: s.fh.pinned_bytes,
            pinned_peak: s.fh.pinned_peak,
            failures: s.fh.failures,
            rejected: s.rejected,
            rdma_posted: s.rdma_posted,
            revoke_started: s.revoke.started,
            revoke_completed: s.revoke.completed,
            revoke_waits: s.revoke.waits,
            revoke_timeouts: s.revoke.timeouts,
            revoke_detached: s.revoke.detached,
            revoke_fast_returns: s.revoke.fast_returns,
            revoke_wait_ns: s.revoke.wait_ns,
            revoke_wait_ns_max: s.revoke.wait_ns_max,
            puts_in_move_unpinned: s.fh.puts_in_move_unpinned,
            revoke_stalls: s.revoke.stalls,
            moves_refused: s.fh.moves_refused,
            bad_quota_sets: s.fh.bad_quota_sets,
            revoke_written_off: s.revoke.written_off,
            revoke_holders_given_up: s.revoke.holders_given_up,
            windows_on: u64::from(s.windows.on),
            windows_bound: s.windows.bound,
            windows_dropped: s.windows.dropped,
            windows_failed: s.windows.failed,
            gets_bounced: s.gets_bounced,
            gets_bounce_full: s.gets_bounce_full,
        }
    }
}

/// Starts one operation; `out` NULL makes it implicit (collected by `fh_quiet`). `inside`: the
/// export's guard (`ffi_guard!`).
///
/// # Safety
/// `ctx` NULL or live; `local` valid for `len` bytes and untouched until the op completes.
#[allow(clippy::too_many_arguments)]
unsafe fn start(
    inside: &Inside,
    ctx: *mut fh_ctx,
    kind: RdmaKind,
    rank: u32,
    raddr: u64,
    local: *mut u8,
    len: usize,
    out: *mut fh_op,
) -> fh_status {
    // SAFETY: per the contract.
    let c = match unsafe { here(ctx) } {
        Ok(c) => c,
        Err(e) => return e,
    };
    // SAFETY: forwarded contract on `local`.
    match unsafe {
        c.rma
            .start_in(inside, kind, rank, raddr, local, len, out.is_null())
    } {
        Ok(op) => {
            if !out.is_null() {
                // SAFETY: non-NULL, writable per the contract.
                unsafe { write_out(out, op) };
            }
            fh_status::FH_OK
        }
        Err(e) => e.into(),
    }
}

/// Copies `len` bytes from `src` to `remote_addr` in the process of `rank` and returns when
/// they are there. Any address of the target is valid (stack, heap, mmap; never registered by
/// anyone); the local buffer is registered through the context's pin-down cache, except a put
/// no longer than the device's inline size (256 bytes on rxe), which is copied when posted and
/// needs no registration. Errors: `FH_ERR_NULL`, `FH_ERR_ZERO_LENGTH`, `FH_ERR_OVERFLOW`,
/// `FH_ERR_BAD_RANK` (these write nothing), `FH_ERR_REMOTE_FAULT` (the target range is not
/// mapped there, or not writable for a put), `FH_ERR_REMOTE_DENIED` (the target does not expose
/// it for this access: `FH_EXPOSE`, `fh_expose`; or it is the library's own memory),
/// `FH_ERR_PIN_FAILED` (a longer `src` cannot be registered), `FH_ERR_PEER_LOST`
/// (also when the device refused to post part of the transfer), `FH_ERR_FINALIZED`. A put moves
/// in pieces (one RDMA per remote region it spans): after a failure the pieces that ran stay
/// written, so the target range may hold part of the data.
/// A put to the own rank is a local copy (with the same checks).
///
/// # Safety
/// `ctx` is NULL or live; `src` is readable for `len` bytes during the call.
#[no_mangle]
pub unsafe extern "C" fn fh_put(
    ctx: *mut fh_ctx,
    rank: u32,
    remote_addr: u64,
    src: *const c_void,
    len: usize,
) -> fh_status {
    ffi_guard!(inside => {
        let mut op: fh_op = 0;
        // SAFETY: forwarded contract; `src` is only read by a put.
        let s = unsafe { start(inside, ctx, RdmaKind::Write, rank, remote_addr, src.cast_mut().cast(), len, &mut op) };
        if s != fh_status::FH_OK {
            return s;
        }
        // SAFETY: `start` succeeded, so `ctx` is live.
        status_of(unsafe { borrow(ctx) }.expect("checked").rma.wait_in(inside, op))
    })
}

/// Copies `len` bytes from `remote_addr` in the process of `rank` into `dst` and returns when
/// they are there. Errors as `fh_put`; on error `dst` may hold part of the data. A get of at
/// most 256 bytes reads into one of the library's registered bounce slots and is copied into
/// `dst` when it succeeded (`dst` needs no registration; on error it is left as it was;
/// `dst` must be writable, as for `memcpy`: it is touched at the call).
///
/// # Safety
/// `ctx` is NULL or live; `dst` is writable for `len` bytes during the call.
#[no_mangle]
pub unsafe extern "C" fn fh_get(
    ctx: *mut fh_ctx,
    dst: *mut c_void,
    rank: u32,
    remote_addr: u64,
    len: usize,
) -> fh_status {
    ffi_guard!(inside => {
        let mut op: fh_op = 0;
        // SAFETY: forwarded contract.
        let s = unsafe { start(inside, ctx, RdmaKind::Read, rank, remote_addr, dst.cast(), len, &mut op) };
        if s != fh_status::FH_OK {
            return s;
        }
        // SAFETY: `start` succeeded, so `ctx` is live.
        status_of(unsafe { borrow(ctx) }.expect("checked").rma.wait_in(inside, op))
    })
}

/// Starts a put and returns at once. With `out` non-NULL, `*out` gets a handle to pass to
/// `fh_wait`/`fh_test` exactly once; with `out` NULL the put is implicit and `fh_quiet` waits
/// for it (and reports its error). Argument errors are returned here, and then no operation
/// exists; errors that happen later come from `fh_wait`/`fh_test`/`fh_quiet`.
///
/// # Safety
/// `ctx` is NULL or live; `src` stays readable and unmodified until the put completes; `out` is
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn fh_put_nb(
    ctx: *mut fh_ctx,
    rank: u32,
    remote_addr: u64,
    src: *const c_void,
    len: usize,
    out: *mut fh_op,
) -> fh_status {
    ffi_guard!(inside => {
        // SAFETY: forwarded contract.
        unsafe { start(inside, ctx, RdmaKind::Write, rank, remote_addr, src.cast_mut().cast(), len, out) }
    })
}

/// Starts a get and returns at once (see `fh_put_nb`).
///
/// # Safety
/// `ctx` is NULL or live; `dst` stays writable and untouched until the get completes; `out` is
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn fh_get_nb(
    ctx: *mut fh_ctx,
    dst: *mut c_void,
    rank: u32,
    remote_addr: u64,
    len: usize,
    out: *mut fh_op,
) -> fh_status {
    ffi_guard!(inside => {
        // SAFETY: forwarded contract.
        unsafe { start(inside, ctx, RdmaKind::Read, rank, remote_addr, dst.cast(), len, out) }
    })
}

/// Waits until `op` completes and returns its result; the handle is then spent (a second
/// `fh_wait` is `FH_ERR_UNKNOWN_HANDLE`, as is 0 or a made-up value).
/// Bounded, as `fh_put`, `fh_get` and `fh_quiet`: `FH_ERR_TIMEOUT` once `FH_AM_TIMEOUT_MS` has
/// passed with the peer silent (it is then given up on: later operations to it are
/// `FH_ERR_PEER_LOST`), `FH_ERR_PEER_LOST` at once after the peer's `fh_finalize`.
///
/// # Safety
/// `ctx` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn fh_wait(ctx: *mut fh_ctx, op: fh_op) -> fh_status {
    ffi_guard!(inside => {
        // SAFETY: per the contract.
        match unsafe { here(ctx) } {
            Err(e) => e,
            Ok(c) => status_of(c.rma.wait_in(inside, op)),
        }
    })
}

/// Progresses once; `*done` = 1 and the op's result returned if it completed (the handle is
/// then spent), else `*done` = 0 and `FH_OK`.
///
/// # Safety
/// `ctx` is NULL or live; `done` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn fh_test(ctx: *mut fh_ctx, op: fh_op, done: *mut i32) -> fh_status {
    ffi_guard! {{
        // SAFETY: per the contract.
        let c = match unsafe { here(ctx) } {
            Ok(c) => c,
            Err(e) => return e,
        };
        if done.is_null() {
            return fh_status::FH_ERR_NULL;
        }
        match c.rma.test(op) {
            Err(e) => e.into(),
            Ok(r) => {
                // SAFETY: non-NULL, writable per the contract.
                unsafe { write_out(done, i32::from(r.is_some())) };
                status_of(r.unwrap_or(Ok(())))
            }
        }
    }}
}

/// Waits until every put and get this context started has completed. Returns the first error
/// of an implicit (handle-less) operation since the last `fh_quiet`, else `FH_OK`; explicit
/// handles keep their results for `fh_wait`/`fh_test`.
///
/// # Safety
/// `ctx` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn fh_quiet(ctx: *mut fh_ctx) -> fh_status {
    ffi_guard! {{
        // SAFETY: per the contract.
        match unsafe { here(ctx) } {
            Err(e) => e,
            Ok(c) => status_of(c.rma.quiet()),
        }
    }}
}

/// Copies the context's put/get counters into `*out` (written only on success).
///
/// # Safety
/// `ctx` is NULL or live; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn fh_get_rma_stats(ctx: *const fh_ctx, out: *mut fh_rma_stats) -> fh_status {
    ffi_guard! {{
        // SAFETY: per the contract.
        let c = match unsafe { here(ctx) } {
            Ok(c) => c,
            Err(e) => return e,
        };
        if out.is_null() {
            return fh_status::FH_ERR_NULL;
        }
        let v = fh_rma_stats::from(&c.rma.stats());
        // SAFETY: non-NULL checked; writable per the contract.
        unsafe { write_out(out, v) };
        fh_status::FH_OK
    }}
}

#[cfg(test)]
mod tests {
    use super::fh_rma_stats;
    use crate::rma::revoke::RevokeStats;
    use crate::rma::RmaStats;

    /// The counters added for hostile peers reach C, each from its own source.
    #[test]
    fn bound_counters_reach_c() {
        let mut s = RmaStats::default();
        s.fh.moves_refused = 3;
        s.fh.bad_quota_sets = 4;
        s.revoke = RevokeStats {
            written_off: 5,
            holders_given_up: 6,
            stalls: 7,
            ..RevokeStats::default()
        };
        let c = fh_rma_stats::from(&s);
        assert_eq!(
            (
                c.moves_refused,
                c.bad_quota_sets,
                c.revoke_written_off,
                c.revoke_holders_given_up,
                c.revoke_stalls
            ),
            (3, 4, 5, 6, 7)
        );
    }
}
