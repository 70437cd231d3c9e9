//! A page-aligned anonymous mapping registered once for the link's lifetime: the receive slots,
//! the send ring and the probe words live in these. The device reads and writes this memory
//! behind Rust's back, so it is only ever reached through raw pointers (never a long-lived `&[u8]`
//! or `&mut [u8]`), and short slices are made only over bytes no work request currently owns.

use std::ptr::NonNull;
use std::sync::Arc;

use crate::pin::verbs::{Mr, Pd, VerbsError, VerbsResult};
use crate::pin::Access;

/// Registered memory owned by the link. Deregistered, then unmapped, on drop.
pub(crate) struct RegBuf {
    /// `Some` until drop: deregistered explicitly before the memory is unmapped.
    mr: Option<Mr>,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this struct; all access goes through raw pointers
// under the link's own synchronisation (a slot belongs to one work request or one thread at a time).
unsafe impl Send for RegBuf {}
// SAFETY: as above; `&RegBuf` only hands out addresses and keys.
unsafe impl Sync for RegBuf {}

impl RegBuf {
    /// Map `len` bytes (rounded up to whole pages, zero-filled) and register them with `access`.
    pub(crate) fn new(pd: &Arc<Pd>, len: usize, access: Access) -> VerbsResult<Self> {
        let page = 4096;
        let len = len.max(1).div_ceil(page) * page;
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(VerbsError::last("mmap(link buffer)"));
        }
        let ptr = NonNull::new(p.cast::<u8>()).expect("mmap returned NULL without MAP_FIXED");
        match Mr::register(pd, p as usize, len, access) {
            Ok(mr) => Ok(RegBuf {
                mr: Some(mr),
                ptr,
                len,
            }),
            Err(e) => {
                // SAFETY: we mapped it above and nothing else refers to it.
                unsafe { libc::munmap(p, len) };
                Err(e)
            }
        }
    }

    /// Start of the mapping. Valid for `len()` bytes while `self` lives.
    #[inline]
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    #[inline]
    pub(crate) fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub(crate) fn lkey(&self) -> u32 {
        self.mr.as_ref().map_or(0, Mr::lkey)
    }

    pub(crate) fn rkey(&self) -> u32 {
        self.mr.as_ref().map_or(0, Mr::rkey)
    }
}

impl Drop for RegBuf {
    fn drop(&mut self) {
        // Deregister first: the device must not own the pages when they are unmapped.
        drop(self.mr.take());
        // SAFETY: mapped in `new` with this length; the link destroys its QPs (the only users of
        // these addresses) before its buffers, and the MR is gone.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}
