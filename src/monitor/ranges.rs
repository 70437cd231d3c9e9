//! Which virtual range each libc call takes away, decided before the call runs. Pure functions,
//! so they are unit-tested without touching memory. Ranges are widened to whole pages because the
//! kernel acts on whole pages (a registration in the tail of the last page is gone too).

/// Page size on every Linux target we patch (x86_64); a larger real page only widens less than
/// the kernel does, which [`page_span`] callers accept because the kernel rejects unaligned starts.
pub const PAGE: usize = 4096;

/// [addr, addr+len) widened to whole pages; `None` for an empty or overflowing range.
pub fn page_span(addr: usize, len: usize) -> Option<(usize, usize)> {
    if len == 0 {
        return None;
    }
    let start = addr & !(PAGE - 1);
    let end = addr.checked_add(len)?.checked_add(PAGE - 1)? & !(PAGE - 1);
    Some((start, end - start))
}

/// madvise advice values that drop page contents (so a pinned registration no longer matches the
/// virtual range). MADV_DONTFORK/DOFORK/HUGEPAGE/COLD/PAGEOUT... keep the data: not reported.
pub fn madvise_drops_pages(advice: i32) -> bool {
    const MADV_DONTNEED_LOCKED: i32 = 24;
    matches!(
        advice,
        libc::MADV_DONTNEED | libc::MADV_FREE | libc::MADV_REMOVE | MADV_DONTNEED_LOCKED
    )
}

/// Ranges an `mremap(old, old_size, new_size, flags, new_addr)` may take away (at most two:
/// source part and, with MREMAP_FIXED, whatever was mapped at the destination).
pub fn mremap_ranges(
    old: usize,
    old_size: usize,
    new_size: usize,
    flags: i32,
    new_addr: usize,
) -> [Option<(usize, usize)>; 2] {
    const DONTUNMAP: i32 = 4; // MREMAP_DONTUNMAP: pages move, the old range stays mapped empty.
    let may_move = flags & (libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED | DONTUNMAP) != 0;
    let source = if old_size == 0 {
        // Duplicating a shared mapping: nothing is lost.
        None
    } else if flags & (libc::MREMAP_FIXED | DONTUNMAP) != 0 || (may_move && new_size > old_size) {
        // The whole old range may move to new pages' virtual addresses.
        page_span(old, old_size)
    } else if new_size < old_size {
        // Shrink in place: only the tail goes. (A range that wraps past the top of the address
        // space fails in the kernel: nothing of ours goes, and nothing overflows in a hook.)
        old.checked_add(new_size)
            .and_then(|tail| page_span(tail, old_size - new_size))
    } else {
        None
    };
    let dest = if flags & libc::MREMAP_FIXED != 0 {
        page_span(new_addr, new_size)
    } else {
        None
    };
    [source, dest]
}

/// Range an `mmap` replaces: only MAP_FIXED can clobber an existing mapping
/// (MAP_FIXED_NOREPLACE fails instead, so it is harmless).
pub fn mmap_replaces(addr: usize, len: usize, flags: i32) -> Option<(usize, usize)> {
    if flags & libc::MAP_FIXED != 0 {
        page_span(addr, len)
    } else {
        None
    }
}

/// Addresses a successful `mremap` returning `r` made new (see `UnmapEvent::Fresh`): all of the
/// result if the mapping moved (with MREMAP_FIXED that range was already reported before the
/// call, as `mremap_ranges`' destination), else the part it grew by. None when nothing is new.
pub fn mremap_fresh(
    old: usize,
    old_size: usize,
    new_size: usize,
    flags: i32,
    r: usize,
) -> Option<(usize, usize)> {
    if r != old {
        if flags & libc::MREMAP_FIXED != 0 {
            None
        } else {
            page_span(r, new_size)
        }
    } else if new_size > old_size {
        old.checked_add(old_size)
            .and_then(|tail| page_span(tail, new_size - old_size))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: usize = 1 << 20;

    #[test]
    fn mremap_fresh_is_the_moved_or_grown_part() {
        let (a, b) = (0x10_0000, 0x20_0000);
        // Moved without MREMAP_FIXED: the whole result.
        assert_eq!(
            mremap_fresh(a, M, 2 * M, libc::MREMAP_MAYMOVE, b),
            Some((b, 2 * M))
        );
        // Moved to a fixed destination: reported before the call already.
        let fixed = libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED;
        assert_eq!(mremap_fresh(a, M, M, fixed, b), None);
        // Grown in place: the tail.
        assert_eq!(
            mremap_fresh(a, M, 3 * M, libc::MREMAP_MAYMOVE, a),
            Some((a + M, 2 * M))
        );
        // Shrunk or same size in place: nothing new.
        assert_eq!(mremap_fresh(a, 2 * M, M, 0, a), None);
        assert_eq!(mremap_fresh(a, M, M, 0, a), None);
    }

    #[test]
    fn page_span_widens_and_rejects_empty() {
        assert_eq!(page_span(0x1000, 1), Some((0x1000, PAGE)));
        assert_eq!(page_span(0x1010, PAGE), Some((0x1000, 2 * PAGE)));
        assert_eq!(page_span(0x1000, 0), None);
        assert_eq!(page_span(usize::MAX - 10, 100), None);
    }

    #[test]
    fn madvise_filter() {
        assert!(madvise_drops_pages(libc::MADV_DONTNEED));
        assert!(madvise_drops_pages(libc::MADV_FREE));
        assert!(madvise_drops_pages(libc::MADV_REMOVE));
        assert!(madvise_drops_pages(24));
        assert!(!madvise_drops_pages(libc::MADV_DONTFORK));
        assert!(!madvise_drops_pages(libc::MADV_DOFORK));
        assert!(!madvise_drops_pages(libc::MADV_HUGEPAGE));
        assert!(!madvise_drops_pages(libc::MADV_WILLNEED));
    }

    #[test]
    fn mremap_cases() {
        let a = 0x10_0000_0000usize;
        // Shrink: the tail.
        assert_eq!(
            mremap_ranges(a, 4 * M, M, 0, 0),
            [Some((a + M, 3 * M)), None]
        );
        assert_eq!(
            mremap_ranges(a, 4 * M, M, libc::MREMAP_MAYMOVE, 0),
            [Some((a + M, 3 * M)), None]
        );
        // Grow that may move: everything.
        assert_eq!(
            mremap_ranges(a, M, 4 * M, libc::MREMAP_MAYMOVE, 0),
            [Some((a, M)), None]
        );
        // Grow in place only: nothing lost (it either grows or fails).
        assert_eq!(mremap_ranges(a, M, 4 * M, 0, 0), [None, None]);
        // Fixed move: old range and destination.
        let d = 0x20_0000_0000usize;
        let f = libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED;
        assert_eq!(
            mremap_ranges(a, M, 2 * M, f, d),
            [Some((a, M)), Some((d, 2 * M))]
        );
        // DONTUNMAP: pages leave the old range.
        assert_eq!(
            mremap_ranges(a, M, M, libc::MREMAP_MAYMOVE | 4, 0),
            [Some((a, M)), None]
        );
        // Same size, no move: nothing.
        assert_eq!(
            mremap_ranges(a, M, M, libc::MREMAP_MAYMOVE, 0),
            [None, None]
        );
        // old_size 0 (shared duplicate): nothing from the source.
        assert_eq!(
            mremap_ranges(a, 0, M, libc::MREMAP_MAYMOVE, 0),
            [None, None]
        );
    }

    #[test]
    fn mmap_only_fixed() {
        assert_eq!(
            mmap_replaces(0x1000, 10, libc::MAP_FIXED | libc::MAP_PRIVATE),
            Some((0x1000, PAGE))
        );
        assert_eq!(mmap_replaces(0x1000, 10, libc::MAP_PRIVATE), None);
        assert_eq!(mmap_replaces(0x1000, 10, libc::MAP_FIXED_NOREPLACE), None);
    }
}
