//! Bootstrap over PMIx, for processes started by a PMIx launcher (`mpirun` of Open MPI 4/5, `srun`,
//! `prterun`): the launcher's PMIx server already knows the job, so rank, size and the exchange
//! come from it. libpmix is loaded at run time (`dl`), with hand-written, header-checked types
//! (`abi`).
//!
//! - rank: from `PMIx_Init`; size: `PMIX_JOB_SIZE` of the job (`PMIx_Get` on the wildcard rank);
//! - allgather: every rank `PMIx_Put`s its blob under `fh.ag.<n>` (n = this process's collective
//!   count, the same on every rank because all ranks call the collectives in the same order),
//!   `PMIx_Commit`, `PMIx_Fence` with `PMIX_COLLECT_DATA`, then `PMIx_Get` of each rank's blob;
//! - barrier: `PMIx_Fence` without data;
//! - `PMIx_Finalize` on drop (PMIx counts inits, so an MPI library in the same process keeps its
//!   connection).

mod abi;
mod dl;

use super::{Bootstrap, BootstrapError};
use crate::net::Rank;
use abi::{Info, Proc, Value, ValueData, PMIX_SUCCESS};
use dl::PmixFns;
use std::ffi::{c_char, CString};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

/// Collectives issued by this process through PMIx, over all `PmixBootstrap`s: the sequence
/// number in the key, so no two allgathers ever reuse a key (PMIx keeps every put value).
static SEQUENCE: AtomicU64 = AtomicU64::new(0);
/// One collective at a time per process: a put/commit/fence/get group must not interleave with
/// another instance's fence, or ranks would pair up different fences.
static COLLECTIVE: Mutex<()> = Mutex::new(());
/// The process whose `PMIx_Init` succeeded here (0: none). A forked child inherits libpmix's
/// state: its `PMIx_Init` returns the parent's identity at once, and its first collective hands
/// work to the parent's progress thread, which the child does not have, and hangs (or talks on
/// the parent's connection to the server). So a child is refused before it calls libpmix.
static INIT_BY: AtomicU32 = AtomicU32::new(0);

/// Why `pid` cannot bootstrap through PMIx when `init_by` initialized it, if it cannot.
fn forked_from_initialized(init_by: u32, pid: u32) -> Option<BootstrapError> {
    (init_by != 0 && init_by != pid).then(|| {
        BootstrapError(format!(
            "PMIx: this process was forked from process {init_by}, which had initialized PMIx; \
             the connection to the PMIx server is that process's, so a forked child cannot \
             bootstrap through it"
        ))
    })
}

/// This process as one rank of a PMIx job.
pub struct PmixBootstrap {
    fns: &'static PmixFns,
    me: Proc,
    size: u32,
}

impl std::fmt::Debug for PmixBootstrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PmixBootstrap")
            .field("rank", &self.me.rank)
            .field("size", &self.size)
            .finish()
    }
}

impl PmixBootstrap {
    /// Loads libpmix (once per process), connects to the launcher's PMIx server and reads the
    /// job size. Fails (never falls back to a single process) if the library is missing, if
    /// there is no server (`PMIx_Init` error) or the job size is unknown.
    pub fn new() -> Result<PmixBootstrap, BootstrapError> {
        let pid = std::process::id();
        if let Some(e) = forked_from_initialized(INIT_BY.load(Ordering::SeqCst), pid) {
            return Err(e);
        }
        let fns = dl::pmix().map_err(|e| BootstrapError(format!("PMIx: {e}")))?;
        let mut me = Proc::zeroed();
        // SAFETY: `me` is a valid pmix_proc_t to fill; no info array (NULL, 0).
        let rc = unsafe { (fns.init)(&mut me, std::ptr::null_mut(), 0) };
        check(fns, rc, "PMIx_Init")?;
        INIT_BY.store(pid, Ordering::SeqCst);
        // From here on, a failure must still finalize: build the value first.
        let mut b = PmixBootstrap { fns, me, size: 0 };
        b.size = b.job_size()?;
        if b.me.rank >= b.size {
            return Err(BootstrapError(format!(
                "PMIx: rank {} outside a job of {}",
                b.me.rank, b.size
            )));
        }
        Ok(b)
    }

    fn job_size(&self) -> Result<u32, BootstrapError> {
        let job = Proc {
            rank: abi::PMIX_RANK_WILDCARD,
            ..self.me
        };
        let v = self.get(&job, abi::KEY_JOB_SIZE.as_ptr(), "PMIX_JOB_SIZE")?;
        match v.type_ {
            // SAFETY: the type tag says the union holds a uint32.
            abi::PMIX_UINT32 => Ok(unsafe { v.data.uint32 }),
            t => Err(BootstrapError(format!(
                "PMIx: PMIX_JOB_SIZE has data type {t}, expected uint32"
            ))),
        }
        .and_then(|n| match n {
            0 => Err(BootstrapError("PMIx: PMIX_JOB_SIZE is 0".into())),
            n => Ok(n),
        })
    }

    /// `PMIx_Get` of `key` for `who`, copied out: byte objects are copied into `ValueOut::bytes`,
    /// and the library's value is released before returning.
    fn get(&self, who: &Proc, key: *const c_char, what: &str) -> Result<ValueOut, BootstrapError> {
        let mut v: *mut Value = std::ptr::null_mut();
        // SAFETY: `who` is a valid proc, `key` a NUL-terminated string that outlives the call,
        // no info array; `v` receives a value allocated by PMIx.
        let rc = unsafe { (self.fns.get)(who, key, std::ptr::null(), 0, &mut v) };
        check(
            self.fns,
            rc,
            &format!("PMIx_Get({what}, rank {})", who.rank),
        )?;
        if v.is_null() {
            return Err(BootstrapError(format!("PMIx_Get({what}) gave no value")));
        }
        // SAFETY: PMIx_Get succeeded: `v` points to an initialized pmix_value_t we own.
        let val = unsafe { *v };
        let bytes = if val.type_ == abi::PMIX_BYTE_OBJECT {
            // SAFETY: the tag says `bo`; PMIx owns `size` bytes at `bytes`.
            let bo = unsafe { val.data.bo };
            match (bo.size, bo.bytes.is_null()) {
                (0, _) => Ok(Vec::new()),
                (n, true) => Err(BootstrapError(format!(
                    "PMIx_Get({what}, rank {}): {n} bytes at NULL",
                    who.rank
                ))),
                // SAFETY: see above; copied before the value is destructed below.
                (n, false) => {
                    Ok(unsafe { std::slice::from_raw_parts(bo.bytes as *const u8, n) }.to_vec())
                }
            }
        } else {
            Ok(Vec::new())
        };
        // SAFETY: `v` came from PMIx_Get; release it as PMIX_VALUE_RELEASE does: destruct the
        // contents with the library, then free the struct (PMIx allocates it with malloc).
        unsafe {
            (self.fns.value_destruct)(v);
            libc::free(v.cast());
        }
        let bytes = bytes?;
        Ok(ValueOut {
            type_: val.type_,
            data: val.data,
            bytes,
        })
    }

    fn fence(&self, collect: bool) -> Result<(), BootstrapError> {
        let job = Proc {
            rank: abi::PMIX_RANK_WILDCARD,
            ..self.me
        };
        let info = [Info::flag(abi::KEY_COLLECT_DATA, true)];
        let (ip, n) = if collect {
            (info.as_ptr(), 1)
        } else {
            (std::ptr::null(), 0)
        };
        // SAFETY: one valid proc (every rank of our namespace); `info` lives across the call.
        let rc = unsafe { (self.fns.fence)(&job, 1, ip, n) };
        check(self.fns, rc, "PMIx_Fence")
    }
}

/// A value copied out of PMIx (the union is only read for scalar types).
struct ValueOut {
    type_: u16,
    data: ValueData,
    bytes: Vec<u8>,
}

fn check(fns: &PmixFns, rc: abi::Status, call: &str) -> Result<(), BootstrapError> {
    if rc == PMIX_SUCCESS {
        Ok(())
    } else {
        Err(BootstrapError(format!("{call}: {}", fns.describe(rc))))
    }
}

impl Bootstrap for PmixBootstrap {
    fn rank(&self) -> Rank {
        self.me.rank
    }

    fn size(&self) -> u32 {
        self.size
    }

    fn allgather(&mut self, mine: &[u8]) -> Result<Vec<u8>, BootstrapError> {
        let _one = COLLECTIVE.lock().unwrap_or_else(|p| p.into_inner());
        let seq = SEQUENCE.fetch_add(1, Ordering::Relaxed);
        let key = CString::new(format!("fh.ag.{seq}")).expect("no NUL in the key");
        let mut value = Value {
            type_: abi::PMIX_BYTE_OBJECT,
            data: ValueData {
                bo: abi::ByteObject {
                    bytes: mine.as_ptr() as *mut c_char,
                    size: mine.len(),
                },
            },
        };
        // SAFETY: `key` is NUL-terminated; `value` describes `mine`, which outlives the call;
        // PMIx_Put copies the value (it only reads through the non-const pointer).
        let rc = unsafe { (self.fns.put)(abi::PMIX_GLOBAL, key.as_ptr(), &mut value) };
        check(self.fns, rc, "PMIx_Put")?;
        // SAFETY: no arguments; pushes this process's puts to its local server.
        let rc = unsafe { (self.fns.commit)() };
        check(self.fns, rc, "PMIx_Commit")?;
        self.fence(true)?;

        let mut all = Vec::with_capacity(mine.len() * self.size as usize);
        for rank in 0..self.size {
            let who = Proc { rank, ..self.me };
            let v = self.get(&who, key.as_ptr(), &format!("fh.ag.{seq}"))?;
            if v.type_ != abi::PMIX_BYTE_OBJECT {
                return Err(BootstrapError(format!(
                    "allgather: rank {rank}'s value has data type {}, expected a byte object",
                    v.type_
                )));
            }
            if v.bytes.len() != mine.len() {
                return Err(BootstrapError(format!(
                    "allgather: rank {rank} gave {} bytes, rank {} gave {}",
                    v.bytes.len(),
                    self.me.rank,
                    mine.len()
                )));
            }
            all.extend_from_slice(&v.bytes);
        }
        Ok(all)
    }

    fn barrier(&mut self) -> Result<(), BootstrapError> {
        let _one = COLLECTIVE.lock().unwrap_or_else(|p| p.into_inner());
        self.fence(false)
    }
}

impl Drop for PmixBootstrap {
    fn drop(&mut self) {
        // SAFETY: balances the successful PMIx_Init of `new` (PMIx counts inits); no info array.
        let rc = unsafe { (self.fns.finalize)(std::ptr::null(), 0) };
        if rc != PMIX_SUCCESS {
            // Nothing to return to from drop; the job is ending anyway.
            crate::fh_warn!("firehose: PMIx_Finalize: {}", self.fns.describe(rc));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::forked_from_initialized;

    #[test]
    fn a_child_of_an_initialized_process_is_refused() {
        assert!(
            forked_from_initialized(0, 42).is_none(),
            "nobody initialized"
        );
        assert!(
            forked_from_initialized(42, 42).is_none(),
            "this process did"
        );
        let e = forked_from_initialized(41, 42).expect("the parent did");
        assert!(e.0.contains("forked from process 41"), "{}", e.0);
    }
}
