//! Active messages over a `Link`: handlers by `u16` id, request/reply with tickets, one-way
//! messages, credits, loopback to the own rank, peer liveness, finalize, the progress thread.
//!
//! Owns: the endpoint (`Am`), its handler table, outstanding tickets, per-peer send state.
//! May call: `Link` (the only way out), `wire`, `credits`, `stats`, `settings`, `status`.
//! Locks: a peer's lock is held across `Link::send` (which never blocks: the link copies or
//! inlines, and never waits for a credit); no lock at all is held while a handler runs.

mod dispatch;
mod endpoint;
mod handlers;
mod peer;
mod progress_thread;
pub(crate) mod queue_bound;
mod replier;
#[cfg(test)]
mod tests;
mod tickets;

pub use endpoint::{Am, Ticket};
