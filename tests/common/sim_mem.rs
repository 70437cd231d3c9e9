//! Test scaffolding shared by the simulator tests (`tests/net_sim.rs`, `tests/net_rdma_sim.rs`,
//! `tests/rma_sim.rs`, `tests/rma_seg_fail.rs`, and `tests/firehose_sim.rs` of
//! `crates/firehose-proto`): a seeded RNG (`fastrand`, the one the tests use: the same seed gives the same run) and a
//! buffer the simulator writes through raw pointers. Included with `#[path]`; not every test uses every item.

pub struct Rng(fastrand::Rng);
impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(fastrand::Rng::with_seed(seed))
    }
    pub fn next(&mut self) -> u64 {
        self.0.u64(..)
    }
    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.0.u64(..n)
        }
    }
    /// True with probability `pct` percent.
    pub fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
}

/// Memory the simulator may write behind Rust's back: reached only through its raw pointer while
/// ops may run, and read as a slice only when none can.
pub struct Buf {
    ptr: *mut u8,
    /// Its length in bytes (read by the tests; set once by `new`).
    pub len: usize,
}
// SAFETY: plain heap memory; the tests synchronise access (completions, joins, barriers).
unsafe impl Send for Buf {}
// SAFETY: as above.
unsafe impl Sync for Buf {}

impl Buf {
    pub fn new(len: usize, fill: u8) -> Buf {
        let b = vec![fill; len].into_boxed_slice();
        Buf {
            ptr: Box::into_raw(b).cast::<u8>(),
            len,
        }
    }
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }
    /// # Safety
    /// No RDMA op may touch the buffer while the slice lives.
    pub unsafe fn bytes(&self) -> &[u8] {
        // SAFETY: allocated with `len` bytes in `new`; the caller guarantees no concurrent DMA.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    /// # Safety
    /// As `bytes`.
    pub unsafe fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len);
        // SAFETY: in bounds; the caller guarantees no concurrent DMA.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: made by Box::into_raw of a boxed slice of `len` bytes.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}
