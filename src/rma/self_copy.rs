//! Puts and gets to the own rank: a copy inside this process, through `process_vm_writev` /
//! `process_vm_readv` on our own pid rather than `memcpy`, so an unmapped "remote" address is an
//! `EFAULT` (reported as `RmaError::RemoteFault`, as it would be from a peer) instead of a SIGSEGV.
//! The kernel copies page by page and stops at the first fault; a failed copy may have written a
//! prefix of the destination, exactly as a failed RDMA may have.

use crate::rma::RmaError;

/// Which side of a self copy is the "remote" address (the one that may be unmapped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    /// `local` -> `remote` (a put).
    Put,
    /// `remote` -> `local` (a get).
    Get,
}

/// Copy `len` bytes between the caller's buffer `local` and `remote`, both in this process.
/// `RmaError::RemoteFault` if `remote` is not (entirely) mapped with the needed rights,
/// `RmaError::PinFailed` if `local` is not.
///
/// # Safety
/// `local` must be valid for `len` bytes (readable for a put, writable for a get) for the call.
/// `remote` may be anything: the kernel checks it.
pub(crate) unsafe fn copy(
    dir: Dir,
    local: *mut u8,
    remote: u64,
    len: usize,
) -> Result<(), RmaError> {
    let mut done = 0usize;
    while done < len {
        let l = libc::iovec {
            iov_base: local.wrapping_add(done).cast(),
            iov_len: len - done,
        };
        let r = libc::iovec {
            iov_base: (remote as usize).wrapping_add(done) as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: both iovecs describe ranges the kernel checks against our own address space
        // (a bad one is EFAULT, never a fault in this process); `local` is valid per the contract.
        let n = unsafe {
            match dir {
                Dir::Put => libc::process_vm_writev(libc::getpid(), &l, 1, &r, 1, 0),
                Dir::Get => libc::process_vm_readv(libc::getpid(), &l, 1, &r, 1, 0),
            }
        };
        if n > 0 {
            done += n as usize;
            continue;
        }
        if n == 0 {
            // No progress and no error: the remote side ends at a fault boundary.
            return Err(RmaError::RemoteFault);
        }
        let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        return Err(match e {
            libc::EINTR => continue,
            // The kernel does not say which side faulted: blame the remote address unless the
            // local one is the unreadable one (checked with a one-byte probe per page).
            libc::EFAULT if !local_ok(dir, local.wrapping_add(done), len - done) => {
                RmaError::PinFailed
            }
            libc::EFAULT => RmaError::RemoteFault,
            libc::ENOMEM => RmaError::NoMemory,
            // EPERM (ptrace restrictions on ourselves are not expected) and anything else.
            _ => RmaError::Unsupported,
        });
    }
    Ok(())
}

/// Whether `[p, p + len)` is readable (put) or writable (get) in this process, asked of the
/// kernel (`process_vm_readv` of its bytes into a scratch page), so nothing here can fault.
fn local_ok(dir: Dir, p: *mut u8, len: usize) -> bool {
    let _ = dir; // a readable local buffer of a get that is not writable is rare; checked by reading
    let mut scratch = [0u8; 4096];
    let mut off = 0usize;
    while off < len {
        let n = (len - off).min(scratch.len());
        let l = libc::iovec {
            iov_base: scratch.as_mut_ptr().cast(),
            iov_len: n,
        };
        let r = libc::iovec {
            iov_base: p.wrapping_add(off).cast(),
            iov_len: n,
        };
        // SAFETY: the kernel checks `r` against our address space; `l` is our scratch buffer.
        let got = unsafe { libc::process_vm_readv(libc::getpid(), &l, 1, &r, 1, 0) };
        if got <= 0 {
            return false;
        }
        off += got as usize;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unmapped_page() -> u64 {
        // SAFETY: plain anonymous mapping, unmapped right away: its address is then unmapped
        // (nothing else in this test maps memory concurrently at a fixed address).
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            libc::munmap(p, 4096);
            p as u64
        }
    }

    #[test]
    fn put_and_get_copy_bytes() {
        let mut src: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let mut dst = vec![0u8; 10_000];
        // SAFETY: both buffers are live and 10 000 bytes long.
        unsafe { copy(Dir::Put, src.as_mut_ptr(), dst.as_mut_ptr() as u64, 10_000) }.unwrap();
        assert_eq!(src, dst);
        let mut back = vec![0u8; 10_000];
        // SAFETY: as above.
        unsafe { copy(Dir::Get, back.as_mut_ptr(), dst.as_ptr() as u64, 10_000) }.unwrap();
        assert_eq!(back, src);
    }

    #[test]
    fn unmapped_remote_is_an_error_not_a_crash() {
        let bad = unmapped_page();
        let mut buf = vec![1u8; 64];
        for dir in [Dir::Put, Dir::Get] {
            // SAFETY: `buf` is live for 64 bytes; `bad` is checked by the kernel.
            let r = unsafe { copy(dir, buf.as_mut_ptr(), bad, 64) };
            assert_eq!(r, Err(RmaError::RemoteFault), "{dir:?}");
        }
    }

    #[test]
    fn unmapped_local_is_pin_failed() {
        let bad = unmapped_page() as *mut u8;
        let target = [0u8; 64];
        // SAFETY: deliberately breaks the contract's *validity* only in a way the kernel checks
        // (the local side is only ever touched through process_vm_*).
        let r = unsafe { copy(Dir::Put, bad, target.as_ptr() as u64, 64) };
        assert_eq!(r, Err(RmaError::PinFailed));
    }
}
