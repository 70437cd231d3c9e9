//! Peers: who they are (`bootstrap`), how messages and one-sided RDMA reach them (`link`: verbs RC
//! or the simulator), and the active-message layer on top (`am`: handlers by id, request/reply,
//! credits, progress; it passes RDMA completions up to the layer above through one handler).
//!
//! Owns: endpoints, queue pairs, receive buffers, credits, the progress thread.
//! May call: `pin::verbs` (context, protection domain, memory regions), `config`, `rt` (
//! `raw_thread`, `race_once`, `inside`: the progress thread marks itself as the library's).
//! Never calls: `cache`, `monitor` (a message buffer is registered once, never through the cache).
//! Only `net/verbs` touches libibverbs here; everything else is tested with `sim` and no device.

pub(crate) mod am;
pub(crate) mod barrier;
pub mod bootstrap;
pub mod credits;
mod error;
pub(crate) mod link;
pub(crate) mod peers;
pub mod settings;
#[cfg(any(test, feature = "test-support"))]
pub mod sim;
pub mod solo;
pub mod stats;
pub mod verbs;
pub mod wire;

pub use am::{Am, Ticket};
pub use bootstrap::{Bootstrap, BootstrapError};
pub use error::NetError;
pub use link::{Link, LinkError, LinkEvent, Rank, RdmaKind, RdmaOp};
pub use peers::{Peers, PeersConfig};
pub use settings::NetSettings;
