//! Replacement bodies for the patched libc functions.
//!
//! Each one tells the listeners which range is about to lose its pages ([`UnmapEvent::Before`]),
//! issues the system call itself (it never calls the original code, so no trampoline is needed),
//! and, when the call succeeded and some listener wants it, tells them again that the pages are
//! gone ([`UnmapEvent::Done`]) before returning; errors are reported the way glibc does: -1 /
//! MAP_FAILED with errno set. Nothing here allocates, locks or unwinds (these are `extern "C"`, so
//! a panicking listener aborts the process instead of unwinding into C).

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use libc::{c_int, c_long, c_void, off_t, size_t};

use super::caller::{self, by_caller};
use super::guard::notify_guarded;
use super::maps;
use super::ranges::{
    madvise_drops_pages, mmap_replaces, mremap_fresh, mremap_ranges, page_span, PAGE,
};
use super::registry::done_wanted;
use super::unmap_windows::{unmap_windows, UnmapWindows};
use crate::rt::seam::UnmapEvent;

/// The libc functions we patch; the discriminant is the bit in `MonitorStatus::patched`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Hooked {
    Munmap = 1,
    Mremap = 2,
    Madvise = 4,
    Mmap = 8,
    Shmdt = 16,
    Shmat = 32,
}

impl Hooked {
    pub const ALL: [Hooked; 6] = [
        Hooked::Munmap,
        Hooked::Mremap,
        Hooked::Madvise,
        Hooked::Mmap,
        Hooked::Shmdt,
        Hooked::Shmat,
    ];

    pub fn bit(self) -> u32 {
        self as u32
    }

    /// The exported libc symbol (also the name used by `FH_TEST_DISABLE_HOOKS`).
    pub fn name(self) -> &'static str {
        match self {
            Hooked::Munmap => "munmap",
            Hooked::Mremap => "mremap",
            Hooked::Madvise => "madvise",
            Hooked::Mmap => "mmap",
            Hooked::Shmdt => "shmdt",
            Hooked::Shmat => "shmat",
        }
    }

    pub(crate) fn symbol(self) -> &'static std::ffi::CStr {
        match self {
            Hooked::Munmap => c"munmap",
            Hooked::Mremap => c"mremap",
            Hooked::Madvise => c"madvise",
            Hooked::Mmap => c"mmap",
            Hooked::Shmdt => c"shmdt",
            Hooked::Shmat => c"shmat",
        }
    }

    /// Address of our replacement.
    pub(crate) fn replacement(self) -> usize {
        match self {
            Hooked::Munmap => fh_munmap as *const () as usize,
            Hooked::Mremap => fh_mremap as *const () as usize,
            Hooked::Madvise => fh_madvise as *const () as usize,
            Hooked::Mmap => fh_mmap as *const () as usize,
            Hooked::Shmdt => fh_shmdt as *const () as usize,
            Hooked::Shmat => fh_shmat as *const () as usize,
        }
    }
}

// The entries the patches jump to for the calls glibc makes when it trims a heap: each runs its
// body as libc's call or as anyone else's. (libc's mremap, shmdt and shmat never trim: their
// entries are the bodies themselves.)
by_caller!(fh_munmap, munmap_body, (addr: *mut c_void, len: size_t) -> c_int);
by_caller!(fh_madvise, madvise_body, (addr: *mut c_void, len: size_t, advice: c_int) -> c_int);
by_caller!(
    fh_mmap,
    mmap_body,
    (addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off_t)
        -> *mut c_void
);

fn errno_ptr() -> *mut c_int {
    // SAFETY: __errno_location always returns this thread's errno slot.
    unsafe { libc::__errno_location() }
}

/// Run listeners for a range without letting them disturb errno (callers of munmap & co. may
/// inspect errno of an earlier call, or of this one). Returns whether they ran (not on a thread
/// already inside a notification).
fn notify_ev(range: Option<(usize, usize)>, ev: UnmapEvent) -> bool {
    let Some((addr, len)) = range else {
        return false;
    };
    // SAFETY: errno slot of this thread (see errno_ptr).
    let saved = unsafe { *errno_ptr() };
    let ran = notify_guarded(addr, len, ev);
    // SAFETY: as above.
    unsafe { *errno_ptr() = saved };
    ran
}

/// The unmap window of one hooked call (`unmap_windows.rs`: the helper thread's unmap log): open
/// from before the listeners run until the hook returns (the guard is a local of the hook,
/// dropped after its system call and `done`). Opened before `notify`.
#[must_use]
struct Window(Option<(&'static UnmapWindows, u64)>);

impl Drop for Window {
    fn drop(&mut self) {
        if let Some((w, seq)) = self.0 {
            (w.end)(seq);
        }
    }
}

/// Opens the window, then lets the installed windows wait (the helpers' pins ahead of the same
/// memory), unless this is libc trimming a heap (`trim`: an arena mutex held).
fn window(range: Option<(usize, usize)>, trim: bool) -> Window {
    let (Some(w), Some((addr, len))) = (unmap_windows(), range) else {
        return Window(None);
    };
    let end = addr.saturating_add(len);
    let seq = (w.begin)(addr, end);
    if !trim {
        (w.before_unmap)(addr, end);
    }
    Window(Some((w, seq)))
}

/// Before the system call. Returns whether the listeners ran (then `done` may follow).
fn notify(range: Option<(usize, usize)>) -> bool {
    notify_ev(range, UnmapEvent::Before)
}

/// After the system call: if it succeeded and the listeners heard `Before` for this range, tell
/// the ones that want it that the pages are gone now, and whether this was libc trimming a heap
/// (`trim`: its own `madvise`, `mmap(MAP_FIXED)` or heap `munmap`, see `caller.rs`).
fn done(range: Option<(usize, usize)>, ran: bool, ok: bool, trim: bool) {
    if ran && ok && done_wanted() {
        let ev = if trim {
            UnmapEvent::DoneInLibcTrim
        } else {
            UnmapEvent::Done
        };
        notify_ev(range, ev);
    }
}

/// False only under the test switch `FH_TEST_DISABLE_HOOKS=fresh` (`switches.rs`).
static REPORT_FRESH: AtomicBool = AtomicBool::new(true);

pub(super) fn stop_reporting_fresh() {
    REPORT_FRESH.store(false, Relaxed);
}

pub(super) fn reports_fresh() -> bool {
    REPORT_FRESH.load(Relaxed)
}

/// After a successful call that handed out new addresses (`mmap` without MAP_FIXED, `mremap`
/// moving or growing): see [`UnmapEvent::Fresh`].
fn fresh(range: Option<(usize, usize)>) {
    if reports_fresh() {
        notify_ev(range, UnmapEvent::Fresh);
    }
}

fn fail_einval() {
    // SAFETY: as in errno_ptr.
    unsafe { *errno_ptr() = libc::EINVAL };
}

unsafe extern "C" fn munmap_body<const BY_LIBC: bool>(addr: *mut c_void, len: size_t) -> c_int {
    let range = page_span(addr as usize, len);
    let trim = BY_LIBC && caller::glibc_heap_block(addr as usize, len);
    let _w = window(range, trim);
    let ran = notify(range);
    // SAFETY: the caller's own munmap request, passed through unchanged.
    let r = unsafe { libc::syscall(libc::SYS_munmap, addr as c_long, len as c_long) as c_int };
    done(range, ran, r == 0, trim);
    r
}

unsafe extern "C" fn madvise_body<const BY_LIBC: bool>(
    addr: *mut c_void,
    len: size_t,
    advice: c_int,
) -> c_int {
    let range = if madvise_drops_pages(advice) {
        page_span(addr as usize, len)
    } else {
        None
    };
    let _w = window(range, BY_LIBC);
    let ran = notify(range);
    // SAFETY: pass-through of the caller's request.
    let r = unsafe {
        libc::syscall(
            libc::SYS_madvise,
            addr as c_long,
            len as c_long,
            advice as c_long,
        ) as c_int
    };
    done(range, ran, r == 0, BY_LIBC);
    r
}

/// `mremap` is variadic in C; on x86_64 the optional fifth argument travels in r8 like a normal
/// fifth argument, so a plain five-argument function receives it (garbage when not passed, and
/// then, like glibc, we do not forward it).
unsafe extern "C" fn fh_mremap(
    old: *mut c_void,
    old_size: size_t,
    new_size: size_t,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    // glibc rejects unknown flag bits itself (MAYMOVE|FIXED|DONTUNMAP = 7).
    if flags as u32 > 7 {
        fail_einval();
        return libc::MAP_FAILED;
    }
    const DONTUNMAP: c_int = 4;
    let new_addr = if flags & (libc::MREMAP_FIXED | DONTUNMAP) != 0 {
        new_addr as usize
    } else {
        0
    };
    let ranges = mremap_ranges(old as usize, old_size, new_size, flags, new_addr);
    // (Both ranges are logged until the call returns.)
    let _w = ranges.map(|r| window(r, false));
    let ran = ranges.map(notify);
    // SAFETY: pass-through of the caller's request.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mremap,
            old as c_long,
            old_size as c_long,
            new_size as c_long,
            flags as c_long,
            new_addr as c_long,
        ) as *mut c_void
    };
    for (range, ran) in ranges.into_iter().zip(ran) {
        done(range, ran, r != libc::MAP_FAILED, false);
    }
    if r != libc::MAP_FAILED {
        fresh(mremap_fresh(
            old as usize,
            old_size,
            new_size,
            flags,
            r as usize,
        ));
    }
    r
}

unsafe extern "C" fn mmap_body<const BY_LIBC: bool>(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    // glibc checks the offset before the call; keep that (the listener must not run for a call
    // that cannot succeed... although running it would only cost a spurious invalidation).
    if off & (PAGE as off_t - 1) != 0 {
        fail_einval();
        return libc::MAP_FAILED;
    }
    let range = mmap_replaces(addr as usize, len, flags);
    let _w = window(range, BY_LIBC);
    let ran = notify(range);
    // SAFETY: pass-through of the caller's request.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mmap,
            addr as c_long,
            len as c_long,
            prot as c_long,
            flags as c_long,
            fd as c_long,
            off as c_long,
        ) as *mut c_void
    };
    done(range, ran, r != libc::MAP_FAILED, BY_LIBC);
    if range.is_none() && r != libc::MAP_FAILED {
        fresh(page_span(r as usize, len));
    }
    r
}

/// Extent of the SysV segment attached at `addr`: the mapping that starts there plus contiguous
/// mappings of the same segment (mprotect may have split it). Read from /proc/self/maps without
/// allocating.
fn shm_extent(addr: usize) -> Option<(usize, usize)> {
    let mut first: Option<maps::Vma> = None;
    let mut end = 0usize;
    maps::for_each_vma(|v| match first {
        None if v.start == addr && v.sysv_shm => {
            first = Some(*v);
            end = v.end;
            true
        }
        None => v.start < addr,
        Some(f) if v.start == end && v.sysv_shm && v.inode == f.inode => {
            end = v.end;
            true
        }
        Some(_) => false,
    });
    first.map(|f| (f.start, end - f.start))
}

unsafe extern "C" fn fh_shmdt(addr: *const c_void) -> c_int {
    // Also when nested (a signal handler's shmdt during a hook): the guard delivers it later.
    let range = shm_extent(addr as usize);
    let _w = window(range, false);
    let ran = notify(range);
    // SAFETY: pass-through of the caller's request.
    let r = unsafe { libc::syscall(libc::SYS_shmdt, addr as c_long) as c_int };
    done(range, ran, r == 0, false);
    r
}

unsafe extern "C" fn fh_shmat(id: c_int, addr: *const c_void, flags: c_int) -> *mut c_void {
    let mut range = None;
    if flags & libc::SHM_REMAP != 0 && !addr.is_null() {
        let mut ds: libc::shmid_ds = unsafe { std::mem::zeroed() };
        // SAFETY: IPC_STAT fills the stack struct we own; a raw syscall, no allocation.
        let r = unsafe {
            libc::syscall(
                libc::SYS_shmctl,
                id as c_long,
                libc::IPC_STAT as c_long,
                &mut ds as *mut _,
            )
        };
        if r == 0 {
            let mut at = addr as usize;
            if flags & libc::SHM_RND != 0 {
                at &= !(PAGE - 1); // SHMLBA is the page size on x86_64
            }
            range = page_span(at, ds.shm_segsz);
        }
    }
    let _w = window(range, false);
    let ran = notify(range);
    // SAFETY: pass-through of the caller's request.
    let r = unsafe {
        libc::syscall(
            libc::SYS_shmat,
            id as c_long,
            addr as c_long,
            flags as c_long,
        ) as *mut c_void
    };
    done(range, ran, r as isize != -1, false);
    r
}
