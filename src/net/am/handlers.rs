//! The handler table: `u16` id -> request or one-way handler. Lookups clone an `Arc` under a
//! read lock and call it after the lock is gone, so a handler may register handlers or send.

use super::replier::Replier;
use crate::net::{LinkError, Rank};
use rustc_hash::FxHashMap;
use std::sync::{Arc, RwLock};

/// A request handler: the sender, the payload (valid during the call), and the `Replier`, which
/// may be kept and used after the handler returns.
pub type RequestFn = dyn Fn(Rank, &[u8], Replier) + Send + Sync;
/// A one-way handler: the sender and the payload.
pub type OneWayFn = dyn Fn(Rank, &[u8]) + Send + Sync;
/// The RDMA completion handler: the peer, the op's token, and how it ended (see
/// `LinkEvent::RdmaDone`).
pub type RdmaFn = dyn Fn(Rank, u64, Result<(), LinkError>) + Send + Sync;
/// Told once per peer when the endpoint declares it lost.
pub type LostFn = dyn Fn(Rank) + Send + Sync;

#[derive(Clone)]
pub enum Handler {
    Request(Arc<RequestFn>),
    OneWay(Arc<OneWayFn>),
}

#[derive(Default)]
pub struct Handlers {
    map: RwLock<FxHashMap<u16, Handler>>,
    rdma: RwLock<Option<Arc<RdmaFn>>>,
    lost: RwLock<Option<Arc<LostFn>>>,
}

impl Handlers {
    /// Registers (or replaces) the handler of `id`.
    pub fn set(&self, id: u16, h: Handler) {
        self.map
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, h);
    }

    /// Sets (or, with `None`, removes) the RDMA completion handler.
    pub fn set_rdma(&self, f: Option<Arc<RdmaFn>>) {
        *self.rdma.write().unwrap_or_else(|e| e.into_inner()) = f;
    }

    /// Sets (or, with `None`, removes) the peer-loss handler.
    pub fn set_lost(&self, f: Option<Arc<LostFn>>) {
        *self.lost.write().unwrap_or_else(|e| e.into_inner()) = f;
    }

    pub fn lost(&self) -> Option<Arc<LostFn>> {
        self.lost.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn rdma(&self) -> Option<Arc<RdmaFn>> {
        self.rdma.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn get(&self, id: u16) -> Option<Handler> {
        self.map
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned()
    }
}
