//! Coexistence with other memory-hook machinery in the same process.
//!
//! UCX (libucm), Open MPI (the patcher in libopen-pal) and libfabric (memhooks) patch the entries
//! of libc's unmap-family functions, as our monitor does. Entry patches do not chain: whoever
//! patches last owns the entry and the other stops seeing unmaps (Open MPI then warns "UCX is unable
//! to handle VM_UNMAP event", measured under mpirun with the shim). So when one of those libraries
//! is loaded at the moment we install, and `FH_MONITOR` does not say otherwise, we leave libc's code
//! alone and rely on userfaultfd plus our exported unmap functions, which disturb nobody and passed
//! every stale-registration case on their own.

use std::ffi::CStr;

/// Libraries known to patch libc's memory functions.
const PATCHERS: [&CStr; 3] = [c"libucm.so.0", c"libopen-pal.so.40", c"libfabric.so.1"];

/// True if a library that patches libc's memory functions is loaded now.
pub(crate) fn foreign_patcher_loaded() -> bool {
    PATCHERS.iter().any(|name| loaded(name))
}

fn loaded(name: &CStr) -> bool {
    // SAFETY: RTLD_NOLOAD never loads anything and runs no constructor; a handle we get is
    // released at once (the library stays loaded: it was before we asked).
    unsafe {
        let h = libc::dlopen(name.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY);
        if h.is_null() {
            return false;
        }
        libc::dlclose(h);
        true
    }
}

/// Said once, when the default monitor deferred to another library's hooks and userfaultfd is
/// not running: the shim then caches nothing (`pd_cache::BLIND`). `uffd_errno`: why userfaultfd
/// is off (0 if it was not asked for).
pub(crate) fn warn_blind(uffd_errno: i32) {
    firehose::fh_warn!(
        "firehose-preload: another library patches libc's unmap functions (UCX, Open MPI or \
         libfabric) and userfaultfd is unavailable (errno {uffd_errno}): nothing would see the \
         memory free() gives back, so registrations pass through uncached. FH_MONITOR=patch \
         patches libc anyway (the other library then misses those events)."
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loaded_sees_libc_and_not_an_absent_library() {
        assert!(loaded(c"libc.so.6"));
        assert!(!loaded(c"libfirehose-no-such-library.so.9"));
    }
}
