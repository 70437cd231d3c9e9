//! One logging path. Everything the library reports on its own (bad settings, a device that
//! cannot be opened, a peer that disagrees) goes through [`emit`], with a level:
//!
//! - `FH_LOG=off|error|warn|info|debug` (default `warn`) says which levels pass; read once, at
//!   the first message; `fh_set_log_level` overrides it;
//! - by default a message goes to stderr, one line; a host runtime takes them instead with
//!   `fh_set_log_callback` (as it would with UCX's or rustls-ffi's log hooks), e.g. to put them in
//!   its own log with its rank prefix.
//!
//! Messages are rare (setup and errors): formatting allocates, so nothing in an LD_PRELOAD hook
//! or the fork path logs.

use std::ffi::c_void;
use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

/// The environment variable.
pub const LOG_ENV: &str = "FH_LOG";

/// Message levels, most severe first (the numbers are the C ABI's `fh_log_level`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
}

impl Level {
    pub fn from_u8(v: u8) -> Option<Level> {
        match v {
            1 => Some(Level::Error),
            2 => Some(Level::Warn),
            3 => Some(Level::Info),
            4 => Some(Level::Debug),
            _ => None,
        }
    }
}

/// Parse an `FH_LOG` value: the highest level that passes (0: nothing).
pub fn parse(v: &str) -> Option<u8> {
    match v.trim().to_ascii_lowercase().as_str() {
        "off" | "none" | "0" => Some(0),
        "error" | "1" => Some(Level::Error as u8),
        "" | "warn" | "warning" | "2" => Some(Level::Warn as u8),
        "info" | "3" => Some(Level::Info as u8),
        "debug" | "trace" | "4" => Some(Level::Debug as u8),
        _ => None,
    }
}

/// The highest level that passes; `UNSET` until the environment was read.
static MAX: AtomicU8 = AtomicU8::new(UNSET);
const UNSET: u8 = u8::MAX;

/// A C callback: (user data, level, message without newline, NUL-terminated, its length).
pub type Callback =
    unsafe extern "C" fn(*mut c_void, std::ffi::c_int, *const std::ffi::c_char, usize);

struct Sink {
    cb: Callback,
    user: *mut c_void,
}
// SAFETY: the user data pointer is the host's; `fh_set_log_callback` documents that the callback
// may be called from any thread the library runs.
unsafe impl Send for Sink {}

static SINK: Mutex<Option<Sink>> = Mutex::new(None);

fn max_level() -> u8 {
    let m = MAX.load(Ordering::Relaxed);
    if m != UNSET {
        return m;
    }
    let from_env = std::env::var(LOG_ENV).ok();
    let parsed = from_env.as_deref().map_or(Some(Level::Warn as u8), parse);
    let m = parsed.unwrap_or(Level::Warn as u8);
    // A racing `set_level` wins over the environment.
    let _ = MAX.compare_exchange(UNSET, m, Ordering::Relaxed, Ordering::Relaxed);
    if parsed.is_none() {
        emit(
            Level::Warn,
            format_args!(
                "firehose: {LOG_ENV}={:?}: expected off, error, warn, info or debug; using warn",
                from_env.unwrap_or_default()
            ),
        );
    }
    MAX.load(Ordering::Relaxed)
}

/// Whether a message at `level` would be emitted.
pub fn enabled(level: Level) -> bool {
    level as u8 <= max_level()
}

/// Set the highest level that passes (0: none), over `FH_LOG`.
pub fn set_level(max: u8) {
    MAX.store(max.min(Level::Debug as u8), Ordering::Relaxed);
}

/// Send messages to `cb` (with `user`), or back to stderr with `None`.
pub fn set_callback(cb: Option<Callback>, user: *mut c_void) {
    let mut s = SINK.lock().unwrap_or_else(|e| e.into_inner());
    *s = cb.map(|cb| Sink { cb, user });
}

/// Emit one message (use the `fh_error!`.. macros).
pub fn emit(level: Level, args: fmt::Arguments<'_>) {
    if !enabled(level) {
        return;
    }
    let mut msg = args.to_string();
    let s = SINK.lock().unwrap_or_else(|e| e.into_inner());
    match &*s {
        Some(sink) => {
            let len = msg.len();
            msg.push('\0');
            // SAFETY: the host registered a callback with this signature; the message is valid
            // and NUL-terminated for the call.
            unsafe {
                (sink.cb)(
                    sink.user,
                    level as std::ffi::c_int,
                    msg.as_ptr().cast(),
                    len,
                )
            };
        }
        None => {
            drop(s);
            eprintln!("{msg}");
        }
    }
}

/// Log at error level (`format!` syntax).
#[macro_export]
macro_rules! fh_error {
    ($($t:tt)*) => { $crate::log::emit($crate::log::Level::Error, format_args!($($t)*)) };
}

/// Log at warn level (`format!` syntax).
#[macro_export]
macro_rules! fh_warn {
    ($($t:tt)*) => { $crate::log::emit($crate::log::Level::Warn, format_args!($($t)*)) };
}

/// Log at info level (`format!` syntax).
#[macro_export]
macro_rules! fh_info {
    ($($t:tt)*) => { $crate::log::emit($crate::log::Level::Info, format_args!($($t)*)) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn levels_parse() {
        assert_eq!(parse("off"), Some(0));
        assert_eq!(parse("ERROR"), Some(1));
        assert_eq!(parse(""), Some(2));
        assert_eq!(parse("debug"), Some(4));
        assert_eq!(parse("loud"), None);
        assert_eq!(Level::from_u8(3), Some(Level::Info));
        assert_eq!(Level::from_u8(9), None);
    }

    static SEEN: AtomicUsize = AtomicUsize::new(0);
    unsafe extern "C" fn count(
        user: *mut c_void,
        level: std::ffi::c_int,
        msg: *const std::ffi::c_char,
        len: usize,
    ) {
        assert_eq!(user as usize, 7);
        assert!(level <= Level::Warn as std::ffi::c_int);
        // SAFETY: the logger passes a NUL-terminated message of `len` bytes.
        let s = unsafe { std::ffi::CStr::from_ptr(msg) };
        assert_eq!(s.to_bytes().len(), len);
        assert!(s.to_str().unwrap().starts_with("firehose: test"));
        SEEN.fetch_add(1, Ordering::Relaxed);
    }

    /// The callback gets what passes the level, nothing else; `None` gives stderr back.
    #[test]
    fn callback_and_level_filter() {
        set_level(Level::Warn as u8);
        set_callback(Some(count), 7 as *mut c_void);
        crate::fh_warn!("firehose: test {}", 1);
        crate::fh_error!("firehose: test {}", 2);
        crate::fh_info!("firehose: test {}", 3);
        assert_eq!(SEEN.load(Ordering::Relaxed), 2);
        set_level(0);
        crate::fh_error!("firehose: test 4");
        assert_eq!(SEEN.load(Ordering::Relaxed), 2);
        set_callback(None, std::ptr::null_mut());
        set_level(Level::Warn as u8);
    }
}
