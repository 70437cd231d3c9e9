//! The handler table: `u16` id -> request or one-way handler. Lookups clone an `Arc` under a
//! read lock and call it after the lock is gone, so a handler may register handlers or send.

use super::endpoint::Replier;
use crate::net::Rank;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// A request handler: the sender, the payload (valid during the call), and the `Replier`, which
/// may be kept and used after the handler returns.
pub type RequestFn = dyn Fn(Rank, &[u8], Replier) + Send + Sync;
/// A one-way handler: the sender and the payload.
pub type OneWayFn = dyn Fn(Rank, &[u8]) + Send + Sync;

#[derive(Clone)]
pub enum Handler {
    Request(Arc<RequestFn>),
    OneWay(Arc<OneWayFn>),
}

#[derive(Default)]
pub struct Handlers {
    map: RwLock<HashMap<u16, Handler>>,
}

impl Handlers {
    /// Registers (or replaces) the handler of `id`.
    pub fn set(&self, id: u16, h: Handler) {
        self.map
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, h);
    }

    pub fn get(&self, id: u16) -> Option<Handler> {
        self.map
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned()
    }
}
