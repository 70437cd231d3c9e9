//! The handle a request handler replies through (a leaf: `handlers.rs` names it in the handler
//! type, the endpoint's shared state is behind [`SendReply`]).

use std::sync::Weak;

use crate::net::NetError;
use crate::net::Rank;

/// What a [`Replier`] sends through: the endpoint's shared state (`endpoint.rs`).
pub(super) trait SendReply: Send + Sync {
    /// Send `payload` as the reply to request `token` of `peer`.
    fn send_reply(&self, peer: Rank, token: u32, payload: &[u8]) -> Result<(), NetError>;
}

/// The way back to a requester, handed to a request handler. It may be kept and used after the
/// handler returned (a reply that needs other messages first). Dropped without `reply`, the
/// requester's ticket ends in `NetError::Timeout` (or `PEER_LOST`/`FINALIZED`).
#[derive(Debug)]
pub struct Replier {
    pub(super) inner: Weak<dyn SendReply>,
    pub(super) peer: Rank,
    pub(super) token: u32,
}

impl Replier {
    /// Sends the reply (non-blocking: queued if no credit is free). `NetError::Finalized` if the
    /// endpoint is finalized or gone.
    pub fn reply(self, payload: &[u8]) -> Result<(), NetError> {
        let inner = self.inner.upgrade().ok_or(NetError::Finalized)?;
        inner.send_reply(self.peer, self.token, payload)
    }
}
