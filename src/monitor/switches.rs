//! Test-only switches that turn single event paths off, so tests can prove each path matters.
//!
//! Read from `FH_TEST_DISABLE_HOOKS` (comma list of
//! `munmap,mremap,madvise,mmap,shmdt,shmat,uffd,fresh`) at every [`super::install`]. A disabled
//! function is not patched; a disabled uffd is not opened; `fresh` keeps the patched `mmap` and
//! `mremap` from reporting the new ranges they return (`UnmapEvent::Fresh`). Already-installed
//! paths are not removed.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

use super::hooks::Hooked;

/// Bit for userfaultfd (above every [`Hooked`] bit).
pub(super) const UFFD: u32 = 1 << 31;
/// Bit for the `Fresh` reports of `mmap`/`mremap` (above every [`Hooked`] bit).
pub(super) const FRESH: u32 = 1 << 30;

static DISABLED: AtomicU32 = AtomicU32::new(0);

/// Parse a comma list of path names into bits; unknown names are ignored.
pub(super) fn parse(list: &str) -> u32 {
    list.split(',').map(str::trim).fold(0, |acc, name| {
        acc | match name {
            "uffd" | "userfaultfd" => UFFD,
            "fresh" => FRESH,
            other => Hooked::ALL
                .iter()
                .find(|h| h.name() == other)
                .map_or(0, |h| h.bit()),
        }
    })
}

pub(super) fn load_from_env() {
    if let Ok(v) = std::env::var("FH_TEST_DISABLE_HOOKS") {
        let bits = parse(&v);
        DISABLED.fetch_or(bits, Relaxed);
        if bits & FRESH != 0 {
            super::hooks::stop_reporting_fresh();
        }
    }
}

pub(super) fn disabled(bit: u32) -> bool {
    DISABLED.load(Relaxed) & bit != 0
}
