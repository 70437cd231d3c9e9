//! Exported libc unmap-family functions: tell the monitor first, then call the next definition
//! (and, for `mmap`/`mremap`, tell it again of the new addresses they hand out).
//!
//! Mostly a second net: the monitor patches libc's own entries (which also catches glibc-internal
//! calls from free/realloc) and reads userfaultfd events. These exports work even where patching is
//! impossible and before the monitor is installed. They notify *before* the call, so an
//! invalidation is never later than the release of the pages; a call that then fails only costs a
//! spurious invalidation. Hook context: no allocation, no lock, no verbs.

use std::ffi::{c_int, c_void};

use firehose::internals::monitor::{madvise_drops_pages, mmap_replaces, mremap_fresh};

use crate::{real_libc, settings};

/// Report `[addr, addr + len)` as going away (unless invalidation is switched off).
fn notify(addr: usize, len: usize) {
    if len != 0 && settings::invalidation_enabled() {
        firehose::internals::monitor::notify_unmapped(addr, len);
    }
}

/// Extent of the mapping that starts at `addr` (page-wise `mincore` probe, allocation-free; it
/// may run into an adjacent mapping, which only widens the invalidation).
fn mapped_extent(addr: usize) -> usize {
    const CHUNK_PAGES: usize = 256;
    const MAX_BYTES: usize = 1 << 36;
    let page = 4096usize;
    let mut vec = [0u8; CHUNK_PAGES];
    let mut len = 0usize;
    let mut step = CHUNK_PAGES;
    while len < MAX_BYTES {
        // SAFETY: mincore only inspects the page tables of our own address space and writes at
        // most `step <= CHUNK_PAGES` bytes into `vec`.
        let r = unsafe {
            libc::mincore(
                (addr + len) as *mut c_void,
                step * page,
                vec.as_mut_ptr() as *mut _,
            )
        };
        if r == 0 {
            len += step * page;
        } else if step > 1 {
            step = 1; // the end is within this chunk: walk it page by page
        } else {
            break;
        }
    }
    len
}

/// # Safety
/// Same contract as libc `munmap`.
#[no_mangle]
pub(crate) unsafe extern "C" fn munmap(addr: *mut c_void, len: usize) -> c_int {
    notify(addr as usize, len);
    match real_libc::munmap() {
        // SAFETY: forwarding the caller's arguments to the real function.
        Some(f) => unsafe { f(addr, len) },
        // SAFETY: the raw system call has the same contract.
        None => unsafe { libc::syscall(libc::SYS_munmap, addr, len) as c_int },
    }
}

/// `mremap` is variadic in C (`new_address` only with `MREMAP_FIXED`). Stable Rust cannot define
/// a variadic function, so the optional argument is declared: on x86-64 (and aarch64) the
/// variadic and fixed conventions pass it in the same register, and it is only read when the
/// flags say the caller passed it.
///
/// # Safety
/// Same contract as libc `mremap`.
#[no_mangle]
pub(crate) unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    // Moving, shrinking and DONTUNMAP all change what backs the old range; growing in place
    // does not, but telling is cheaper than deciding.
    notify(old as usize, old_len);
    let fixed = flags & libc::MREMAP_FIXED != 0;
    if fixed {
        notify(new_addr as usize, new_len); // whatever was mapped there is replaced
    }
    let target = if fixed {
        new_addr
    } else {
        std::ptr::null_mut()
    };
    let r = match real_libc::mremap() {
        // SAFETY: forwarding; `target` is only meaningful (and only read) with MREMAP_FIXED.
        Some(f) => unsafe { f(old, old_len, new_len, flags, target) },
        // SAFETY: the raw system call takes the same five arguments.
        None => unsafe {
            libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, target) as *mut c_void
        },
    };
    if r != libc::MAP_FAILED && firehose::internals::monitor::reports_fresh() {
        let fresh = mremap_fresh(old as usize, old_len, new_len, flags, r as usize);
        if let Some((start, span)) = fresh {
            notify(start, span);
        }
    }
    r
}

/// # Safety
/// Same contract as libc `madvise`.
#[no_mangle]
pub(crate) unsafe extern "C" fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    if madvise_drops_pages(advice) {
        notify(addr as usize, len);
    }
    match real_libc::madvise() {
        // SAFETY: forwarding the caller's arguments to the real function.
        Some(f) => unsafe { f(addr, len, advice) },
        // SAFETY: the raw system call has the same contract.
        None => unsafe { libc::syscall(libc::SYS_madvise, addr, len, advice) as c_int },
    }
}

/// `MAP_FIXED` replaces whatever was mapped at `addr` (told before the call); any other mapping
/// is new memory at addresses a raw unmap may have freed before its userfaultfd event was read
/// (told after the call: see `firehose::internals::monitor`'s `UnmapEvent::Fresh`).
///
/// # Safety
/// Same contract as libc `mmap`.
#[no_mangle]
pub(crate) unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off_t,
) -> *mut c_void {
    let replaces = mmap_replaces(addr as usize, len, flags);
    if let Some((start, span)) = replaces {
        notify(start, span);
    }
    let r = match real_libc::mmap() {
        // SAFETY: forwarding the caller's arguments to the real function.
        Some(f) => unsafe { f(addr, len, prot, flags, fd, off) },
        // SAFETY: the raw system call has the same contract on 64-bit Linux.
        None => unsafe {
            libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) as *mut c_void
        },
    };
    if replaces.is_none() && r != libc::MAP_FAILED && firehose::internals::monitor::reports_fresh()
    {
        notify(r as usize, len);
    }
    r
}

/// # Safety
/// Same contract as libc `shmdt`.
#[no_mangle]
pub(crate) unsafe extern "C" fn shmdt(addr: *const c_void) -> c_int {
    if settings::invalidation_enabled() {
        notify(addr as usize, mapped_extent(addr as usize));
    }
    match real_libc::shmdt() {
        // SAFETY: forwarding the caller's argument to the real function.
        Some(f) => unsafe { f(addr) },
        // SAFETY: the raw system call has the same contract.
        None => unsafe { libc::syscall(libc::SYS_shmdt, addr) as c_int },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_extent_covers_exactly_an_isolated_mapping() {
        let page = 4096;
        // SAFETY: anonymous mappings made and released by this test only.
        unsafe {
            // Reserve 8 pages, keep pages 1..6 (5 pages) mapped with guards around them.
            let base = libc::mmap(
                std::ptr::null_mut(),
                8 * page,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(base, libc::MAP_FAILED);
            let b = base as usize;
            assert_eq!(libc::syscall(libc::SYS_munmap, b, page), 0);
            assert_eq!(libc::syscall(libc::SYS_munmap, b + 6 * page, 2 * page), 0);
            assert_eq!(mapped_extent(b + page), 5 * page);
            assert_eq!(mapped_extent(b + 3 * page), 3 * page);
            assert_eq!(mapped_extent(b), 0);
            libc::syscall(libc::SYS_munmap, b + page, 5 * page);
        }
    }
}
