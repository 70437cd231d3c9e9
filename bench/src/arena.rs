//! One anonymous mapping carved into page-sized regions, so every registration in a run is a
//! distinct, page-aligned range the backends can pin.
//!
//! Regions are adjacent (no guard pages): mlock of adjacent pages merges back into one VMA,
//! whereas isolated locked pages would each cost a VMA and 10^5 of them exceed vm.max_map_count.

pub struct Arena {
    base: usize,
    len: usize,
}

pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

impl Arena {
    /// Map `len` bytes (rounded up to pages), read/write. With `populate` it is pre-faulted so
    /// first-touch page faults are never charged to a cache or a backend; without, it costs no
    /// RSS (for metadata measurements over the null backend, which never touches memory).
    pub fn new(len: usize, populate: bool) -> Arena {
        let page = page_size();
        let len = len.div_ceil(page) * page;
        // SAFETY: anonymous private mapping at a kernel-chosen address; no existing memory is
        // affected. MAP_POPULATE (if asked) faults it in.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE
                    | libc::MAP_ANONYMOUS
                    | if populate { libc::MAP_POPULATE } else { 0 },
                -1,
                0,
            )
        };
        assert!(p != libc::MAP_FAILED, "mmap of {len} bytes failed");
        Arena {
            base: p as usize,
            len,
        }
    }

    pub fn base(&self) -> usize {
        self.base
    }

    /// Address of the `i`-th `size`-byte slot.
    pub fn slot(&self, i: usize, size: usize) -> usize {
        assert!((i + 1) * size <= self.len, "arena too small");
        self.base + i * size
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping created in `new`; every cache that registered parts of it
        // has been dropped by the time the arena is.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}
