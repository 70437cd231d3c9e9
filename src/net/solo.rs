//! The link of a job of one: there is nobody to talk to. The AM layer loops messages to its own
//! rank back without a link, so this only has to say "size 1" and refuse every peer. RDMA to the
//! own rank is refused too (`BadRank`): Firehose does its own rank's puts and gets with memcpy.

use super::link::{Link, LinkError, LinkEvent, Rank, RdmaOp};
use std::time::Duration;

/// `Link` for `size == 1`; needs no device.
#[derive(Debug)]
pub struct SoloLink {
    /// Receive slots reported to the AM layer (it checks its credit reserve against them).
    pub recv_slots: u32,
    pub max_msg: usize,
}

impl Link for SoloLink {
    fn rank(&self) -> Rank {
        0
    }
    fn size(&self) -> u32 {
        1
    }
    fn max_msg(&self) -> usize {
        self.max_msg
    }
    fn recv_slots(&self) -> u32 {
        self.recv_slots
    }
    fn send(&self, peer: Rank, _msg: &[u8]) -> Result<(), LinkError> {
        Err(LinkError::BadRank(peer))
    }
    fn poll(&self, _on: &mut dyn FnMut(LinkEvent<'_>)) -> Result<usize, LinkError> {
        Ok(0)
    }
    fn wait(&self, timeout: Duration) -> Result<(), LinkError> {
        // Nothing can ever arrive; sleep so a progress thread does not spin.
        std::thread::sleep(timeout);
        Ok(())
    }
    fn probe(&self, peer: Rank) -> Result<(), LinkError> {
        Err(LinkError::BadRank(peer))
    }
    fn max_rdma(&self) -> usize {
        0
    }
    unsafe fn rdma(&self, peer: Rank, _op: RdmaOp) -> Result<(), LinkError> {
        Err(LinkError::BadRank(peer))
    }
}
