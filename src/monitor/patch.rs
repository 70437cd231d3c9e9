//! Entry patching of libc's own functions (x86_64): the first 5 bytes of each become
//! `jmp rel32` to a trampoline (`movabs $replacement, %r11; jmp *%r11`) on a page we map within
//! +-2 GiB of libc.
//!
//! Why the entry and not the symbol: glibc's free/realloc/malloc_trim call the internal aliases
//! (`__munmap`, `__mremap`, `__madvise`), which are the same code at the same address, so only a
//! patch of the code itself sees them. We resolve libc's own definitions through a handle on
//! libc.so.6 (not RTLD_DEFAULT, which could return an interposer such as another LD_PRELOAD shim).
//!
//! Why 5 bytes through a trampoline, written as one aligned 8-byte store: threads may be inside
//! these functions while we patch -- in particular parked in their `syscall` (munmap, madvise,
//! shmdt, shmat all start `mov $nr,%eax; syscall; cmp ...`). An earlier 13-byte absolute jump
//! overwrote the bytes after the `syscall`, so a thread returning from it ran garbage (seen: a
//! SIGSEGV in the hook tests under the test harness's threads). Now only the first instruction (5
//! bytes for those four) changes, and atomically: a thread sees the old or the new entry, never a
//! mix, and code after it is untouched. Residual window: in `mremap` and `mmap` the first
//! instruction is shorter than 5 bytes, so a thread that has executed exactly that instruction at
//! the instant of the store would decode a torn second one; there is no syscall in those bytes, so
//! the window is a few instructions wide and exists only while installing. An entry that is not
//! 8-byte aligned, or no free page within +-2 GiB, means "not patched" (userfaultfd still applies).
//! x86 keeps instruction caches coherent with stores.
//!
//! Patches are never undone, so the library they jump into must never be unmapped: it is linked
//! with `-z nodelete` (`build.rs`), and `dlclose` leaves it loaded (`c-tests/dlclose_patch.c`).
//! Installing runs under the monitor's install mutex, which the atfork handlers hold across `fork`
//! (`crate::rt::fork`), so a child never inherits an install half done.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::SeqCst};

use super::hooks::Hooked;
use super::options::MonitorStatus;
use super::switches;

static PATCHED: AtomicU32 = AtomicU32::new(0);
static FAILED: AtomicU32 = AtomicU32::new(0);
static UNSUPPORTED: AtomicU32 = AtomicU32::new(0);

pub(super) fn fill_status(s: &mut MonitorStatus) {
    s.patched = PATCHED.load(SeqCst);
    s.patch_failed = FAILED.load(SeqCst) & !s.patched;
    s.patch_unsupported = UNSUPPORTED.load(SeqCst) != 0;
}

/// Patch every hooked function not yet patched and not disabled. Called under the install mutex.
pub(super) fn install_hooks() {
    if !cfg!(target_arch = "x86_64") {
        UNSUPPORTED.store(1, SeqCst);
        return;
    }
    for h in Hooked::ALL {
        if PATCHED.load(SeqCst) & h.bit() != 0 || switches::disabled(h.bit()) {
            continue;
        }
        match patch_one(h) {
            Ok(()) => PATCHED.fetch_or(h.bit(), SeqCst),
            Err(()) => FAILED.fetch_or(h.bit(), SeqCst),
        };
    }
}

#[cfg(target_arch = "x86_64")]
fn patch_one(h: Hooked) -> Result<(), ()> {
    // SAFETY: RTLD_NOLOAD only returns a handle on the already loaded libc (never loads code).
    let handle =
        unsafe { libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
    if handle.is_null() {
        return Err(());
    }
    // SAFETY: symbol lookup on a valid handle; the handle stays open (libc is never unloaded).
    let sym = unsafe { libc::dlsym(handle, h.symbol().as_ptr()) } as usize;
    // SAFETY: drops the reference dlopen added; libc itself stays loaded.
    unsafe { libc::dlclose(handle) };
    if sym == 0 {
        return Err(());
    }
    if sym % 8 != 0 {
        return Err(()); // the 8-byte store would not be atomic
    }
    // Before the first patch is stored: from then on the entries tell libc's calls apart.
    super::caller::learn_libc_text(sym);
    let tramp = trampoline_near(sym, h.replacement())?;
    let jmp = jmp_rel32(sym, tramp).ok_or(())?;
    store_entry(sym, jmp)
}

/// Next free byte on the trampoline page, and the page itself (0 = not mapped yet). Only touched
/// under the install mutex.
static TRAMP_PAGE: AtomicUsize = AtomicUsize::new(0);
static TRAMP_USED: AtomicUsize = AtomicUsize::new(0);
const TRAMP_SLOT: usize = 16;

/// Write a `jump_to(target)` trampoline on a page within +-2 GiB of `near`; returns its address.
#[cfg(target_arch = "x86_64")]
fn trampoline_near(near: usize, target: usize) -> Result<usize, ()> {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let mut base = TRAMP_PAGE.load(SeqCst);
    if base == 0 {
        base = map_page_near(near, page).ok_or(())?;
        TRAMP_PAGE.store(base, SeqCst);
    }
    let used = TRAMP_USED.load(SeqCst);
    if used + TRAMP_SLOT > page || jmp_rel32(near, base + used).is_none() {
        return Err(());
    }
    let at = base + used;
    // Keep EXEC while adding a slot: threads may be running through the slots already patched in
    // (dropping it here crashed them). Nobody executes the new slot before its patch is stored.
    let rwx = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;
    // SAFETY: our own page.
    if unsafe { libc::mprotect(base as *mut _, page, rwx) } != 0 {
        return Err(());
    }
    let code = jump_to(target);
    // SAFETY: `at..at+13` lies in our page (checked above), which is now writable.
    unsafe { std::ptr::copy_nonoverlapping(code.as_ptr(), at as *mut u8, code.len()) };
    // SAFETY: back to read+execute on our own page.
    if unsafe { libc::mprotect(base as *mut _, page, libc::PROT_READ | libc::PROT_EXEC) } != 0 {
        return Err(());
    }
    TRAMP_USED.store(used + TRAMP_SLOT, SeqCst);
    Ok(at)
}

/// Map one private page at a free address 1 MiB, 2 MiB, ... below, then above, `near`.
#[cfg(target_arch = "x86_64")]
fn map_page_near(near: usize, page: usize) -> Option<usize> {
    let base = near & !(page - 1);
    for k in 1..1024usize {
        let delta = k << 20;
        for hint in [base.checked_sub(delta), base.checked_add(delta)]
            .into_iter()
            .flatten()
        {
            // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; fresh anonymous page.
            let p = unsafe {
                libc::mmap(
                    hint as *mut _,
                    page,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                continue;
            }
            if p as usize == hint {
                return Some(hint);
            }
            // An old kernel ignored NOREPLACE and put it elsewhere: give it back.
            // SAFETY: unmapping the page we just got.
            unsafe { libc::munmap(p, page) };
        }
    }
    None
}

/// `jmp rel32` (E9 disp32) at `from` to `to`, if in range.
pub(super) fn jmp_rel32(from: usize, to: usize) -> Option<[u8; 5]> {
    let disp = (to as i64).wrapping_sub(from as i64 + 5);
    let disp = i32::try_from(disp).ok()?;
    let mut c = [0xE9, 0, 0, 0, 0];
    c[1..5].copy_from_slice(&disp.to_le_bytes());
    Some(c)
}

/// Replace the first 5 bytes of the 8-byte-aligned entry `at` with `jmp`, in one atomic 8-byte
/// store (bytes 5..8 are written back unchanged).
fn store_entry(at: usize, jmp: [u8; 5]) -> Result<(), ()> {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let start = at & !(page - 1);
    let end = (at + 8 + page - 1) & !(page - 1);
    let rwx = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;
    // SAFETY: changes protection of libc's text pages, which are mapped (we just resolved a
    // symbol in them); other libc code on them keeps running (still executable).
    if unsafe { libc::mprotect(start as *mut _, end - start, rwx) } != 0 {
        return Err(());
    }
    // SAFETY: `at` is 8-aligned and its page is now writable; an aligned 8-byte access is a single
    // atomic operation on x86-64, so executing threads see the old or the new entry.
    let word = unsafe { AtomicU64::from_ptr(at as *mut u64) };
    let mut bytes = word.load(SeqCst).to_le_bytes();
    bytes[..5].copy_from_slice(&jmp);
    word.store(u64::from_le_bytes(bytes), SeqCst);
    // SAFETY: restores the text protection on the same pages. A failed restore leaves the page
    // writable, but the patch is in place and works.
    let _ = unsafe {
        libc::mprotect(
            start as *mut _,
            end - start,
            libc::PROT_READ | libc::PROT_EXEC,
        )
    };
    Ok(())
}

#[cfg(not(target_arch = "x86_64"))]
fn patch_one(_h: Hooked) -> Result<(), ()> {
    Err(())
}

/// `movabs $target, %r11` (49 BB imm64) then `jmp *%r11` (41 FF E3). r11 is a scratch register
/// in the SysV ABI that the caller never expects preserved, and it carries no argument.
pub(super) fn jump_to(target: usize) -> [u8; 13] {
    let mut c = [0u8; 13];
    c[0] = 0x49;
    c[1] = 0xBB;
    c[2..10].copy_from_slice(&(target as u64).to_le_bytes());
    c[10..13].copy_from_slice(&[0x41, 0xFF, 0xE3]);
    c
}

#[cfg(test)]
mod tests {
    #[test]
    fn jump_encoding() {
        let c = super::jump_to(0x1122_3344_5566_7788);
        assert_eq!(
            c,
            [0x49, 0xBB, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 0x41, 0xFF, 0xE3]
        );
    }

    #[test]
    fn rel32_encoding_and_range() {
        assert_eq!(super::jmp_rel32(0x1000, 0x1005), Some([0xE9, 0, 0, 0, 0]));
        assert_eq!(
            super::jmp_rel32(0x2000, 0x1000),
            Some([0xE9, 0xFB, 0xEF, 0xFF, 0xFF]) // -0x1005
        );
        assert_eq!(super::jmp_rel32(0, 1 << 32), None);
    }
}
