//! The core's vocabulary, shared by the initiator, the target and the `Firehose` that joins them
//! (a leaf: `lib.rs` re-exports it).
use std::collections::VecDeque;

use crate::error::{FhError, PinFailure};
use crate::ids::{OpId, Rank};
use crate::small::Inline2;
use crate::wire::Rights;

/// One RDMA to post: `len` bytes at the target's `raddr`, through key `rkey`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Seg {
    pub raddr: u64,
    pub len: usize,
    pub rkey: u32,
}

/// Segments of an op, in address order (one or two inline).
pub type Segs = Inline2<Seg>;

/// What `acquire` decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquire {
    Hit(Segs),
    Pending,
    DoneInMove,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Ready { op: OpId, segs: Segs },
    Failed { op: OpId, error: FhError },
    PutDone { op: OpId },
}

/// What the driver does for the target side: pin/unpin with the device, and write the
/// payload of a put that rode in a move (the range may be unpinned; unmapped is an error).
/// `pin` gives the key exactly `rights` (`READ`: peers may only read through it; a region
/// that must be writable is asked for with `WRITE`); `write` is a put's, so it may write only
/// where a pin with `Rights::WRITE` would be allowed.
pub trait RegionPins {
    fn pin(&mut self, addr: u64, len: usize, rights: Rights) -> Result<u32, PinFailure>;
    fn unpin(&mut self, addr: u64, len: usize, rkey: u32);
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), PinFailure>;

    /// The key `peer` is granted for the region `[addr, addr + len)` pinned as `rkey` (what
    /// `pin` returned), with the region's `rights`. By default the region's own key, which any
    /// peer could use; a driver with per-peer keys (memory windows) makes one that serves `peer`
    /// alone. A failure refuses this grant and leaves the region pinned.
    fn key_for(
        &mut self,
        peer: Rank,
        addr: u64,
        len: usize,
        rights: Rights,
        rkey: u32,
    ) -> Result<u32, PinFailure> {
        let _ = (peer, addr, len, rights);
        Ok(rkey)
    }

    /// `peer` no longer holds the region pinned as `rkey`, and `key` (what `key_for` gave it)
    /// must stop working now. Always called before the region is unpinned.
    fn drop_key(&mut self, peer: Rank, rkey: u32, key: u32) {
        let _ = (peer, rkey, key);
    }
}

pub(crate) type Outbox = VecDeque<(Rank, Vec<u8>)>;
