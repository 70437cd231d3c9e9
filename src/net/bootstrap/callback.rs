//! Bootstrap through a host runtime that already bootstrapped (MPI, a PGAS runtime): it hands
//! its rank, size and an allgather (and optionally a barrier) as C function pointers, and every
//! collective here is made of calls to them. The C struct is `fh_bootstrap_ops` (`src/ffi`).
//!
//! The host's allgather has one length for everyone (like `MPI_Allgather` with a fixed count), so
//! unequal contributions cannot go through it safely (the host would truncate, overrun or hang).
//! Each allgather is therefore two host calls: the 8-byte lengths first, checked by every rank
//! (all see the same lengths, so all fail together and nobody waits for a partner that left),
//! then the data.

use super::{Bootstrap, BootstrapError};
use crate::net::Rank;
use std::ffi::{c_int, c_void};
use std::fmt;

/// `allgather(ctx, send, len, recv)`: every rank sends `len` bytes from `send`; `recv` receives
/// `size * len` bytes, rank 0's first. Returns 0 on success.
pub(crate) type AllgatherFn = unsafe extern "C" fn(
    ctx: *mut c_void,
    send: *const c_void,
    len: usize,
    recv: *mut c_void,
) -> c_int;
/// `barrier(ctx)`: returns once every rank has called it; 0 on success.
pub(crate) type BarrierFn = unsafe extern "C" fn(ctx: *mut c_void) -> c_int;

/// What the host hands in (the Rust side of `fh_bootstrap_ops`).
#[derive(Debug, Clone, Copy)]
pub struct HostOps {
    pub rank: u32,
    pub size: u32,
    /// Passed back to every callback; never dereferenced here.
    pub ctx: *mut c_void,
    /// Required.
    pub allgather: Option<AllgatherFn>,
    /// Optional: without it a barrier is an allgather of one byte.
    pub barrier: Option<BarrierFn>,
}

/// `HostOps` that cannot describe a job. Each is `FH_ERR_BAD_CONFIG` at the C API (mapped in
/// `ffi`): the struct is configuration, so a NULL `allgather` in it is a bad setting, not a NULL argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadOps {
    ZeroSize,
    RankOutOfRange { rank: u32, size: u32 },
    NoAllgather,
}

impl fmt::Display for BadOps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BadOps::ZeroSize => write!(f, "bootstrap ops: size is 0"),
            BadOps::RankOutOfRange { rank, size } => {
                write!(f, "bootstrap ops: rank {rank} is not below size {size}")
            }
            BadOps::NoAllgather => write!(f, "bootstrap ops: allgather is NULL"),
        }
    }
}

impl std::error::Error for BadOps {}

/// One rank of a job whose collectives are the host's callbacks.
#[derive(Debug)]
pub struct CallbackBootstrap {
    rank: u32,
    size: u32,
    ctx: *mut c_void,
    allgather: AllgatherFn,
    barrier: Option<BarrierFn>,
}

// SAFETY: `ctx` is only ever passed back to the host's callbacks, and only from the thread that
// currently owns this value (collectives take `&mut self`); `new`'s contract makes the host
// accept calls from whichever thread that is.
unsafe impl Send for CallbackBootstrap {}

impl CallbackBootstrap {
    /// Checks `ops` (size > 0, rank < size, allgather present).
    ///
    /// # Safety
    /// Until this value is dropped, `allgather` (and `barrier` if given) must be safe to call with
    /// `ctx` and buffers of the documented sizes, from the thread that owns this value at the time
    /// (one call at a time), and every rank must run the same collectives in the same order.
    pub unsafe fn new(ops: HostOps) -> Result<CallbackBootstrap, BadOps> {
        if ops.size == 0 {
            return Err(BadOps::ZeroSize);
        }
        if ops.rank >= ops.size {
            return Err(BadOps::RankOutOfRange {
                rank: ops.rank,
                size: ops.size,
            });
        }
        let allgather = ops.allgather.ok_or(BadOps::NoAllgather)?;
        Ok(CallbackBootstrap {
            rank: ops.rank,
            size: ops.size,
            ctx: ops.ctx,
            allgather,
            barrier: ops.barrier,
        })
    }

    /// One host allgather of `send` (the same length on every rank, already checked).
    fn host_allgather(&mut self, send: &[u8]) -> Result<Vec<u8>, BootstrapError> {
        let total = send.len().checked_mul(self.size as usize).ok_or_else(|| {
            BootstrapError(format!(
                "allgather: {} bytes x {} ranks overflows",
                send.len(),
                self.size
            ))
        })?;
        let mut recv = vec![0u8; total];
        // SAFETY: `send` is readable for `len` bytes and `recv` writable for `size * len`, both
        // live across the call; the callback's validity is `new`'s contract.
        let rc = unsafe {
            (self.allgather)(
                self.ctx,
                send.as_ptr().cast(),
                send.len(),
                recv.as_mut_ptr().cast(),
            )
        };
        if rc != 0 {
            return Err(BootstrapError(format!(
                "the host's allgather callback returned {rc}"
            )));
        }
        Ok(recv)
    }
}

impl Bootstrap for CallbackBootstrap {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn size(&self) -> u32 {
        self.size
    }

    fn allgather(&mut self, mine: &[u8]) -> Result<Vec<u8>, BootstrapError> {
        let lens: Vec<u64> = self
            .host_allgather(&(mine.len() as u64).to_le_bytes())?
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8-byte chunk")))
            .collect();
        if lens.iter().any(|&n| n != mine.len() as u64) {
            // The same message on every rank: they all saw the same lengths.
            return Err(BootstrapError(format!(
                "allgather: unequal lengths, bytes by rank: {lens:?}"
            )));
        }
        if mine.is_empty() {
            // Every rank saw the same zero lengths: nothing to exchange, no second call anywhere.
            return Ok(Vec::new());
        }
        self.host_allgather(mine)
    }

    fn barrier(&mut self) -> Result<(), BootstrapError> {
        match self.barrier {
            Some(barrier) => {
                // SAFETY: the callback's validity with `ctx` is `new`'s contract.
                let rc = unsafe { barrier(self.ctx) };
                if rc != 0 {
                    return Err(BootstrapError(format!(
                        "the host's barrier callback returned {rc}"
                    )));
                }
                Ok(())
            }
            None => self.host_allgather(&[0]).map(drop),
        }
    }
}

#[cfg(test)]
mod tests;
