//! Unmap events from the library that owns libc's entries, when it is not us.
//!
//! Where UCX's libucm or Open MPI's libopen-pal is loaded, the shim leaves libc's code to them
//! (`coexist.rs`), and userfaultfd alone would tell the caches of unmaps: after the fact, and not
//! at all where a seccomp profile refuses userfaultfd. Both libraries let another one subscribe
//! to the unmaps their own patches see, synchronously and before the pages go:
//!
//! - libucm: `ucm_set_event_handler(UCM_EVENT_VM_UNMAPPED, ...)` (UCX's `ucm/api/ucm.h`: the
//!   callback runs before munmap, mremap, shmdt, madvise and brk shrink, and must not allocate).
//!   Setting a handler makes libucm install its hooks if nothing had asked for them yet; where
//!   its hooks are off (`UCX_MEM_EVENTS=no`) the call fails and nothing is subscribed.
//! - libopen-pal: `opal_mem_hooks_register_release` (Open MPI's `opal/memoryhooks/memory.h`),
//!   only when `opal_mem_hooks_support_level()` says its hooks see munmap.
//!
//! The callbacks hand the range to `monitor::notify_unmapped` (no allocation, no lock), which
//! every cache hears. Userfaultfd stays on as the safety net. Both libraries are found with
//! `dlopen(RTLD_NOLOAD)`, so nothing is loaded and a program without them pays nothing; the
//! subscription is tried again whenever a new protection domain's cache is made, since MPI
//! usually loads UCX (by `dlopen`) after the process started.
//!
//! `FH_TEST_DISABLE_HOOKS=foreign` turns this off (tests that prove it matters).

use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// libucm's events were subscribed to.
pub(crate) const SRC_UCM: u32 = 1;
/// libopen-pal's release hooks were subscribed to.
pub(crate) const SRC_OPAL: u32 = 2;
/// libucm's VM_MAPPED events too (with `SRC_UCM`).
pub(crate) const SRC_UCM_MAPPED: u32 = 4;

/// `UCM_EVENT_VM_UNMAPPED` (`UCS_BIT(17)`).
const UCM_EVENT_VM_UNMAPPED: c_int = 1 << 17;
/// `UCM_EVENT_VM_MAPPED` (`UCS_BIT(16)`): after mmap, mremap, shmat and sbrk hand out addresses.
/// A registration found there is of pages some raw unmap took away before its userfaultfd event
/// was read (see `firehose::internals::monitor`'s `UnmapEvent::Fresh`, what our own patches report).
const UCM_EVENT_VM_MAPPED: c_int = 1 << 16;
/// libopen-pal's `OPAL_MEMORY_MUNMAP_SUPPORT`: its hooks see munmap (so `free`'s unmaps too).
const OPAL_MEMORY_MUNMAP_SUPPORT: c_int = 2;

type UcmCallback = unsafe extern "C" fn(c_int, *mut c_void, *mut c_void);
type UcmSetHandler = unsafe extern "C" fn(c_int, c_int, UcmCallback, *mut c_void) -> c_int;
type OpalCallback = unsafe extern "C" fn(*mut c_void, usize, *mut c_void, bool);
type OpalRegister = unsafe extern "C" fn(OpalCallback, *mut c_void) -> c_int;
type OpalLevel = unsafe extern "C" fn() -> c_int;

static LIVE: AtomicU32 = AtomicU32::new(0);
/// Events heard so far, for `FH_STATS`: libucm's unmapped and mapped, libopen-pal's releases.
static HEARD: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];

/// Events heard so far: (libucm VM_UNMAPPED, libucm VM_MAPPED, libopen-pal releases).
pub(crate) fn heard() -> (u64, u64, u64) {
    let n = |i: usize| HEARD[i].load(Ordering::Relaxed);
    (n(0), n(1), n(2))
}
/// One subscriber at a time (a second thread just skips: the first one does the work).
static BUSY: AtomicBool = AtomicBool::new(false);

/// Sources subscribed to so far (`SRC_*` bits).
pub(crate) fn live() -> u32 {
    LIVE.load(Ordering::Acquire)
}

/// Subscribe to whichever of libucm and libopen-pal is loaded and not subscribed yet. Normal
/// context only (it may make libucm install its hooks). Returns the live sources.
pub(crate) fn subscribe() -> u32 {
    if disabled() || BUSY.swap(true, Ordering::AcqRel) {
        return live();
    }
    let mut got = live();
    if got & SRC_UCM == 0 {
        got |= subscribe_ucm();
    }
    if got & SRC_OPAL == 0 && subscribe_opal() {
        got |= SRC_OPAL;
    }
    LIVE.store(got, Ordering::Release);
    BUSY.store(false, Ordering::Release);
    got
}

fn disabled() -> bool {
    std::env::var("FH_TEST_DISABLE_HOOKS")
        .is_ok_and(|v| v.split(',').any(|w| w.trim() == "foreign"))
}

/// `name`'s `sym` if `name` is loaded now (nothing is loaded by asking).
fn symbol(name: &CStr, sym: &CStr) -> Option<*mut c_void> {
    // SAFETY: RTLD_NOLOAD never loads anything; the handle is released at once (the library stays
    // loaded: it was before we asked), and a symbol of a loaded library stays valid with it.
    unsafe {
        let h = libc::dlopen(name.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY);
        if h.is_null() {
            return None;
        }
        let p = libc::dlsym(h, sym.as_ptr());
        libc::dlclose(h);
        (!p.is_null()).then_some(p)
    }
}

fn subscribe_ucm() -> u32 {
    let Some(f) = symbol(c"libucm.so.0", c"ucm_set_event_handler") else {
        return 0;
    };
    // SAFETY: the symbol is libucm's `ucm_set_event_handler`, whose C signature this type is;
    // the callback lives as long as the process (this library is never unloaded).
    unsafe {
        let set: UcmSetHandler = std::mem::transmute(f);
        let both = UCM_EVENT_VM_UNMAPPED | UCM_EVENT_VM_MAPPED;
        if set(both, 0, on_ucm, std::ptr::null_mut()) == 0 {
            SRC_UCM | SRC_UCM_MAPPED // UCS_OK
        } else if set(UCM_EVENT_VM_UNMAPPED, 0, on_ucm, std::ptr::null_mut()) == 0 {
            SRC_UCM // a libucm that cannot hook the mapping side: the unmaps alone
        } else {
            0
        }
    }
}

fn subscribe_opal() -> bool {
    let (Some(level), Some(reg)) = (
        symbol(c"libopen-pal.so.40", c"opal_mem_hooks_support_level"),
        symbol(c"libopen-pal.so.40", c"opal_mem_hooks_register_release"),
    ) else {
        return false;
    };
    // SAFETY: libopen-pal's own functions with these C signatures; the callback lives as long as
    // the process.
    unsafe {
        let level: OpalLevel = std::mem::transmute(level);
        if level() & OPAL_MEMORY_MUNMAP_SUPPORT == 0 {
            return false;
        }
        let reg: OpalRegister = std::mem::transmute(reg);
        reg(on_opal, std::ptr::null_mut()) == 0 // OPAL_SUCCESS
    }
}

/// libucm's callback: `event` points at `ucm_event_t`, whose `vm_unmapped` and `vm_mapped`
/// members are both `{ void *address; size_t size; }` at its start. Either way the range's
/// registrations go: before an unmap, or after new memory was mapped there.
unsafe extern "C" fn on_ucm(event_type: c_int, event: *mut c_void, _arg: *mut c_void) {
    if event.is_null() {
        return;
    }
    HEARD[usize::from(event_type == UCM_EVENT_VM_MAPPED)].fetch_add(1, Ordering::Relaxed);
    // SAFETY: libucm passes a valid event; for VM_UNMAPPED its first two words are the range.
    let (addr, len) = unsafe {
        let w = event as *const usize;
        (*w, *w.add(1))
    };
    firehose::internals::monitor::notify_unmapped(addr, len);
}

/// libopen-pal's release callback: the range is about to be released.
unsafe extern "C" fn on_opal(buf: *mut c_void, len: usize, _cbdata: *mut c_void, _alloc: bool) {
    HEARD[2].fetch_add(1, Ordering::Relaxed);
    firehose::internals::monitor::notify_unmapped(buf as usize, len);
}

/// For `FH_STATS`: the live sources by name.
pub(crate) fn describe(bits: u32) -> String {
    let mut v = Vec::new();
    if bits & SRC_UCM_MAPPED != 0 {
        v.push("UCX libucm VM_UNMAPPED and VM_MAPPED events");
    } else if bits & SRC_UCM != 0 {
        v.push("UCX libucm VM_UNMAPPED events");
    }
    if bits & SRC_OPAL != 0 {
        v.push("Open MPI release hooks");
    }
    v.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    /// Remembers the last range it was told of.
    struct Seen(AtomicUsize, AtomicUsize);

    impl firehose::internals::monitor::MemoryListener for Seen {
        fn on_unmap(&self, addr: usize, len: usize) {
            self.0.store(addr, Ordering::SeqCst);
            self.1.store(len, Ordering::SeqCst);
        }
    }

    /// The child half of `libucm_events_reach_the_caches`, in a process of its own (libucm patches
    /// libc's entries for good): load libucm as MPI would, subscribe, unmap a mapping through
    /// libc. Prints what a listener saw.
    #[test]
    fn libucm_child() {
        if std::env::var("FH_UCM_CHILD").is_err() {
            return; // only as the child of the test below
        }
        // SAFETY: loading a system library; its constructors run as under MPI. libucs brings
        // libucm (which needs libucs's symbols), as UCX's libucp does.
        let h =
            unsafe { libc::dlopen(c"libucs.so.0".as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        assert!(
            !h.is_null(),
            "libucs.so.0 (Debian's libucx0) is not installed"
        );
        let seen = Arc::new(Seen(AtomicUsize::new(0), AtomicUsize::new(0)));
        let _sub = firehose::internals::monitor::subscribe(seen.clone());
        let got = subscribe();
        // libc's own munmap: in this test binary `munmap` resolves to the shim's exported hook
        // (`unmap_hooks.rs`), which would tell the listener itself.
        let libc_munmap = symbol(c"libc.so.6", c"munmap").expect("libc's munmap");
        // SAFETY: a fresh private mapping, unmapped through libc's own munmap (whose entry
        // libucm patched, when it installed its hooks).
        let p = unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                64 << 10,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            // (This mmap resolved to the shim's exported one, which reported the new range.)
            seen.0.store(0, Ordering::SeqCst);
            seen.1.store(0, Ordering::SeqCst);
            let real: unsafe extern "C" fn(*mut c_void, usize) -> c_int =
                std::mem::transmute(libc_munmap);
            assert_eq!(real(p, 64 << 10), 0);
            p as usize
        };
        let (a, l) = (seen.0.load(Ordering::SeqCst), seen.1.load(Ordering::SeqCst));
        let covered = a <= p && p + (64 << 10) <= a + l;
        // And a new mapping through libc's own mmap (VM_MAPPED): its range is reported.
        seen.0.store(0, Ordering::SeqCst);
        seen.1.store(0, Ordering::SeqCst);
        let libc_mmap = symbol(c"libc.so.6", c"mmap").expect("libc's mmap");
        type Mmap =
            unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, c_int, i64) -> *mut c_void;
        // SAFETY: libc's mmap, a fresh private mapping (left mapped: the child exits).
        let q = unsafe {
            let real: Mmap = std::mem::transmute(libc_mmap);
            let rw = libc::PROT_READ | libc::PROT_WRITE;
            let q = real(
                std::ptr::null_mut(),
                64 << 10,
                rw,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(q, libc::MAP_FAILED);
            q as usize
        };
        let (a, l) = (seen.0.load(Ordering::SeqCst), seen.1.load(Ordering::SeqCst));
        let mapped = a <= q && q + (64 << 10) <= a + l;
        println!("FH_UCM_RESULT live={got} covered={covered} mapped={mapped}");
    }

    fn run_child(extra: &[(&str, &str)]) -> String {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "foreign_events::tests::libucm_child",
                "--nocapture",
            ])
            .env("FH_UCM_CHILD", "1")
            .envs(extra.iter().copied())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "child failed: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    }

    /// With libucm loaded (as Open MPI's UCX component loads it), its VM_UNMAPPED events reach
    /// every subscribed listener before a munmap returns, and its VM_MAPPED events after an mmap
    /// returns (`live=5`: both kinds subscribed); with the subscription turned off
    /// (`FH_TEST_DISABLE_HOOKS=foreign`) nothing does: the events come from the subscription.
    #[test]
    fn libucm_events_reach_the_caches() {
        let on = run_child(&[]);
        assert!(
            on.contains("FH_UCM_RESULT live=5 covered=true mapped=true"),
            "{on}"
        );
        let off = run_child(&[("FH_TEST_DISABLE_HOOKS", "foreign")]);
        assert!(
            off.contains("FH_UCM_RESULT live=0 covered=false mapped=false"),
            "{off}"
        );
    }

    /// Without either library loaded nothing is subscribed, and nothing gets loaded by trying.
    #[test]
    fn nothing_without_the_libraries() {
        assert_eq!(subscribe() & (SRC_UCM | SRC_OPAL), 0);
        assert!(symbol(c"libucm.so.0", c"ucm_set_event_handler").is_none());
        assert_eq!(describe(0), "");
        assert_eq!(
            describe(SRC_UCM | SRC_OPAL),
            "UCX libucm VM_UNMAPPED events, Open MPI release hooks"
        );
        assert_eq!(
            describe(SRC_UCM | SRC_UCM_MAPPED),
            "UCX libucm VM_UNMAPPED and VM_MAPPED events"
        );
    }
}
