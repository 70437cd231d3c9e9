//! A patched `munmap` waits for the helper's pin ahead of the same memory (`helper/pins_ahead.rs`).
//!
//! The race it closes, made deterministic with a backend that stops at two gates: the helper
//! starts pinning a key (`helper::prefetch_checked`); the application unmaps the key's memory and
//! maps a larger mapping over the same addresses; the pin's `mlock` then lands on the new mapping
//! and splits it; the application touches the rest of the mapping while the part is locked (its
//! two parts get different `anon_vma`s); the raced pin is undone. Without the wait, that mapping
//! stays split for good and the application's `mremap` of it fails with EFAULT, as it did in
//! `case6_stale_threads_helper`. With it, the `munmap` returns only after the pin and its undo,
//! which both touched the old memory.
//!
//! mlock backend (RLIMIT_MEMLOCK allows 64 KiB everywhere this runs), libc patch, no userfaultfd.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use firehose::cache::CacheError;
use firehose::cache::{Cache, Limits};
use firehose::helper::{events::Key, prefetch_checked};
use firehose::helper::{pins_ahead, unmap_log};
use firehose::monitor::{self, MonitorOptions};
use firehose::pin::mlock::MlockPinner;
use firehose::pin::{Access, PinError, Pinned, Pinner};

const KEY_LEN: usize = 64 << 10;
const NEW_LEN: usize = 128 << 10;

#[derive(Default)]
struct Flag(AtomicBool);

impl Flag {
    fn set(&self) {
        self.0.store(true, SeqCst)
    }
    fn get(&self) -> bool {
        self.0.load(SeqCst)
    }
    /// Whether it was set within `d`.
    fn wait(&self, d: Duration) -> bool {
        let t = Instant::now();
        while !self.get() {
            if t.elapsed() > d {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }
}

/// mlock, with a gate before it and one after.
#[derive(Default)]
struct Gated {
    inner: MlockPinner,
    entered: Flag,
    may_lock: Flag,
    locked: Flag,
    may_return: Flag,
}

impl Pinner for Gated {
    fn pin(&self, addr: usize, len: usize, access: Access) -> Result<Pinned, PinError> {
        self.entered.set();
        self.may_lock.wait(Duration::from_secs(10));
        let r = self.inner.pin(addr, len, access);
        self.locked.set();
        self.may_return.wait(Duration::from_secs(10));
        r
    }
    fn unpin(&self, pinned: Pinned, addr: usize, len: usize) {
        self.inner.unpin(pinned, addr, len)
    }
    fn name(&self) -> &'static str {
        "gated-mlock"
    }
}

fn raw_mmap(addr: usize, len: usize, prot: i32, fixed: bool) -> usize {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | if fixed { libc::MAP_FIXED } else { 0 };
    // SAFETY: an anonymous mapping; MAP_FIXED only over our own reservation (raw: no hook).
    let p = unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, -1, 0) };
    assert!(p > 0 && p as usize & 0xfff == 0, "mmap: {p:#x}");
    p as usize
}

/// Starts of mappings strictly inside `(start, end)` (/proc/self/maps).
fn boundaries_inside(start: usize, end: usize) -> Vec<usize> {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    maps.lines()
        .filter_map(|l| usize::from_str_radix(l.split('-').next()?, 16).ok())
        .filter(|&a| start < a && a < end)
        .collect()
}

#[test]
fn a_patched_munmap_waits_for_the_pin_ahead_of_its_memory() {
    let st = monitor::install(MonitorOptions {
        patch_libc: true,
        userfaultfd: false,
    });
    assert!(st.patched & monitor::Hooked::Munmap.bit() != 0, "{st:?}");
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    // The key's memory, with a reserved (PROT_NONE) tail the new mapping will take too.
    let x = raw_mmap(0, NEW_LEN, libc::PROT_NONE, false);
    raw_mmap(x, KEY_LEN, rw, true);
    // SAFETY: our mapping.
    unsafe { std::ptr::write_bytes(x as *mut u8, 0xa5, KEY_LEN) };

    let gated = Arc::new(Gated::default());
    let limits = Limits {
        max_pinned: 1 << 30,
        max_regions: 16,
    };
    let cache = Cache::new(gated.clone(), limits, None);
    let key = Key {
        start: x,
        end: x + KEY_LEN,
        access: Access::LOCAL_WRITE.0,
    };
    let synced = unmap_log::mark_before_unfinished();
    let c = cache.clone();
    let helper = std::thread::spawn(move || prefetch_checked(&c, key, synced));
    assert!(
        gated.entered.wait(Duration::from_secs(10)),
        "no pin started"
    );

    let (unmapped, mapped_new) = (Arc::new(Flag::default()), Arc::new(Flag::default()));
    let (u, m) = (unmapped.clone(), mapped_new.clone());
    let app = std::thread::spawn(move || {
        // SAFETY: the key's memory, ours; through the patched libc entry.
        assert_eq!(unsafe { libc::munmap(x as *mut libc::c_void, KEY_LEN) }, 0);
        u.set();
        raw_mmap(x, NEW_LEN, rw, true);
        m.set();
    });
    std::thread::sleep(Duration::from_millis(200));
    let unmapped_during_pin = unmapped.get();
    let waits_before = pins_ahead::waits().0;
    gated.may_lock.set();
    assert!(gated.locked.wait(Duration::from_secs(10)));
    if mapped_new.get() {
        // The application uses its new mapping while the helper's lock covers part of it.
        // SAFETY: mapped read-write by `app`.
        unsafe { std::ptr::write_bytes((x + KEY_LEN) as *mut u8, 0x5a, NEW_LEN - KEY_LEN) };
    }
    gated.may_return.set();
    let pinned = helper.join().unwrap();
    app.join().unwrap();
    let cut_at = boundaries_inside(x, x + NEW_LEN);
    // SAFETY: mapped read-write by `app`.
    unsafe { std::ptr::write_bytes(x as *mut u8, 0x3c, NEW_LEN) };

    assert_eq!(
        pinned,
        Err(CacheError::Busy),
        "a pin that an unmap raced with is undone"
    );
    // Split by the pin, and never merged again: the kernel's refusal to move such a range whole
    // is what the application saw.
    assert!(
        cut_at.is_empty(),
        "the application's new mapping [{x:#x}, {:#x}) is split at {cut_at:x?}",
        x + NEW_LEN
    );
    assert!(pins_ahead::waits().0 >= waits_before);
    // The application's own call behaves as without the library: one mapping, movable whole.
    let q = raw_mmap(0, NEW_LEN, libc::PROT_NONE, false);
    // SAFETY: moves our mapping over our reservation.
    let r = unsafe {
        libc::mremap(
            x as *mut libc::c_void,
            NEW_LEN,
            NEW_LEN,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            q as *mut libc::c_void,
        )
    };
    let err = std::io::Error::last_os_error();
    assert_eq!(r as usize, q, "mremap of the new mapping: {err}");
    // SAFETY: the moved mapping, ours.
    let moved = unsafe { std::slice::from_raw_parts(q as *const u8, NEW_LEN) };
    assert!(moved.iter().all(|&b| b == 0x3c));
    // SAFETY: ours.
    unsafe { libc::munmap(q as *mut libc::c_void, NEW_LEN) };
    assert!(
        !unmapped_during_pin,
        "the munmap returned while the helper pinned its memory"
    );
}
