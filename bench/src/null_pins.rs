//! A Firehose target that pins nothing (`fh_core`, `examples/core_profile`): it hands out
//! keys, so the core's bookkeeping is measured without the device.

use firehose_proto::{PinFailure, RegionPins};

pub struct NullPins(pub u32);

impl RegionPins for NullPins {
    fn pin(&mut self, _: u64, _: usize, _: firehose_proto::Rights) -> Result<u32, PinFailure> {
        self.0 += 1;
        Ok(self.0)
    }
    fn unpin(&mut self, _: u64, _: usize, _: u32) {}
    fn write(&mut self, _: u64, _: &[u8]) -> Result<(), PinFailure> {
        Ok(())
    }
}
