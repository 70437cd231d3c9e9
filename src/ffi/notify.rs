//! `fh_notify_unmapped`: for runtimes that already hook memory release themselves.

use crate::ffi::status::fh_status;
use crate::monitor;

use super::guard::ffi_guard;

/// Tells every cache in the process that `[addr, addr + len)` lost (or is about to lose) its
/// pages, e.g. from a runtime's own munmap/free hook. Cached registrations overlapping it will
/// never be hits again; ones still in use stay valid until released. A context (`fh_init`) also
/// starts revoking its peers' firehoses on the range, in the background (this call never waits
/// for that). Safe to call from inside a memory hook (no allocation, no blocking).
///
/// Returns `FH_ERR_NULL` (`addr` NULL), `FH_ERR_ZERO_LENGTH`, `FH_ERR_OVERFLOW` (`addr + len`
/// wraps); nothing is invalidated then.
#[no_mangle]
pub extern "C" fn fh_notify_unmapped(addr: *const std::ffi::c_void, len: usize) -> fh_status {
    ffi_guard! {{
        if addr.is_null() {
            return fh_status::FH_ERR_NULL;
        }
        if len == 0 {
            return fh_status::FH_ERR_ZERO_LENGTH;
        }
        if (addr as usize).checked_add(len).is_none() {
            return fh_status::FH_ERR_OVERFLOW;
        }
        // The pointer is only used as a number: nothing is dereferenced.
        monitor::notify_unmapped(addr as usize, len);
        fh_status::FH_OK
    }}
}
