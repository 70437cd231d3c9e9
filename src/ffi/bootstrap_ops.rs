//! `fh_bootstrap_ops`: how a host runtime that already bootstrapped (MPI, a PGAS runtime) lends
//! its collectives to firehose instead of PMIx. The Rust side is `net::bootstrap::HostOps`; this
//! file only gives it a C layout and converts.

use std::ffi::{c_int, c_void};

use crate::net::bootstrap::HostOps;

/// Host allgather: every rank sends `len` bytes from `send`; `recv` receives `size * len` bytes in
/// rank order. Returns 0 on success, anything else is a failure (`FH_ERR_BOOTSTRAP`).
pub type fh_allgather_fn = Option<
    unsafe extern "C" fn(
        ctx: *mut c_void,
        send: *const c_void,
        len: usize,
        recv: *mut c_void,
    ) -> c_int,
>;

/// Host barrier: returns 0 once every rank has called it.
pub type fh_barrier_fn = Option<unsafe extern "C" fn(ctx: *mut c_void) -> c_int>;

/// The host's job and collectives. `size` must be > 0, `rank` < `size`, `allgather` non-NULL
/// (otherwise `FH_ERR_BAD_CONFIG`); `barrier` may be NULL (then a barrier is an allgather of one
/// byte). The callbacks are called with `ctx`, one at a time, from the thread that calls into
/// firehose's collective setup, every rank in the same order; each allgather of `n` bytes is two
/// calls (the lengths as 8 bytes, then the data, skipped when `n` is 0), so unequal lengths are
/// detected by every rank before any data moves. They must stay callable until firehose is
/// finalized.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fh_bootstrap_ops {
    pub rank: u32,
    pub size: u32,
    pub ctx: *mut c_void,
    pub allgather: fh_allgather_fn,
    pub barrier: fh_barrier_fn,
}

impl From<fh_bootstrap_ops> for HostOps {
    fn from(o: fh_bootstrap_ops) -> HostOps {
        HostOps {
            rank: o.rank,
            size: o.size,
            ctx: o.ctx,
            allgather: o.allgather,
            barrier: o.barrier,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    /// The struct as `include/firehose.h` declares it (a C compiler reads the checked-in header),
    /// against the Rust layout.
    #[test]
    fn layout_matches_the_checked_in_header() {
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/bootstrap/ops_layout.c");
        let include = format!("-I{}/include", env!("CARGO_MANIFEST_DIR"));
        let got = crate::net::bootstrap::layout_check::compile_and_run(src, &[include])
            .unwrap_or_else(|e| panic!("{e}"));
        let ours = [
            ("sizeof(fh_bootstrap_ops)", size_of::<fh_bootstrap_ops>()),
            ("alignof(fh_bootstrap_ops)", align_of::<fh_bootstrap_ops>()),
            (
                "offsetof(fh_bootstrap_ops,rank)",
                offset_of!(fh_bootstrap_ops, rank),
            ),
            (
                "offsetof(fh_bootstrap_ops,size)",
                offset_of!(fh_bootstrap_ops, size),
            ),
            (
                "offsetof(fh_bootstrap_ops,ctx)",
                offset_of!(fh_bootstrap_ops, ctx),
            ),
            (
                "offsetof(fh_bootstrap_ops,allgather)",
                offset_of!(fh_bootstrap_ops, allgather),
            ),
            (
                "offsetof(fh_bootstrap_ops,barrier)",
                offset_of!(fh_bootstrap_ops, barrier),
            ),
            ("callbacks_assignable", 1),
        ];
        crate::net::bootstrap::layout_check::compare(&ours, &got);
    }
}
