//! Page-aligned anonymous memory: `Pinner::pin` wants page-aligned ranges, and a private mapping
//! keeps each test buffer on its own pages.

/// An anonymous private mapping, unmapped on drop.
pub struct PageBuf {
    ptr: *mut u8,
    len: usize,
}

impl PageBuf {
    /// Map `len` bytes (rounded up to whole pages), zero-filled.
    pub fn new(len: usize) -> std::io::Result<Self> {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let len = len.div_ceil(page) * page;
        // SAFETY: anonymous private mapping at a kernel-chosen address; no existing memory is
        // affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(PageBuf {
            ptr: ptr.cast(),
            len,
        })
    }

    pub fn addr(&self) -> usize {
        self.ptr as usize
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Read the whole buffer. Volatile so the compiler cannot reuse values read before the device
    /// wrote the memory behind its back.
    pub fn snapshot(&self) -> Vec<u8> {
        (0..self.len)
            // SAFETY: `i < len` inside our live mapping; volatile because DMA may have written it.
            .map(|i| unsafe { self.ptr.add(i).read_volatile() })
            .collect()
    }

    /// Overwrite the start of the buffer with `data` (volatile, for the same reason).
    pub fn fill(&mut self, data: &[u8]) {
        assert!(data.len() <= self.len, "fill larger than the buffer");
        for (i, &b) in data.iter().enumerate() {
            // SAFETY: `i < data.len() <= len` inside our live mapping.
            unsafe { self.ptr.add(i).write_volatile(b) };
        }
    }
}

impl Drop for PageBuf {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping we created; nothing borrows it past drop.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}
