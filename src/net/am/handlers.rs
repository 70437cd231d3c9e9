//! The handler table: `u16` id -> request or one-way handler. Lookups clone an `Arc` under a
//! read lock and call it after the lock is gone, so a handler may register handlers or send.
//!
//! The RDMA completion handler is called once per completion, on the hit path of every put and
//! get, by whichever thread polls (the progress thread too): it is reached through one atomic
//! load, with no lock and no reference count touched (those are shared cache lines between the
//! pollers). A handler that is replaced stays allocated until the table goes, since a poller
//! may still be running it; replacements are rare (setup), so what is kept is small.

use super::replier::Replier;
use crate::net::{LinkError, Rank};
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// A request handler: the sender, the payload (valid during the call), and the `Replier`, which
/// may be kept and used after the handler returns.
pub(super) type RequestFn = dyn Fn(Rank, &[u8], Replier) + Send + Sync;
/// A one-way handler: the sender and the payload.
pub(super) type OneWayFn = dyn Fn(Rank, &[u8]) + Send + Sync;
/// The RDMA completion handler: the peer, the op's token, and how it ended (see
/// `LinkEvent::RdmaDone`).
pub(super) type RdmaFn = dyn Fn(Rank, u64, Result<(), LinkError>) + Send + Sync;
/// Told once per peer when the endpoint declares it lost.
pub(super) type LostFn = dyn Fn(Rank) + Send + Sync;

#[derive(Clone)]
pub(super) enum Handler {
    Request(Arc<RequestFn>),
    OneWay(Arc<OneWayFn>),
}

/// The RDMA handler as the table keeps it: the `Arc`, and the closure's own address taken from
/// it once (a call then skips the `Arc`'s header arithmetic).
struct RdmaSlot {
    f: Arc<RdmaFn>,
    call: *const RdmaFn,
}

// SAFETY: `call` points into `f`, which is `Send + Sync` and lives as long as the slot; the
// pointer is only read to call the closure through a shared reference.
unsafe impl Send for RdmaSlot {}
// SAFETY: as above.
unsafe impl Sync for RdmaSlot {}

impl RdmaSlot {
    fn new(f: Arc<RdmaFn>) -> Self {
        let call = Arc::as_ptr(&f);
        RdmaSlot { f, call }
    }
}

pub(super) struct Handlers {
    map: RwLock<FxHashMap<u16, Handler>>,
    /// The RDMA handler (from `Box::into_raw`), or null.
    rdma: AtomicPtr<RdmaSlot>,
    /// RDMA handlers replaced since the table was made: freed with it (see the module head).
    /// Boxed: a poller may hold a pointer to the slot itself, which must not move.
    #[allow(clippy::vec_box)]
    retired: Mutex<Vec<Box<RdmaSlot>>>,
    lost: RwLock<Option<Arc<LostFn>>>,
}

impl Default for Handlers {
    fn default() -> Self {
        Handlers {
            map: RwLock::default(),
            rdma: AtomicPtr::new(std::ptr::null_mut()),
            retired: Mutex::new(Vec::new()),
            lost: RwLock::default(),
        }
    }
}

impl Drop for Handlers {
    fn drop(&mut self) {
        let p = *self.rdma.get_mut();
        if !p.is_null() {
            // SAFETY: from `Box::into_raw` in `set_rdma`, not retired, freed once, here.
            drop(unsafe { Box::from_raw(p) });
        }
    }
}

impl Handlers {
    /// Registers (or replaces) the handler of `id`.
    pub(super) fn set(&self, id: u16, h: Handler) {
        self.map
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, h);
    }

    /// Sets (or, with `None`, removes) the RDMA completion handler.
    pub(super) fn set_rdma(&self, f: Option<Arc<RdmaFn>>) {
        let new = f.map_or(std::ptr::null_mut(), |f| {
            Box::into_raw(Box::new(RdmaSlot::new(f)))
        });
        let old = self.rdma.swap(new, Ordering::AcqRel);
        if !old.is_null() {
            // SAFETY: from `Box::into_raw` here, swapped out once; kept (not freed) while the
            // table lives, as a poller may still be running it.
            let old = unsafe { Box::from_raw(old) };
            self.retired
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(old);
        }
    }

    /// Sets (or, with `None`, removes) the peer-loss handler.
    pub(super) fn set_lost(&self, f: Option<Arc<LostFn>>) {
        *self.lost.write().unwrap_or_else(|e| e.into_inner()) = f;
    }

    pub(super) fn lost(&self) -> Option<Arc<LostFn>> {
        self.lost.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(super) fn rdma(&self) -> Option<Arc<RdmaFn>> {
        let p = self.rdma.load(Ordering::Acquire);
        // SAFETY: a non-null pointer is a live box (see `set_rdma`: never freed before `self`).
        (!p.is_null()).then(|| unsafe { (*p).f.clone() })
    }

    /// Calls the RDMA handler, if one is set (false if none).
    pub(super) fn call_rdma(&self, peer: Rank, token: u64, result: Result<(), LinkError>) -> bool {
        let p = self.rdma.load(Ordering::Acquire);
        if p.is_null() {
            return false;
        }
        // SAFETY: as in `rdma`: the box outlives `self`'s borrow, and `call` points into the
        // `Arc` it holds.
        let f: &RdmaFn = unsafe { &*(*p).call };
        f(peer, token, result);
        true
    }

    pub(super) fn get(&self, id: u16) -> Option<Handler> {
        self.map
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned()
    }
}
