//! The cache's pinning backend inside the shim: `ibv_reg_mr_iova2` / `ibv_dereg_mr` of the
//! *real* libibverbs, called through the resolved pointers.
//!
//! Not `firehose::internals::pin::verbs::VerbsPinner`: that one calls `ibv_reg_mr` by symbol, which inside a
//! preloaded process is our own hook, and it would make every process that inherits LD_PRELOAD
//! link libibverbs. Calling the resolved targets directly needs neither, and lets us time each
//! real call for the `FH_STATS` cost model. It also remembers each MR's kernel `handle` by lkey,
//! because a wrapper MR must carry it and the cache's `Registration` has no room for it.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use firehose::internals::pin::{Access, PinError, Pinned, Pinner};

use crate::counters::{self, COUNTERS};
use crate::ffi_types::{IbvMr, IbvPd};
use crate::real_verbs::RealVerbs;
use rustc_hash::FxHashMap;

/// Slots of the lock-free lkey -> handle table (a power of two).
const RECENT: usize = 256;

pub(crate) struct RealPinner {
    pd: *mut IbvPd,
    real: &'static RealVerbs,
    /// Every live MR's handle by lkey: the truth.
    handles: Mutex<FxHashMap<u32, u32>>,
    /// Direct-mapped `lkey << 32 | handle` of live MRs (0: empty), so a cache hit finds its
    /// handle with one load instead of a lock and a hash. A collision only overwrites (the
    /// lookup then falls back to `handles`). An entry is current: it is written when its MR is
    /// registered and cleared when it is deregistered, and one pinner never holds two live MRs
    /// with the same lkey.
    recent: [AtomicU64; RECENT],
}

fn recent_slot(lkey: u32) -> usize {
    // lkeys differ mostly above their low "key" byte (mlx5, rxe): mix before masking.
    (lkey.wrapping_mul(0x9E37_79B9) >> 24) as usize % RECENT
}

// SAFETY: `pd` is an opaque handle that libibverbs allows to be used from any thread; the only
// shared mutable state is behind a Mutex.
unsafe impl Send for RealPinner {}
// SAFETY: as above.
unsafe impl Sync for RealPinner {}

impl RealPinner {
    pub(crate) fn new(pd: *mut IbvPd, real: &'static RealVerbs) -> RealPinner {
        RealPinner {
            pd,
            real,
            handles: Mutex::new(FxHashMap::default()),
            recent: [const { AtomicU64::new(0) }; RECENT],
        }
    }

    /// Kernel handle of the live MR with this lkey (0 if unknown).
    pub(crate) fn handle_of(&self, lkey: u32) -> u32 {
        let e = self.recent[recent_slot(lkey)].load(Ordering::Acquire);
        if e != 0 && (e >> 32) as u32 == lkey {
            return e as u32;
        }
        let map = self.handles.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&lkey).copied().unwrap_or(0)
    }
}

/// ENOMEM/EAGAIN are "out of pinnable memory or keys": the cache evicts and retries.
pub(crate) fn classify(errno: i32) -> PinError {
    if errno == libc::ENOMEM || errno == libc::EAGAIN {
        PinError::NoMemory(errno)
    } else {
        PinError::Failed(errno)
    }
}

fn elapsed_ns(t0: Instant) -> u64 {
    u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl RealPinner {
    /// Register `[addr, addr + len)` for real and deregister it at once, timed: (reg ns, dereg
    /// ns), or `None` if the registration failed. For the resident-pages cost samples: no
    /// counter, no handle table, no pinned bytes see it.
    pub(crate) fn time_reg_dereg(
        &self,
        addr: usize,
        len: usize,
        access: Access,
    ) -> Option<(u64, u64)> {
        let (Some(reg), Some(dereg)) = (self.real.reg_mr_iova2, self.real.dereg_mr) else {
            return None;
        };
        let t0 = Instant::now();
        // SAFETY: `pd` is live (as in `pin`); the range is registered in this domain already
        // (a cache hit), so it is mapped.
        let mr = unsafe { reg(self.pd, addr as *mut c_void, len, addr as u64, access.0) };
        if mr.is_null() {
            return None;
        }
        let reg_ns = elapsed_ns(t0);
        let t1 = Instant::now();
        // SAFETY: the MR registered just above, released once.
        unsafe { dereg(mr) };
        Some((reg_ns, elapsed_ns(t1)))
    }
}

impl Pinner for RealPinner {
    fn pin(&self, addr: usize, len: usize, access: Access) -> Result<Pinned, PinError> {
        // For `FH_STATS` only: a miss on resident pages prices what a hit avoids (`cost_model`).
        let resident = crate::settings::stats_fd().is_some() && all_resident(addr, len);
        let t0 = Instant::now();
        // SAFETY: `pd` is the caller's live protection domain (the cache for it is dropped in our
        // ibv_dealloc_pd hook before the real call); the range is what the cache asked for.
        let mr: *mut IbvMr = unsafe {
            if let Some(f) = self.real.reg_mr_iova2 {
                f(self.pd, addr as *mut c_void, len, addr as u64, access.0)
            } else if let Some(f) = self.real.reg_mr {
                f(self.pd, addr as *mut c_void, len, access.0 as i32)
            } else {
                return Err(PinError::Failed(libc::ENOSYS));
            }
        };
        if mr.is_null() {
            return Err(classify(
                std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
            ));
        }
        let ns = elapsed_ns(t0);
        crate::miss_cost::pinned(ns);
        crate::cost_model::record(&crate::cost_model::REG, len, ns);
        if resident {
            crate::cost_model::record_resident_miss(len, ns);
        }
        COUNTERS
            .real_reg_ns
            .fetch_add(ns, std::sync::atomic::Ordering::Relaxed);
        counters::bump(&COUNTERS.real_regs);
        counters::pinned_add(len as u64);
        // SAFETY: libibverbs returned a valid MR.
        let m = unsafe { *mr };
        self.handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(m.lkey, m.handle);
        let e = (m.lkey as u64) << 32 | m.handle as u64;
        self.recent[recent_slot(m.lkey)].store(e, Ordering::Release);
        Ok(Pinned {
            token: mr as usize,
            lkey: m.lkey,
            rkey: m.rkey,
        })
    }

    fn unpin(&self, pinned: Pinned, _addr: usize, len: usize) {
        let handle = self
            .handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&pinned.lkey);
        if let Some(h) = handle {
            // Only our own entry: a colliding MR's that replaced it stays.
            let e = (pinned.lkey as u64) << 32 | h as u64;
            let _ = self.recent[recent_slot(pinned.lkey)].compare_exchange(
                e,
                0,
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
        let Some(f) = self.real.dereg_mr else { return };
        let t0 = Instant::now();
        // SAFETY: `token` is the MR our `pin` returned, released exactly once (the cache's
        // contract); deregistering memory that was unmapped meanwhile is fine for the kernel.
        unsafe { f(pinned.token as *mut IbvMr) };
        let ns = elapsed_ns(t0);
        crate::miss_cost::unpinned(ns);
        crate::cost_model::record(&crate::cost_model::DEREG, len, ns);
        COUNTERS
            .real_dereg_ns
            .fetch_add(ns, std::sync::atomic::Ordering::Relaxed);
        counters::bump(&COUNTERS.real_deregs);
        counters::pinned_sub(len as u64);
    }

    fn name(&self) -> &'static str {
        "verbs-preload"
    }
}

/// Whether every page of `[addr, addr + len)` is resident (`mincore`, a page at a time in chunks
/// of a fixed stack buffer: no allocation). False on any error (unmapped, ...).
pub(crate) fn all_resident(addr: usize, len: usize) -> bool {
    const CHUNK: usize = 256;
    // SAFETY: sysconf has no preconditions.
    let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    };
    let (Some(end), true) = (addr.checked_add(len), len != 0) else {
        return false;
    };
    let mut at = addr & !(page - 1);
    let mut vec = [0u8; CHUNK];
    while at < end {
        let pages = ((end - at).div_ceil(page)).min(CHUNK);
        // SAFETY: mincore reads our own page tables and writes `pages <= CHUNK` bytes to `vec`.
        let r = unsafe { libc::mincore(at as *mut libc::c_void, pages * page, vec.as_mut_ptr()) };
        if r != 0 || vec[..pages].iter().any(|v| v & 1 == 0) {
            return false;
        }
        at += pages * page;
    }
    true
}

#[cfg(test)]
mod tests {
    #[test]
    fn residency_is_every_page_touched() {
        use super::all_resident;
        // More than one mincore chunk.
        let len = 300 * 4096;
        let p = crate::dispatch_tests::anon(len) as *mut libc::c_void;
        let a = p as usize;
        assert!(!all_resident(a, len), "never touched");
        // SAFETY: inside the mapping.
        unsafe { std::ptr::write_bytes(p as *mut u8, 1, len - 4096) };
        assert!(!all_resident(a, len), "the last page never touched");
        assert!(all_resident(a + 10, len - 4096 - 10), "the touched part");
        // SAFETY: the last page, inside the mapping.
        unsafe { *((a + len - 1) as *mut u8) = 1 };
        assert!(all_resident(a, len));
        assert!(!all_resident(a, 0), "empty");
        // SAFETY: our own mapping.
        unsafe { libc::munmap(p, len) };
        assert!(!all_resident(a, len), "unmapped");
    }

    use super::*;

    #[test]
    fn only_memory_exhaustion_is_retryable() {
        assert_eq!(classify(libc::ENOMEM), PinError::NoMemory(libc::ENOMEM));
        assert_eq!(classify(libc::EAGAIN), PinError::NoMemory(libc::EAGAIN));
        assert_eq!(classify(libc::EFAULT), PinError::Failed(libc::EFAULT));
        assert_eq!(classify(libc::EINVAL), PinError::Failed(libc::EINVAL));
    }

    static NEXT_HANDLE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

    /// A fake libibverbs: lkey from the address (so it repeats when a range is registered
    /// again), a fresh kernel handle every time.
    unsafe extern "C" fn fake_reg(
        pd: *mut IbvPd,
        addr: *mut c_void,
        len: usize,
        _iova: u64,
        _access: std::ffi::c_uint,
    ) -> *mut IbvMr {
        Box::into_raw(Box::new(IbvMr {
            context: std::ptr::null_mut(),
            pd,
            addr,
            length: len,
            handle: NEXT_HANDLE.fetch_add(1, Ordering::Relaxed),
            lkey: (addr as usize >> 12) as u32,
            rkey: 0,
        }))
    }

    unsafe extern "C" fn fake_dereg(mr: *mut IbvMr) -> std::ffi::c_int {
        // SAFETY: `mr` came from `fake_reg`.
        drop(unsafe { Box::from_raw(mr) });
        0
    }

    static FAKE: RealVerbs = RealVerbs {
        reg_mr: None,
        reg_mr_iova: None,
        reg_mr_iova2: Some(fake_reg),
        dereg_mr: Some(fake_dereg),
        rereg_mr: None,
        alloc_pd: None,
        dealloc_pd: None,
        close_device: None,
    };

    #[test]
    fn a_timed_re_registration_is_released_and_counted_nowhere() {
        let _s = crate::serial::serial();
        let p = RealPinner::new(std::ptr::null_mut(), &FAKE);
        let held = p.pin(0x40_0000, 8192, Access(1)).unwrap();
        let regs = COUNTERS.real_regs.load(Ordering::Relaxed);
        let pinned = COUNTERS.pinned_now.load(Ordering::Relaxed);
        let (reg, dereg) = p.time_reg_dereg(0x40_0000, 8192, Access(1)).unwrap();
        assert!(reg > 0 && dereg > 0);
        assert_eq!(COUNTERS.real_regs.load(Ordering::Relaxed), regs);
        assert_eq!(COUNTERS.pinned_now.load(Ordering::Relaxed), pinned);
        // The cached MR's handle is still the one found (the sample's MR shares its lkey).
        // SAFETY: the token is a live fake MR.
        let h = unsafe { (*(held.token as *mut IbvMr)).handle };
        assert_eq!(p.handle_of(held.lkey), h);
        p.unpin(held, 0x40_0000, 8192);
    }

    #[test]
    fn handle_of_follows_registrations_through_collisions_and_key_reuse() {
        let _s = crate::serial::serial();
        let p = RealPinner::new(std::ptr::null_mut(), &FAKE);
        // More live MRs than table slots: collisions must fall back to the map.
        let n = RECENT * 3;
        let pin = |i: usize| p.pin(i << 12, 4096, Access(1)).unwrap();
        let mut live: Vec<Pinned> = (0..n).map(pin).collect();
        let truth = |pd: &Pinned| {
            // SAFETY: the token is a live fake MR.
            unsafe { (*(pd.token as *mut IbvMr)).handle }
        };
        for x in &live {
            assert_eq!(p.handle_of(x.lkey), truth(x));
        }
        // Release every other one and register the same ranges again: same lkeys, new handles.
        for i in (0..n).step_by(2) {
            let old = std::mem::replace(
                &mut live[i],
                Pinned {
                    token: 0,
                    lkey: 0,
                    rkey: 0,
                },
            );
            let old_handle = truth(&old);
            p.unpin(old, i << 12, 4096);
            live[i] = pin(i);
            assert_ne!(truth(&live[i]), old_handle);
        }
        for x in &live {
            assert_eq!(p.handle_of(x.lkey), truth(x), "lkey {}", x.lkey);
        }
        for (i, x) in live.into_iter().enumerate() {
            let lkey = x.lkey;
            p.unpin(x, i << 12, 4096);
            assert_eq!(p.handle_of(lkey), 0, "gone");
        }
    }
}
