//! Who called a patched function: the C library itself, or anyone else.
//!
//! glibc calls `munmap`/`madvise`/`mmap` from inside `free`, `realloc`, `malloc_trim` and thread
//! exit, and trims a heap with a malloc arena's mutex held. A listener that waits in
//! [`UnmapEvent::DoneInLibcTrim`](crate::rt::seam::UnmapEvent::DoneInLibcTrim) for another thread
//! (the revoke worker) must know that, because that thread may need the same mutex for its next
//! `malloc`.
//!
//! Which of libc's calls are trims: its `madvise(MADV_DONTNEED)` (`malloc_trim`, and shrinking a
//! secondary arena's heap) and `mmap(MAP_FIXED)` (shrinking a heap when overcommit is strict),
//! and its `munmap` of a whole secondary-arena heap ([`glibc_heap_block`]). Its other `munmap`s
//! and `mremap`s free or resize an mmapped chunk (`free`, `realloc`) and hold no lock; `madvise`
//! at thread exit (the dead thread's stack) holds none either, but is rare enough to be counted
//! with the trims.
//!
//! How: the entries of the patched `munmap`, `madvise` and `mmap` ([`by_caller!`]; the other
//! hooked functions never trim) are naked stubs that compares its return address with
//! libc's code segment and jumps to one of two instantiations of the hook's body. It uses the
//! stack as it found it and touches only r11 and the flags, which no caller expects preserved
//! across a call and which carry no argument, so the body returns straight to the caller. A
//! call glibc makes as a tail call returns into its own caller (the application, for a `free`
//! that ends in `munmap`); that counts as the application's, which is right: a function that
//! still holds a lock cannot tail-call, since it must unlock after the call returns.
//!
//! Without naked functions (Rust < 1.88) every call counts as the application's, as before this
//! existed. Only x86_64 is patched at all (`patch.rs`).

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

/// libc's executable segment, `[LO, HI)`; both 0 (nothing matches) until learned. The stubs read
/// them with plain loads (an aligned word: no tearing).
pub(super) static LIBC_TEXT_LO: AtomicUsize = AtomicUsize::new(0);
pub(super) static LIBC_TEXT_HI: AtomicUsize = AtomicUsize::new(0);

/// Learns libc's executable segment from the address of one of its functions. Called under the
/// monitor's install mutex before the first patch is stored; later calls do nothing.
pub(super) fn learn_libc_text(libc_fn: usize) {
    if LIBC_TEXT_HI.load(SeqCst) != 0 {
        return;
    }
    if let Some((lo, hi)) = exec_segment_of(libc_fn) {
        LIBC_TEXT_LO.store(lo, SeqCst);
        LIBC_TEXT_HI.store(hi, SeqCst);
    }
}

/// The smallest glibc secondary-arena heap: `heap_max_size()` is `HEAP_MAX_SIZE` (64 MiB on
/// 64-bit) by default, and 4 huge pages with `GLIBC_TUNABLES=glibc.malloc.hugetlb=2` (glibc 2.35+:
/// 8 MiB with 2 MiB pages, 4 GiB with 1 GiB pages). Heaps are aligned to their size.
const GLIBC_HEAP_MIN: usize = 8 << 20;

/// Whether `[addr, addr + len)` looks like a whole glibc heap, which glibc deletes by unmapping
/// exactly that block under the arena's mutex: a power of two of at least 8 MiB, aligned to its
/// size. An `mmap`ped chunk of exactly such a size at such an alignment would be taken for one
/// too, which costs nothing unless the revoke worker also stops turning (then that `free` stops
/// waiting at `FH_REVOKE_STALL`).
pub(super) fn glibc_heap_block(addr: usize, len: usize) -> bool {
    len >= GLIBC_HEAP_MIN && len.is_power_of_two() && addr & (len - 1) == 0
}

/// Whether the hooks tell libc's own calls apart in this build and process (naked functions, and
/// libc's code segment found when the first patch was installed).
#[cfg(any(test, feature = "test-support"))]
pub fn tells_libc_apart() -> bool {
    cfg!(all(fh_naked, target_arch = "x86_64")) && LIBC_TEXT_HI.load(SeqCst) != 0
}

/// The executable `PT_LOAD` segment of the loaded object that contains `addr`.
fn exec_segment_of(addr: usize) -> Option<(usize, usize)> {
    struct Find {
        addr: usize,
        found: Option<(usize, usize)>,
    }
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: `data` is the `Find` passed below; `info` and its program headers are valid
        // for this callback (dl_iterate_phdr's contract).
        let (f, info) = unsafe { (&mut *(data as *mut Find), &*info) };
        if info.dlpi_phdr.is_null() {
            return 0;
        }
        // SAFETY: as above: `dlpi_phnum` headers at `dlpi_phdr`.
        let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
        for ph in phdrs {
            if ph.p_type != libc::PT_LOAD || ph.p_flags & libc::PF_X == 0 {
                continue;
            }
            let lo = (info.dlpi_addr as usize).wrapping_add(ph.p_vaddr as usize);
            let hi = lo.saturating_add(ph.p_memsz as usize);
            if (lo..hi).contains(&f.addr) {
                f.found = Some((lo, hi));
                return 1;
            }
        }
        0
    }
    let mut f = Find { addr, found: None };
    // SAFETY: the callback only reads what dl_iterate_phdr hands it and writes `f`.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut f as *mut Find as *mut libc::c_void) };
    f.found
}

/// `by_caller!(entry, body, (args...) -> ret)`: defines `entry`, which runs `body::<true>` when
/// called from libc's code and `body::<false>` otherwise, with the same arguments and return.
#[cfg(all(fh_naked, target_arch = "x86_64"))]
macro_rules! by_caller {
    ($entry:ident, $body:ident, ($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        /// Entry of the patched function: dispatches on the caller (`caller.rs`).
        #[unsafe(naked)]
        pub(super) unsafe extern "C" fn $entry($($arg: $ty),*) -> $ret {
            core::arch::naked_asm!(
                "mov r11, qword ptr [rsp]",
                "cmp r11, qword ptr [rip + {lo}]",
                "jb 2f",
                "cmp r11, qword ptr [rip + {hi}]",
                "jae 2f",
                "jmp {libc}",
                "2:",
                "jmp {app}",
                lo = sym $crate::monitor::caller::LIBC_TEXT_LO,
                hi = sym $crate::monitor::caller::LIBC_TEXT_HI,
                libc = sym $body::<true>,
                app = sym $body::<false>,
            )
        }
    };
}
#[cfg(not(all(fh_naked, target_arch = "x86_64")))]
macro_rules! by_caller {
    ($entry:ident, $body:ident, ($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        /// Entry of the patched function (every caller counts as the application: `caller.rs`).
        pub(super) unsafe extern "C" fn $entry($($arg: $ty),*) -> $ret {
            // SAFETY: the caller's contract is the body's.
            unsafe { $body::<false>($($arg),*) }
        }
    };
}
pub(super) use by_caller;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_libc_text_and_not_ours() {
        let munmap = libc::munmap as *const () as usize;
        let (lo, hi) = exec_segment_of(munmap).expect("libc's munmap is in a loaded object");
        assert!(lo <= munmap && munmap < hi);
        let ours = finds_libc_text_and_not_ours as *const () as usize;
        assert!(!(lo..hi).contains(&ours), "this test's code is not libc's");
        assert_eq!(exec_segment_of(0), None);
    }

    #[test]
    fn heap_blocks() {
        assert!(glibc_heap_block(0x7f00_0000_0000, 64 << 20));
        assert!(
            glibc_heap_block(0x7f04_6480_0000, 8 << 20),
            "hugetlb=2, 2 MiB pages"
        );
        assert!(
            glibc_heap_block(0x7f00_0000_0000, 4 << 30),
            "hugetlb=2, 1 GiB pages"
        );
        assert!(!glibc_heap_block(0x7f00_0000_1000, 64 << 20), "unaligned");
        assert!(
            !glibc_heap_block(0x7f04_6440_0000, 8 << 20),
            "aligned to 4 MiB only"
        );
        assert!(!glibc_heap_block(0x7f00_0000_0000, 4 << 20), "too small");
        assert!(
            !glibc_heap_block(0x7f00_0000_0000, 48 << 20),
            "not a power of two"
        );
    }
}
