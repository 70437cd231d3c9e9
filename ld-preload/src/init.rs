//! The constructor: runs once when the shim is loaded, before `main`.
//!
//! Cheap and thread-free on purpose: every child process inherits LD_PRELOAD, most never touch
//! verbs. Caches, the monitor and its userfaultfd thread start on the first registration.

extern "C" fn init() {
    let _ = std::panic::catch_unwind(|| {
        crate::real_libc::resolve();
        crate::settings::load();
        if crate::settings::disabled() {
            return;
        }
        crate::fork::install();
        if crate::settings::stats_fd().is_some() {
            // SAFETY: registering a function that never unwinds.
            unsafe { libc::atexit(crate::stats::print_at_exit) };
        }
    });
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;
