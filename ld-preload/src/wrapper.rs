//! Wrapper MRs: the `struct ibv_mr` the application gets for a cached registration.
//!
//! Providers find their private MR data with `container_of` on the `struct ibv_mr *`, so a wrapper
//! must never reach libibverbs. We recognise our wrappers by address in a registry (never by
//! dereferencing a pointer we did not allocate), and the registry owns them: removing an entry is
//! what frees it. `ibv_mr` is the first field, so the wrapper's address is the MR's address.

use std::cell::RefCell;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::fasthash::{new_map, FastMap};
use crate::ffi_types::IbvMr;
use crate::pd_cache::PdCache;

/// What stands behind a wrapper.
pub enum Backing {
    /// A cache registration, released with `PdCache::deregister(handle)`.
    Cached { cache: Arc<PdCache>, handle: u64 },
    /// A real MR the shim owns (after an `ibv_rereg_mr` to flags the cache cannot serve).
    Real(*mut IbvMr),
}

#[repr(C)]
pub struct WrapperMr {
    /// Must stay first: the application's `struct ibv_mr *` points here.
    pub mr: IbvMr,
    pub backing: Backing,
    /// The caller's access flags, kept for `ibv_rereg_mr` without `CHANGE_ACCESS`.
    pub access: u32,
}

// SAFETY: the raw pointers inside are verbs handles usable from any thread; a wrapper is only
// touched by whoever removed it from the registry.
unsafe impl Send for WrapperMr {}

type Map = FastMap<usize, Box<WrapperMr>>;

static REGISTRY: Mutex<Option<Map>> = Mutex::new(None);

fn registry() -> MutexGuard<'static, Option<Map>> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Lock the registry for `fork` (see `fork.rs`).
pub fn fork_lock() -> MutexGuard<'static, Option<Map>> {
    registry()
}

/// Spare wrapper allocations kept per thread, so the hit path (one wrapper per `ibv_reg_mr`,
/// freed by `ibv_dereg_mr`) does not go through malloc/free each time.
const SPARES_MAX: usize = 64;

thread_local! {
    // Boxes, not values: a wrapper's address is what the application holds, it must not move.
    #[allow(clippy::vec_box)]
    static SPARES: RefCell<Vec<Box<WrapperMr>>> = const { RefCell::new(Vec::new()) };
}

/// A wrapper holding `w`, from this thread's spares when there is one.
pub fn boxed(w: WrapperMr) -> Box<WrapperMr> {
    let spare = SPARES
        .try_with(|s| s.try_borrow_mut().ok().and_then(|mut s| s.pop()))
        .ok()
        .flatten();
    match spare {
        Some(mut b) => {
            // The spare's old content is a dead backing (`Real(null)`): nothing to release.
            *b = w;
            b
        }
        None => Box::new(w),
    }
}

/// Free a wrapper taken from the registry whose backing was released: the allocation is kept
/// as a spare when this thread has room (else, or during thread exit, it is freed).
pub fn retire(mut w: Box<WrapperMr>) {
    w.backing = Backing::Real(std::ptr::null_mut());
    let _ = SPARES.try_with(|s| {
        if let Ok(mut s) = s.try_borrow_mut() {
            if s.len() < SPARES_MAX {
                s.push(w);
            }
        }
    });
}

/// Hand a wrapper out: returns the `struct ibv_mr *` the application will use.
pub fn publish(mut w: Box<WrapperMr>) -> *mut IbvMr {
    let p: *mut IbvMr = &mut w.mr;
    registry().get_or_insert_with(new_map).insert(p as usize, w);
    p
}

/// Take the wrapper at `mr` back from the registry (`None`: not ours, pass it through).
/// The caller owns it; to keep handing it out, `publish` it again (same address).
pub fn take(mr: *mut IbvMr) -> Option<Box<WrapperMr>> {
    registry().as_mut()?.remove(&(mr as usize))
}

/// Wrappers currently handed out (counted from the registry: no counter to bump on the hit
/// path).
pub fn live() -> u64 {
    registry().as_ref().map_or(0, |m| m.len() as u64)
}

/// True if `mr` is a wrapper we handed out.
#[cfg(test)]
fn is_wrapper(mr: *mut IbvMr) -> bool {
    registry()
        .as_ref()
        .is_some_and(|m| m.contains_key(&(mr as usize)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dummy(addr: usize) -> Box<WrapperMr> {
        Box::new(WrapperMr {
            mr: IbvMr {
                context: std::ptr::null_mut(),
                pd: std::ptr::null_mut(),
                addr: addr as *mut _,
                length: 10,
                handle: 0,
                lkey: 1,
                rkey: 2,
            },
            backing: Backing::Real(std::ptr::null_mut()),
            access: 0,
        })
    }

    #[test]
    fn published_wrappers_are_recognised_by_address_and_taken_once() {
        let p = publish(dummy(0x1000));
        assert!(is_wrapper(p));
        // SAFETY: `p` points at the published wrapper's MR, alive while registered.
        assert_eq!(unsafe { (*p).addr } as usize, 0x1000);
        let mut foreign = dummy(0x2000);
        assert!(!is_wrapper(&mut foreign.mr), "not published: not ours");
        let w = take(p).expect("ours");
        assert_eq!(
            &w.mr as *const IbvMr, p as *const IbvMr,
            "address is the MR's"
        );
        assert!(take(p).is_none(), "a second dereg passes through");
        let again = publish(w);
        assert_eq!(again, p, "republishing keeps the address (rereg)");
        drop(take(again));
    }
}
