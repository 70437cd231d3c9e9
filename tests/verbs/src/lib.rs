//! Shared pieces of the real-verbs test programs: page-aligned buffers, byte patterns and their
//! check, and the exit-code convention (0 pass, 77 skip, 1 fail) the suite scripts read.

pub mod buffer;
pub mod link_ranks;
pub mod pattern;

/// Exit code for "passed".
pub const EXIT_PASS: i32 = 0;
/// Exit code for "could not run here" (no device), as automake and scripts/verbs-suite read it.
pub const EXIT_SKIP: i32 = 77;
/// Exit code for "ran and found a problem".
pub const EXIT_FAIL: i32 = 1;

/// Opens the test's device (`name`, else the first), printing the verdict when it cannot:
/// no device at all is `Err(EXIT_SKIP)` ("SKIP: ..."), a device that exists but cannot be opened
/// is `Err(EXIT_FAIL)` ("FAIL: ..."). The caller returns the code from `main`.
pub fn open_device_or_verdict(
    name: Option<&str>,
) -> Result<std::sync::Arc<firehose::internals::pin::verbs::Context>, i32> {
    use firehose::internals::pin::verbs::{DeviceList, VerbsError};
    let list = match DeviceList::get() {
        Ok(l) if !l.is_empty() => l,
        Ok(_) => {
            println!("SKIP: no RDMA device (ibv_get_device_list returned an empty list)");
            return Err(EXIT_SKIP);
        }
        Err(VerbsError::NoDevice(why)) => {
            println!("SKIP: no RDMA device ({why})");
            return Err(EXIT_SKIP);
        }
        Err(e) => {
            println!("FAIL: {e}");
            return Err(EXIT_FAIL);
        }
    };
    list.open(name).map_err(|e| {
        println!("FAIL: {e}");
        EXIT_FAIL
    })
}
