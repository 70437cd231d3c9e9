//! An unmap made by a signal handler that interrupted a thread while it was running the
//! listeners of another hooked call is reported (after them). Before, it never was.
//!
//! The re-entrancy guard (`monitor::guard::notify_guarded`, one per-thread flag) dropped *every*
//! notification made while the flag is up -- meant for a listener that itself frees memory. A
//! signal handler that runs on that thread during the listeners (an asynchronous signal arriving
//! inside any `munmap`/`free`/`madvise` of the application, or during a revoke listener's
//! `Done` wait of up to `FH_REVOKE_TIMEOUT`) and released memory was dropped too: no cache, no
//! helper, no revoke listener heard of it, and with userfaultfd off (or the range not watched)
//! nothing else ever did, so a registration of that range stayed a hit after the pages changed.
//!
//! Here the "asynchronous" signal is made deterministic: a listener raises SIGUSR1 while it
//! handles a trigger unmap; the handler `munmap`s another mapping.

mod monitor_util;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

use firehose::monitor::{self, MemoryListener, MonitorOptions};
use monitor_util::{map, Recorder, PAGE};

static TRIGGER: AtomicUsize = AtomicUsize::new(0);
static VICTIM: AtomicUsize = AtomicUsize::new(0);
const VICTIM_LEN: usize = 5 * PAGE;
const TRIGGER_LEN: usize = 3 * PAGE;

extern "C" fn on_sigusr1(_: libc::c_int) {
    let v = VICTIM.load(SeqCst);
    if v != 0 {
        // SAFETY: the test's own mapping; munmap is a plain system call.
        unsafe { libc::munmap(v as *mut _, VICTIM_LEN) };
    }
}

/// Raises the signal while it handles the trigger unmap: the signal "arrives" during a hook.
struct Raiser;

impl MemoryListener for Raiser {
    fn on_unmap(&self, addr: usize, len: usize) {
        if addr == TRIGGER.load(SeqCst) && len == TRIGGER_LEN {
            // SAFETY: delivered to this thread before raise returns; the handler only munmaps.
            unsafe { libc::raise(libc::SIGUSR1) };
        }
    }
}

#[test]
fn unmap_in_a_signal_handler_during_a_hook_is_reported() {
    let st = monitor::install(MonitorOptions {
        patch_libc: true,
        userfaultfd: false,
    });
    assert!(st.patched & monitor::Hooked::Munmap.bit() != 0, "{st:?}");
    // SAFETY: installing a handler that only calls munmap.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigusr1 as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    let rec = Recorder::new();
    let _rec_sub = monitor::subscribe(rec.clone());
    let _raiser_sub = monitor::subscribe(Arc::new(Raiser));

    // Control: the same munmap from the handler, outside any hook, is reported.
    let v = map(VICTIM_LEN);
    VICTIM.store(v, SeqCst);
    rec.clear(); // (the mmap reported its new range)
                 // SAFETY: raising to ourselves; the handler unmaps `v`.
    unsafe { libc::raise(libc::SIGUSR1) };
    assert!(rec.saw_cover(v, VICTIM_LEN), "control: handler munmap seen");
    rec.clear();

    // The signal arrives while this thread runs the listeners of another munmap.
    let v = map(VICTIM_LEN);
    VICTIM.store(v, SeqCst);
    let t = map(TRIGGER_LEN);
    TRIGGER.store(t, SeqCst);
    rec.clear(); // (the mmaps reported their new ranges)
                 // SAFETY: our mapping.
    assert_eq!(unsafe { libc::munmap(t as *mut _, TRIGGER_LEN) }, 0);
    assert!(rec.saw_cover(t, TRIGGER_LEN), "trigger seen");
    VICTIM.store(0, SeqCst);
    assert!(
        rec.saw_cover(v, VICTIM_LEN),
        "the handler's munmap of {v:#x}+{VICTIM_LEN:#x} (made while a hook's listeners ran) \
         reached no listener"
    );
}
