//! Wrapper MRs: the `struct ibv_mr` the application gets for a cached registration.
//!
//! Providers find their private MR data with `container_of` on the `struct ibv_mr *`, so a wrapper
//! must never reach libibverbs. We recognise our wrappers by address (never by dereferencing a
//! pointer we did not allocate): wrappers live in slots of chunks the shim allocated, and a
//! pointer is ours when it is the start of a slot whose state is LIVE. `ibv_mr` is the first field,
//! so the slot's address is the MR's address.
//!
//! Why slots and not a locked map: every cached `ibv_reg_mr` + `ibv_dereg_mr` pair publishes and
//! takes back one wrapper, and under the VM's emulation a lock, a hash and a malloc/free pair each
//! cost more than the cache hit itself. Taking a wrapper back is one compare-and-swap on its state
//! (LIVE -> HELD), which also makes two concurrent `ibv_dereg_mr` of one MR safe: one wins, the
//! other finds a slot that is not handed out and fails with EINVAL (it must never reach
//! libibverbs, which would deregister the cached MR behind it and free our slot). Free slots are kept per thread, with a shared
//! pool behind them; chunks are never freed (their number is bounded by the peak of live MRs).

use std::cell::{RefCell, UnsafeCell};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::ffi_types::IbvMr;
use crate::pd_cache::PdCache;

/// What stands behind a wrapper.
pub(crate) enum Backing {
    /// A cache registration, released with `PdCache::deregister(handle)`.
    Cached { cache: Arc<PdCache>, handle: u64 },
    /// A real MR the shim owns (after an `ibv_rereg_mr` to flags the cache cannot serve).
    Real(*mut IbvMr),
}

#[repr(C)]
pub(crate) struct WrapperMr {
    /// Must stay first: the application's `struct ibv_mr *` points here.
    pub mr: IbvMr,
    pub backing: Backing,
    /// The caller's access flags, kept for `ibv_rereg_mr` without `CHANGE_ACCESS`.
    pub access: u32,
}

// SAFETY: the raw pointers inside are verbs handles usable from any thread; a wrapper is only
// touched by the thread that holds its slot.
unsafe impl Send for WrapperMr {}

const FREE: u8 = 0;
const LIVE: u8 = 1;
const HELD: u8 = 2;

/// One wrapper's storage. `w` is initialised exactly when `state != FREE`.
#[repr(C)]
pub(crate) struct Slot {
    /// Must stay first: the slot's address is the wrapper's, which is the MR's.
    w: UnsafeCell<MaybeUninit<WrapperMr>>,
    state: AtomicU8,
}

// SAFETY: `w` is only touched by the thread that owns the slot: the one that moved it to HELD
// (compare-and-swap from LIVE) or that holds it FREE from a free list.
unsafe impl Sync for Slot {}

/// Chunk `k` has `FIRST_CHUNK << k` slots, so a few chunks cover any realistic number of MRs.
const FIRST_CHUNK: usize = 64;
const MAX_CHUNKS: usize = 26;

#[allow(clippy::declare_interior_mutable_const)]
const NO_CHUNK: AtomicPtr<Slot> = AtomicPtr::new(std::ptr::null_mut());
static CHUNKS: [AtomicPtr<Slot>; MAX_CHUNKS] = [NO_CHUNK; MAX_CHUNKS];
/// Chunks published in `CHUNKS` (Release after the pointer is stored).
static NCHUNKS: AtomicUsize = AtomicUsize::new(0);

/// Free slots no thread keeps, and the lock for growing `CHUNKS`.
static POOL: Mutex<Vec<&'static Slot>> = Mutex::new(Vec::new());

fn pool() -> MutexGuard<'static, Vec<&'static Slot>> {
    POOL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Lock the shared pool for `fork` (see `fork.rs`).
pub(crate) fn fork_lock() -> MutexGuard<'static, Vec<&'static Slot>> {
    pool()
}

/// Free slots this thread keeps (at most `SPARES_MAX`; the rest go back to the pool).
struct Spares(Vec<&'static Slot>);

const SPARES_MAX: usize = 64;

impl Drop for Spares {
    fn drop(&mut self) {
        // Thread exit: hand them to the other threads.
        pool().append(&mut self.0);
    }
}

thread_local! {
    static SPARES: RefCell<Spares> = const { RefCell::new(Spares(Vec::new())) };
}

/// Allocate the next chunk and push its slots to `pool` (held). `None` when all are in use.
fn grow(pool: &mut Vec<&'static Slot>) -> Option<()> {
    let k = NCHUNKS.load(Ordering::Relaxed);
    if k == MAX_CHUNKS {
        return None;
    }
    let n = FIRST_CHUNK << k;
    let chunk: &'static [Slot] = Vec::leak(
        (0..n)
            .map(|_| Slot {
                w: UnsafeCell::new(MaybeUninit::uninit()),
                state: AtomicU8::new(FREE),
            })
            .collect(),
    );
    CHUNKS[k].store(chunk.as_ptr() as *mut Slot, Ordering::Release);
    NCHUNKS.store(k + 1, Ordering::Release);
    pool.extend(chunk.iter().rev());
    Some(())
}

/// A free slot: this thread's spare, else from the pool (growing it when empty).
fn free_slot() -> Option<&'static Slot> {
    let spare = SPARES
        .try_with(|s| s.try_borrow_mut().ok().and_then(|mut s| s.0.pop()))
        .ok()
        .flatten();
    if spare.is_some() {
        return spare;
    }
    let mut p = pool();
    if p.is_empty() {
        grow(&mut p)?;
    }
    p.pop()
}

/// The slot that starts at `mr`, if any (address arithmetic only: `mr` is never read).
fn slot_at(mr: *mut IbvMr) -> Option<&'static Slot> {
    let a = mr as usize;
    let size = std::mem::size_of::<Slot>();
    for (k, c) in CHUNKS
        .iter()
        .enumerate()
        .take(NCHUNKS.load(Ordering::Acquire))
    {
        let base = c.load(Ordering::Acquire) as usize;
        let off = a.wrapping_sub(base);
        if off < (FIRST_CHUNK << k) * size && off.is_multiple_of(size) {
            // SAFETY: `off / size` is in bounds of chunk `k`, which is leaked (lives forever).
            return Some(unsafe { &*(base as *const Slot).add(off / size) });
        }
    }
    None
}

/// Hand a new wrapper out: returns the `struct ibv_mr *` the application will use, or the
/// wrapper back when no slot can be had.
pub(crate) fn publish_new(w: WrapperMr) -> Result<*mut IbvMr, WrapperMr> {
    let Some(slot) = free_slot() else {
        return Err(w);
    };
    // SAFETY: a FREE slot from a free list belongs to this thread alone.
    unsafe { (*slot.w.get()).write(w) };
    slot.state.store(LIVE, Ordering::Release);
    Ok(slot.w.get() as *mut IbvMr)
}

/// A wrapper taken back from the application; this thread alone may touch it. Dropping it frees
/// the wrapper (its backing is dropped with it); `publish` hands it out again at the same address.
pub(crate) struct Held(&'static Slot);

impl Held {
    pub(crate) fn publish(self) -> *mut IbvMr {
        let p = self.0.w.get() as *mut IbvMr;
        self.0.state.store(LIVE, Ordering::Release);
        std::mem::forget(self);
        p
    }
}

impl std::ops::Deref for Held {
    type Target = WrapperMr;
    fn deref(&self) -> &WrapperMr {
        // SAFETY: HELD: initialised, and this thread owns it.
        unsafe { (*self.0.w.get()).assume_init_ref() }
    }
}

impl std::ops::DerefMut for Held {
    fn deref_mut(&mut self) -> &mut WrapperMr {
        // SAFETY: as in `deref`.
        unsafe { (*self.0.w.get()).assume_init_mut() }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let slot = self.0;
        // SAFETY: HELD: initialised and ours; it is dropped once, then marked FREE.
        unsafe { (*slot.w.get()).assume_init_drop() };
        slot.state.store(FREE, Ordering::Relaxed);
        let kept = SPARES
            .try_with(|s| match s.try_borrow_mut() {
                Ok(mut s) if s.0.len() < SPARES_MAX => {
                    s.0.push(slot);
                    true
                }
                _ => false,
            })
            .unwrap_or(false);
        if !kept {
            pool().push(slot);
        }
    }
}

/// What `take` found at an MR pointer.
pub(crate) enum Taken {
    /// A wrapper we handed out, now ours to release or hand out again.
    Wrapper(Held),
    /// The start of one of our slots that is not handed out: a wrapper already deregistered (a
    /// second `ibv_dereg_mr`), or being deregistered by another thread right now. It must never
    /// reach libibverbs: its `handle` is that of a cached MR other wrappers share, and its memory
    /// is not malloc's.
    Stale,
    /// Not ours: an MR libibverbs gave the application.
    NotOurs,
}

/// Take the wrapper at `mr` back.
pub(crate) fn take(mr: *mut IbvMr) -> Taken {
    let Some(slot) = slot_at(mr) else {
        return Taken::NotOurs;
    };
    match slot
        .state
        .compare_exchange(LIVE, HELD, Ordering::Acquire, Ordering::Relaxed)
    {
        Ok(_) => Taken::Wrapper(Held(slot)),
        Err(_) => Taken::Stale,
    }
}

/// Wrappers currently handed out (or held by a call in progress). Scans every slot: for the
/// statistics, never on the hit path.
pub(crate) fn live() -> u64 {
    let n = NCHUNKS.load(Ordering::Acquire);
    let mut live = 0;
    for (k, c) in CHUNKS.iter().enumerate().take(n) {
        let base = c.load(Ordering::Acquire) as *const Slot;
        // SAFETY: chunk `k` has `FIRST_CHUNK << k` slots and lives forever.
        let chunk = unsafe { std::slice::from_raw_parts(base, FIRST_CHUNK << k) };
        live += chunk
            .iter()
            .filter(|s| s.state.load(Ordering::Relaxed) != FREE)
            .count() as u64;
    }
    live
}

/// True if `mr` is a wrapper we handed out.
#[cfg(test)]
fn is_wrapper(mr: *mut IbvMr) -> bool {
    slot_at(mr).is_some_and(|s| s.state.load(Ordering::Acquire) == LIVE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dummy(addr: usize) -> WrapperMr {
        WrapperMr {
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
        }
    }

    #[test]
    fn published_wrappers_are_recognised_by_address_and_taken_once() {
        let _s = crate::serial::serial();
        let p = publish_new(dummy(0x1000)).ok().unwrap();
        assert!(is_wrapper(p));
        // SAFETY: `p` points at the published wrapper's MR, alive while published.
        assert_eq!(unsafe { (*p).addr } as usize, 0x1000);
        let mut foreign = dummy(0x2000);
        assert!(!is_wrapper(&mut foreign.mr), "not published: not ours");
        // Inside a slot but not at its start: not ours either.
        assert!(matches!(
            take((p as usize + 8) as *mut IbvMr),
            Taken::NotOurs
        ));
        let Taken::Wrapper(w) = take(p) else {
            panic!("ours")
        };
        assert_eq!(w.mr.addr as usize, 0x1000);
        assert!(
            matches!(take(p), Taken::Stale),
            "a second dereg while held: refused, never passed through"
        );
        let again = w.publish();
        assert_eq!(again, p, "republishing keeps the address (rereg)");
        drop(take(again));
        assert!(!is_wrapper(p), "freed");
        assert!(matches!(take(p), Taken::Stale), "and after it is freed");
    }

    #[test]
    fn many_live_wrappers_grow_chunks_and_keep_their_own_slots() {
        let _s = crate::serial::serial();
        let held: Vec<*mut IbvMr> = (0..1000)
            .map(|i| {
                let mut w = dummy(i);
                w.access = i as u32;
                publish_new(w).ok().unwrap()
            })
            .collect();
        let distinct: std::collections::HashSet<usize> = held.iter().map(|p| *p as usize).collect();
        assert_eq!(
            distinct.len(),
            1000,
            "every live wrapper has its own address"
        );
        assert!(live() >= 1000);
        for (i, p) in held.iter().enumerate() {
            let Taken::Wrapper(w) = take(*p) else {
                panic!("ours")
            };
            assert_eq!(w.access, i as u32, "each slot kept its own wrapper");
            drop(w);
        }
        assert!(held.iter().all(|p| !is_wrapper(*p)));
    }
}
