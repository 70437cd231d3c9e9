//! Bounce slots for short gets: a get of at most `SLOT` bytes reads into a slot of a buffer
//! the library registered once, and its completion copies the bytes to the caller's
//! destination before the result is published. The caller's buffer then needs no registration:
//! the pin-down cache's lookup and release (287 of a hit get's 1580 instructions, nearly half of
//! what it cost over the floor, `scripts/profile-put`) leave the hit path, as a short put's do by
//! going inline. This is what UCX's `get_bcopy` does for short
//! gets (a bounce buffer and a copy); the copy of a few bytes costs less than a lookup.
//!
//! Safety of the copy: it runs where the request ends (its last segment completed, the table
//! or the fast completion, `engine`), only when every segment succeeded, before the result is
//! published, so the caller sees the bytes with the result and never after it. The slot goes
//! back to the pool only when the request ends, as a cache registration would be released:
//! after every RDMA posted for it completed, so no late READ response can land in a slot that a
//! new get uses. The buffer is the library's own (mapped here, never a peer's target: the
//! engine adds it to the exposure's library ranges), pinned once with the cache's backend (not
//! through the cache: it is not a caller's registration and must not count among them) and
//! stays mapped and pinned until the pool goes.
//!
//! A handle of this pool rides in `Request::reg` beside the cache's: slot `i` is `i + 1`, below
//! 2^32, where a live cache handle never is (its generation, in the upper half, is odd).

use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::pin::{Access, Pinned, Pinner};

/// Bytes per slot: the longest get that bounces.
pub(super) const SLOT: usize = 256;
/// Slots (one bit each in `Bounce::taken`): short gets in flight beyond this many register
/// their buffer.
const SLOTS: usize = 64;

pub(crate) struct Bounce {
    /// The slots, `SLOTS * SLOT` bytes, mapped by `new`.
    base: *mut u8,
    lkey: u32,
    /// The buffer's pin, undone when the pool goes.
    pinned: Pinned,
    pinner: Arc<dyn Pinner>,
    /// Bit `i` set: slot `i` is taken.
    taken: AtomicU64,
    /// Gets that took a slot, and short gets that found none free (`RmaStats`).
    took: AtomicU64,
    full: AtomicU64,
    /// Per slot: where its bytes go, and how many (written by `take` before the post, read by
    /// the completion that ends the request).
    dest: [AtomicUsize; SLOTS],
    len: [AtomicUsize; SLOTS],
}

// SAFETY: `base` points to memory this pool owns until it drops; slot `i`'s bytes are written
// only by the device (a READ posted by the thread that took the slot) and read only by the
// completion of that READ, before the slot is given back (`put_back`).
unsafe impl Send for Bounce {}
// SAFETY: as above; everything else is atomic.
unsafe impl Sync for Bounce {}

impl Bounce {
    /// Maps the slots and pins them with `pinner`; `None` if either fails (gets then register
    /// their buffer, as without the pool).
    pub(super) fn new(pinner: Arc<dyn Pinner>) -> Option<Bounce> {
        let bytes = SLOTS * SLOT;
        // SAFETY: a fresh private anonymous mapping, no address hint.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        match pinner.pin(p as usize, bytes, Access::LOCAL_WRITE) {
            Ok(pinned) => Some(Bounce {
                base: p.cast(),
                lkey: pinned.lkey,
                pinned,
                pinner,
                taken: AtomicU64::new(0),
                took: AtomicU64::new(0),
                full: AtomicU64::new(0),
                dest: std::array::from_fn(|_| AtomicUsize::new(0)),
                len: std::array::from_fn(|_| AtomicUsize::new(0)),
            }),
            Err(_) => {
                // SAFETY: the mapping made above, nothing else refers to it.
                unsafe { libc::munmap(p, bytes) };
                None
            }
        }
    }

    /// The buffer (for the exposure's library ranges).
    pub(super) fn range(&self) -> (u64, usize) {
        (self.base as u64, SLOTS * SLOT)
    }

    /// A slot for a get of `len` (1 to `SLOT`) bytes into `dest`: its handle, the address the
    /// READ lands at and its key; `None` when every slot is taken.
    ///
    /// `dest` is touched here, in the caller's thread: a destination that is not writable
    /// faults now, as `memcpy` into it would, and not later in whichever thread completes the
    /// get (a registration would have refused it; with no registration this is the check).
    ///
    /// # Safety
    /// `dest` is the get's destination: `len` bytes the caller gave to this get (fh_get's
    /// contract), nobody else's to write until it ends.
    #[inline]
    pub(super) unsafe fn take(&self, dest: *mut u8, len: usize) -> Option<(NonZeroU64, u64, u32)> {
        debug_assert!((1..=SLOT).contains(&len));
        // SAFETY: the first and last byte of the destination (at most two pages: `len <=
        // SLOT`), each written back with its own value; the get owns them (contract).
        unsafe {
            for p in [dest, dest.add(len - 1)] {
                std::ptr::write_volatile(p, std::ptr::read_volatile(p));
            }
        }
        let mut m = self.taken.load(Ordering::Relaxed);
        loop {
            let free = !m;
            if free == 0 {
                self.full.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            let i = free.trailing_zeros() as usize;
            match self.taken.compare_exchange_weak(
                m,
                m | 1 << i,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    self.took.fetch_add(1, Ordering::Relaxed);
                    // Release: the completion that reads them follows the post, which follows
                    // these stores (in practice ordered by the device; `finish` loads Acquire).
                    self.dest[i].store(dest as usize, Ordering::Release);
                    self.len[i].store(len, Ordering::Release);
                    let h = NonZeroU64::new(i as u64 + 1).expect("i + 1 > 0");
                    return Some((h, self.base as u64 + (i * SLOT) as u64, self.lkey));
                }
                Err(now) => m = now,
            }
        }
    }

    /// Whether `h` (a `Request::reg`) is one of this pool's handles, not the cache's.
    #[inline(always)]
    pub(super) fn owns(h: NonZeroU64) -> bool {
        h.get() <= SLOTS as u64
    }

    /// The request holding slot `h` ended, `ok` if every segment succeeded: copies the slot's
    /// bytes to the caller's destination then (before the result is published: the caller's
    /// contract says the destination is ours until then). Nothing for a cache handle.
    #[inline]
    pub(super) fn finish(&self, h: NonZeroU64, ok: bool) {
        if !ok || !Self::owns(h) {
            return;
        }
        let i = h.get() as usize - 1;
        let dest = self.dest[i].load(Ordering::Acquire) as *mut u8;
        let len = self.len[i].load(Ordering::Acquire);
        // SAFETY: slot `i` is taken by this request, its READ completed (the device wrote at most
        // `len` bytes there); `dest` is the caller's destination of `len` bytes, valid and not
        // touched by the caller until the result is published (fh_get's contract), and never
        // inside the pool (a distinct mapping).
        unsafe { copy_short(self.base.add(i * SLOT), dest, len) };
    }

    /// Gives slot `h` back (its request ended: no RDMA into it is in flight); `false` if it was
    /// not taken (a double release: a bug, counted by the caller).
    #[inline]
    pub(super) fn put_back(&self, h: NonZeroU64) -> bool {
        let bit = 1u64 << (h.get() - 1);
        self.taken.fetch_and(!bit, Ordering::Release) & bit != 0
    }

    /// Gets that took a slot, and short gets that found every slot taken, so far.
    pub(super) fn counts(&self) -> (u64, u64) {
        (
            self.took.load(Ordering::Relaxed),
            self.full.load(Ordering::Relaxed),
        )
    }

    /// Slots taken now (0 when nothing runs: `Rma::check_idle`).
    pub(super) fn in_use(&self) -> u32 {
        self.taken.load(Ordering::Acquire).count_ones()
    }
}

/// `copy_nonoverlapping` of `len` bytes, without a call into `memcpy` for the shortest (the
/// common 8-byte get): 8 to 16 bytes are two unaligned 8-byte moves that may overlap each other
/// (never outside `[dst, dst + len)`).
///
/// # Safety
/// As `std::ptr::copy_nonoverlapping`.
#[inline(always)]
unsafe fn copy_short(src: *const u8, dst: *mut u8, len: usize) {
    // SAFETY: every access is inside `[src, src + len)` / `[dst, dst + len)` (caller's contract).
    unsafe {
        if (8..=16).contains(&len) {
            let (a, b) = (
                src.cast::<u64>().read_unaligned(),
                src.add(len - 8).cast::<u64>().read_unaligned(),
            );
            dst.cast::<u64>().write_unaligned(a);
            dst.add(len - 8).cast::<u64>().write_unaligned(b);
        } else {
            std::ptr::copy_nonoverlapping(src, dst, len);
        }
    }
}

impl Drop for Bounce {
    fn drop(&mut self) {
        // The last `Arc` of the pool goes with the RDMA handler: no get is in flight any more.
        self.pinner
            .unpin(self.pinned, self.base as usize, SLOTS * SLOT);
        // SAFETY: the mapping `new` made; nothing refers to it any more.
        unsafe { libc::munmap(self.base.cast(), SLOTS * SLOT) };
    }
}

impl std::fmt::Debug for Bounce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Bounce {{ taken: {:#x} }}",
            self.taken.load(Ordering::Relaxed)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::copy_short;

    /// Every length up to 40 at every offset copies exactly its bytes and nothing around them.
    #[test]
    fn copy_short_copies_exactly_len_bytes() {
        let src: Vec<u8> = (0..64u8).map(|b| b.wrapping_mul(37) | 1).collect();
        for len in 1..=40 {
            for off in 0..8 {
                let mut dst = [0u8; 64];
                // SAFETY: both ranges inside their arrays, distinct arrays.
                unsafe { copy_short(src.as_ptr().add(off), dst.as_mut_ptr().add(off), len) };
                assert_eq!(
                    &dst[off..off + len],
                    &src[off..off + len],
                    "len {len} off {off}"
                );
                assert!(dst[..off].iter().all(|&b| b == 0), "before, len {len}");
                assert!(dst[off + len..].iter().all(|&b| b == 0), "after, len {len}");
            }
        }
    }
}
