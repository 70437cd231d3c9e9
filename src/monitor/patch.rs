//! Entry patching of libc's own functions (x86_64): overwrite the first 13 bytes with
//! `movabs $replacement, %r11; jmp *%r11`.
//!
//! Why the entry and not the symbol: glibc's free/realloc/malloc_trim call the internal aliases
//! (`__munmap`, `__mremap`, `__madvise`), which are the same code at the same address, so only a
//! patch of the code itself sees them. We resolve libc's own definitions through a handle on
//! libc.so.6 (not RTLD_DEFAULT, which could return an interposer such as another LD_PRELOAD shim).
//!
//! Race: the 13 bytes are not written atomically. A thread that is executing the first bytes of
//! one of these functions while we write could run a torn instruction. Install before other
//! threads start (library constructor / first init). x86 keeps instruction caches coherent; a
//! thread that already decoded the old bytes finishes the old (correct) function.

use std::sync::atomic::{AtomicU32, Ordering::SeqCst};

use super::hooks::Hooked;
use super::switches;
use super::MonitorStatus;

static PATCHED: AtomicU32 = AtomicU32::new(0);
static FAILED: AtomicU32 = AtomicU32::new(0);
static UNSUPPORTED: AtomicU32 = AtomicU32::new(0);

pub fn fill_status(s: &mut MonitorStatus) {
    s.patched = PATCHED.load(SeqCst);
    s.patch_failed = FAILED.load(SeqCst) & !s.patched;
    s.patch_unsupported = UNSUPPORTED.load(SeqCst) != 0;
}

/// Patch every hooked function not yet patched and not disabled. Called under the install mutex.
pub fn install_hooks() {
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
    let code = jump_to(h.replacement());
    write_code(sym, &code)
}

#[cfg(not(target_arch = "x86_64"))]
fn patch_one(_h: Hooked) -> Result<(), ()> {
    Err(())
}

/// `movabs $target, %r11` (49 BB imm64) then `jmp *%r11` (41 FF E3). r11 is a scratch register
/// in the SysV ABI that the caller never expects preserved, and it carries no argument.
pub fn jump_to(target: usize) -> [u8; 13] {
    let mut c = [0u8; 13];
    c[0] = 0x49;
    c[1] = 0xBB;
    c[2..10].copy_from_slice(&(target as u64).to_le_bytes());
    c[10..13].copy_from_slice(&[0x41, 0xFF, 0xE3]);
    c
}

/// Make the page(s) under `at..at+code.len()` writable (keeping them executable: other libc code
/// on the same page keeps running meanwhile), copy, and restore read+execute.
fn write_code(at: usize, code: &[u8]) -> Result<(), ()> {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let start = at & !(page - 1);
    let end = (at + code.len() + page - 1) & !(page - 1);
    let rwx = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;
    // SAFETY: changes protection of libc's text pages, which are mapped (we just resolved a
    // symbol in them); no memory is unmapped or moved.
    if unsafe { libc::mprotect(start as *mut _, end - start, rwx) } != 0 {
        return Err(());
    }
    // SAFETY: the range is now writable and belongs to the function entry we own the patch of;
    // the write races only with threads entering that function (documented above).
    unsafe { std::ptr::copy_nonoverlapping(code.as_ptr(), at as *mut u8, code.len()) };
    // SAFETY: restores the text protection on the same pages.
    let r = unsafe {
        libc::mprotect(
            start as *mut _,
            end - start,
            libc::PROT_READ | libc::PROT_EXEC,
        )
    };
    // A failed restore leaves the page writable but the patch is in place and works.
    let _ = r;
    Ok(())
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
}
