//! Bootstrap: who the peers are and how to swap endpoint addresses with them before any link
//! exists. Three sources, picked by `from_env` unless the host hands one in:
//! PMIx (started by `mpirun`/`srun`: `PMIX_RANK` is set), a host runtime's allgather callback
//! (MPI or a PGAS runtime that already bootstrapped), or a single process.
//!
//! Owns: the job's rank and size, collective exchange before the links are up.
//! May call: libc, the PMIx library (loaded at run time), the host's callbacks. Nothing else.

pub(crate) mod callback;
#[cfg(test)]
pub(crate) mod layout_check;
pub mod local;
pub(crate) mod pmix;
pub(crate) mod select;

pub use callback::{BadOps, CallbackBootstrap, HostOps};
pub use local::Single;
pub use pmix::PmixBootstrap;
pub use select::{choose, Choice};

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

/// The bootstrap for this process, from the environment (rules in `select`): PMIx when a PMIx
/// launcher started it (`PMIX_RANK` set) or `FH_BOOTSTRAP=pmix`, a single process otherwise or
/// with `FH_BOOTSTRAP=single`. When PMIx is chosen but unusable (libpmix not loadable, no
/// server), this is an error, never a silent job of one: N processes each believing they are
/// rank 0 of 1 would fail much later and far more confusingly.
pub fn from_env() -> Result<Box<dyn Bootstrap>, BootstrapError> {
    build(choose(&|k: &str| std::env::var(k).ok())?, &|| {
        Ok(Box::new(PmixBootstrap::new()?))
    })
}

/// Builds `choice`, with the PMIx constructor injected (tests stand in a failing one).
fn build(
    choice: Choice,
    pmix: &dyn Fn() -> Result<Box<dyn Bootstrap>, BootstrapError>,
) -> Result<Box<dyn Bootstrap>, BootstrapError> {
    match choice {
        Choice::Pmix => pmix(),
        Choice::Single => Ok(Box::new(Single)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unusable_pmix_is_an_error_not_a_single_process() {
        let missing = || Err(BootstrapError("PMIx: cannot load libpmix.so.2".into()));
        let e = build(Choice::Pmix, &missing)
            .err()
            .expect("PMIx was chosen");
        assert!(e.0.contains("libpmix"), "{e}");
        let b = build(Choice::Single, &missing).unwrap();
        assert_eq!((b.rank(), b.size()), (0, 1));
    }
}
