//! `fh_set_log_callback`, `fh_set_log_level`: the library's messages for a host runtime's log
//! (`crate::rt::log`).

use std::ffi::{c_char, c_int, c_void};

use crate::ffi::status::fh_status;
use crate::rt::log;

use super::guard::ffi_guard;

/// Message levels (`FH_LOG` names them `off`, `error`, `warn`, `info`, `debug`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum fh_log_level {
    FH_LOG_OFF = 0,
    FH_LOG_ERROR = 1,
    FH_LOG_WARN = 2,
    FH_LOG_INFO = 3,
    FH_LOG_DEBUG = 4,
}

/// Receives one message: `userdata` as registered, its level (an `fh_log_level`), the text
/// without a trailing newline, NUL-terminated, and its length. Called from any thread the library
/// runs on (the caller's, the progress thread, the helper thread), one message at a time; it must
/// not call back into the library.
pub type fh_log_callback = Option<
    unsafe extern "C" fn(userdata: *mut c_void, level: c_int, msg: *const c_char, len: usize),
>;

/// Send the library's messages to `cb` (with `userdata`) instead of stderr; NULL is fine and
/// restores stderr. Takes effect for every message from now on, process-wide. Always `FH_OK`.
#[no_mangle]
pub extern "C" fn fh_set_log_callback(cb: fh_log_callback, userdata: *mut c_void) -> fh_status {
    ffi_guard! {{
        log::set_callback(cb, userdata);
        fh_status::FH_OK
    }}
}

/// Emit messages up to `level` (an `fh_log_level`; `FH_LOG_OFF`: none), over `FH_LOG`.
/// `FH_ERR_BAD_CONFIG` for a value outside `FH_LOG_OFF..=FH_LOG_DEBUG` (nothing changes).
#[no_mangle]
pub extern "C" fn fh_set_log_level(level: c_int) -> fh_status {
    ffi_guard! {{
        if !(fh_log_level::FH_LOG_OFF as c_int..=fh_log_level::FH_LOG_DEBUG as c_int).contains(&level) {
            return fh_status::FH_ERR_BAD_CONFIG;
        }
        log::set_level(level as u8);
        fh_status::FH_OK
    }}
}
