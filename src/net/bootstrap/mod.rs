//! Bootstrap: who the peers are and how to swap endpoint addresses with them before any link
//! exists. Three sources, picked by `from_env` unless the host hands one in:
//! PMIx (started by `mpirun`/`srun`: `PMIX_RANK` is set), a host runtime's allgather callback
//! (MPI or a PGAS runtime that already bootstrapped), or a single process.
//!
//! Owns: the job's rank and size, collective exchange before the links are up.
//! May call: libc, the PMIx library (loaded at run time), the host's callbacks. Nothing else.

pub mod local;

use super::Rank;
use std::fmt;

/// Why a bootstrap operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootstrapError(pub String);

impl fmt::Display for BootstrapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bootstrap: {}", self.0)
    }
}

impl std::error::Error for BootstrapError {}

/// Collective operations among the ranks of a job, used only while setting up (endpoint exchange)
/// and for `fh_barrier`. Every rank calls the same collectives in the same order.
pub trait Bootstrap: Send {
    /// This process's rank, `0..size`.
    fn rank(&self) -> Rank;
    /// Number of ranks in the job.
    fn size(&self) -> u32;
    /// Every rank contributes `mine` (the same length on every rank); returns all contributions
    /// concatenated in rank order (`size * mine.len()` bytes).
    fn allgather(&mut self, mine: &[u8]) -> Result<Vec<u8>, BootstrapError>;
    /// Returns once every rank has entered the barrier.
    fn barrier(&mut self) -> Result<(), BootstrapError>;
}
