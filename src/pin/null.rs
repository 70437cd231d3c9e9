//! `NullPinner`: pins nothing and always succeeds (keys = 1, token = the address). For measuring
//! what the cache itself costs (benchmarks, metadata, profiling), never for real traffic.

use super::{Access, PinError, Pinned, Pinner};

pub struct NullPinner;

impl Pinner for NullPinner {
    fn pin(&self, addr: usize, _len: usize, _access: Access) -> Result<Pinned, PinError> {
        Ok(Pinned {
            token: addr,
            lkey: 1,
            rkey: 1,
        })
    }
    fn unpin(&self, _pinned: Pinned, _addr: usize, _len: usize) {}
    fn name(&self) -> &'static str {
        "null"
    }
}
