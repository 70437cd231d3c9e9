//! libc entry patching (userfaultfd off): every unmap path is reported synchronously, before the
//! call returns, including glibc's internal calls from free/realloc/malloc_trim.

mod monitor_util;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

use firehose::monitor::{self, MemoryListener, MonitorOptions};
use monitor_util::{env_with, in_child, map, run_in_child, serial, Env, PAGE};

fn env() -> &'static Env {
    env_with(
        MonitorOptions {
            patch_libc: true,
            userfaultfd: false,
        },
        |st| {
            assert_eq!(st.patched, 0b11_1111, "all six functions patched: {st:?}");
            assert!(!st.uffd);
        },
    )
}

const MIB: usize = 1 << 20;

#[test]
fn free_of_64mib_chunk_is_seen() {
    let _s = serial();
    let e = env();
    e.rec.clear();
    let mut v = vec![7u8; 64 * MIB];
    let p = v.as_mut_ptr() as usize;
    drop(v); // glibc: free -> munmap_chunk -> internal __munmap
    assert!(
        e.rec.saw_cover(p, 64 * MIB),
        "free of an mmapped chunk not reported"
    );
}

#[test]
fn munmap_partial_and_whole() {
    let _s = serial();
    let e = env();
    let a = map(8 * PAGE);
    e.rec.clear(); // (the mmap reported its new range)
                   // SAFETY: our mapping.
    assert_eq!(
        unsafe { libc::munmap((a + 2 * PAGE) as *mut _, 2 * PAGE) },
        0
    );
    assert!(e.rec.saw_cover(a + 2 * PAGE, 2 * PAGE));
    assert!(
        !e.rec.saw_overlap(a, 2 * PAGE),
        "partial munmap reported too much"
    );
    assert!(!e.rec.saw_overlap(a + 4 * PAGE, 4 * PAGE));
    // Unaligned length is widened to the page the kernel removes.
    // SAFETY: our mapping.
    assert_eq!(unsafe { libc::munmap(a as *mut _, PAGE + 1) }, 0);
    assert!(e.rec.saw_cover(a, 2 * PAGE));
    // SAFETY: our mapping.
    assert_eq!(
        unsafe { libc::munmap((a + 4 * PAGE) as *mut _, 4 * PAGE) },
        0
    );
    assert!(e.rec.saw_cover(a + 4 * PAGE, 4 * PAGE));
    // Errors still come back like glibc's: EINVAL for an unaligned address, errno set.
    // SAFETY: invalid request, the kernel refuses it.
    assert_eq!(unsafe { libc::munmap((a + 1) as *mut _, PAGE) }, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EINVAL)
    );
}

#[test]
fn mremap_shrink_grow_move() {
    let _s = serial();
    let e = env();
    let a = map(8 * PAGE);
    e.rec.clear(); // (the mmap reported its new range)
                   // Shrink: only the tail.
                   // SAFETY: our mapping.
    let r = unsafe { libc::mremap(a as *mut _, 8 * PAGE, 2 * PAGE, 0) };
    assert_eq!(r as usize, a);
    assert!(e.rec.saw_cover(a + 2 * PAGE, 6 * PAGE));
    assert!(!e.rec.saw_overlap(a, 2 * PAGE));
    // Grow that may move: the whole old range.
    e.rec.clear();
    // SAFETY: our mapping.
    let b =
        unsafe { libc::mremap(a as *mut _, 2 * PAGE, 64 * PAGE, libc::MREMAP_MAYMOVE) } as usize;
    assert_ne!(b, libc::MAP_FAILED as usize);
    assert!(e.rec.saw_cover(a, 2 * PAGE));
    // Fixed move onto another mapping: old range and the clobbered destination.
    let d = map(64 * PAGE);
    e.rec.clear();
    let f = libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED;
    // SAFETY: both mappings are ours; the destination is replaced.
    let c = unsafe { libc::mremap(b as *mut _, 64 * PAGE, 64 * PAGE, f, d as *mut libc::c_void) }
        as usize;
    assert_eq!(c, d);
    assert!(e.rec.saw_cover(b, 64 * PAGE));
    assert!(e.rec.saw_cover(d, 64 * PAGE));
    // SAFETY: our mapping.
    unsafe { libc::munmap(d as *mut _, 64 * PAGE) };
    // Unknown flag bits: EINVAL like glibc, nothing reported.
    e.rec.clear();
    // SAFETY: invalid request.
    let r = unsafe { libc::mremap(a as *mut _, PAGE, PAGE, 0x100) };
    assert_eq!(r, libc::MAP_FAILED);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EINVAL)
    );
    assert_eq!(e.rec.count(), 0);
}

#[test]
fn realloc_of_big_buffer_is_seen_and_works() {
    let _s = serial();
    let e = env();
    let mut v = vec![3u8; 16 * MIB];
    let p = v.as_ptr() as usize;
    e.rec.clear(); // (malloc's mmap reported the new chunk)
    v.resize(200 * MIB, 4); // realloc -> mremap(MAYMOVE) of the mmapped chunk
    assert!(v[..16 * MIB].iter().all(|&b| b == 3) && v[16 * MIB..].iter().all(|&b| b == 4));
    assert!(
        e.rec.saw_overlap(p, 16 * MIB),
        "realloc growth not reported"
    );
}

#[test]
fn madvise_drop_advice_reported_dontfork_not() {
    let _s = serial();
    let e = env();
    let a = map(16 * PAGE);
    for (i, adv) in [libc::MADV_DONTNEED, libc::MADV_FREE]
        .into_iter()
        .enumerate()
    {
        e.rec.clear();
        let at = a + i * 2 * PAGE;
        // SAFETY: our mapping.
        assert_eq!(unsafe { libc::madvise(at as *mut _, 2 * PAGE, adv) }, 0);
        assert!(e.rec.saw_cover(at, 2 * PAGE), "advice {adv} not reported");
    }
    for adv in [
        libc::MADV_DONTFORK,
        libc::MADV_DOFORK,
        libc::MADV_WILLNEED,
        libc::MADV_NORMAL,
    ] {
        e.rec.clear();
        // SAFETY: our mapping; advice that keeps the data.
        assert_eq!(unsafe { libc::madvise(a as *mut _, 16 * PAGE, adv) }, 0);
        assert_eq!(e.rec.count(), 0, "advice {adv} must not invalidate");
    }
    // SAFETY: our mapping.
    unsafe { libc::munmap(a as *mut _, 16 * PAGE) };
    // MADV_REMOVE needs a shared (shmem) mapping.
    // SAFETY: new shared anonymous mapping.
    let s = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4 * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    } as usize;
    e.rec.clear();
    // SAFETY: our mapping.
    assert_eq!(
        unsafe { libc::madvise(s as *mut _, 4 * PAGE, libc::MADV_REMOVE) },
        0
    );
    assert!(e.rec.saw_cover(s, 4 * PAGE));
    // SAFETY: our mapping.
    unsafe { libc::munmap(s as *mut _, 4 * PAGE) };
}

#[test]
fn mmap_fixed_over_range_reported_plain_mmap_only_its_new_range() {
    let _s = serial();
    let e = env();
    let a = map(8 * PAGE);
    e.rec.clear();
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    let fl = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    // SAFETY: replaces part of our own mapping.
    let r = unsafe {
        libc::mmap(
            (a + 2 * PAGE) as *mut _,
            3 * PAGE,
            rw,
            fl | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    assert_eq!(r as usize, a + 2 * PAGE);
    assert!(e.rec.saw_cover(a + 2 * PAGE, 3 * PAGE));
    assert!(!e.rec.saw_overlap(a, 2 * PAGE));
    e.rec.clear();
    let b = map(PAGE);
    // A plain mmap reports its new range once it returns (`UnmapEvent::Fresh`), and nothing else.
    assert_eq!(e.rec.count(), 1, "plain mmap reports only its new range");
    assert!(e.rec.saw_cover(b, PAGE));
    // Offset not page aligned: EINVAL before the syscall, like glibc.
    // SAFETY: invalid request.
    let r = unsafe { libc::mmap(std::ptr::null_mut(), PAGE, rw, fl, -1, 100) };
    assert_eq!(r, libc::MAP_FAILED);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EINVAL)
    );
    // SAFETY: our mappings.
    unsafe {
        libc::munmap(a as *mut _, 8 * PAGE);
        libc::munmap(b as *mut _, PAGE);
    }
}

#[test]
fn shmdt_and_shmat_remap_reported() {
    let _s = serial();
    let e = env();
    let size = 5 * PAGE + 100; // the kernel maps whole pages: 6
                               // SAFETY: private segment, removed below.
    let id = unsafe { libc::shmget(libc::IPC_PRIVATE, size, libc::IPC_CREAT | 0o600) };
    assert!(id >= 0);
    // SAFETY: attach anywhere.
    let a = unsafe { libc::shmat(id, std::ptr::null(), 0) } as usize;
    assert_ne!(a, usize::MAX);
    e.rec.clear();
    // SAFETY: our attachment.
    assert_eq!(unsafe { libc::shmdt(a as *const _) }, 0);
    assert!(e.rec.saw_cover(a, 6 * PAGE), "shmdt not reported");
    // shmat(SHM_REMAP) over an existing private mapping replaces it.
    let m = map(8 * PAGE);
    e.rec.clear();
    // SAFETY: replaces our own mapping at m.
    let b = unsafe { libc::shmat(id, m as *const _, libc::SHM_REMAP) } as usize;
    assert_eq!(b, m);
    assert!(
        e.rec.saw_cover(m, 6 * PAGE),
        "shmat(SHM_REMAP) not reported"
    );
    // Plain shmat does not invalidate anything.
    e.rec.clear();
    // SAFETY: attach anywhere.
    let c = unsafe { libc::shmat(id, std::ptr::null(), 0) } as usize;
    assert_eq!(e.rec.count(), 0);
    // SAFETY: our attachments/mapping and segment.
    unsafe {
        libc::shmdt(b as *const _);
        libc::shmdt(c as *const _);
        libc::munmap((m + 6 * PAGE) as *mut _, 2 * PAGE);
        libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut());
    }
}

/// A listener that frees and unmaps memory itself: nested events are dropped, no deadlock.
/// (Other threads of the test process also unmap, e.g. exiting test threads free their stacks,
/// so calls are told apart by their sizes.)
struct Unmapper {
    trigger_addr: AtomicUsize,
    triggers: AtomicUsize,
    nested_seen: AtomicUsize,
    nested_addr: AtomicUsize,
}

const TRIGGER: usize = 3 * PAGE; // same size as std's sigaltstack: tell apart by address
const NESTED: usize = 7 * PAGE;

impl MemoryListener for Unmapper {
    fn on_unmap(&self, addr: usize, len: usize) {
        if len == NESTED && addr == self.nested_addr.load(SeqCst) {
            self.nested_seen.fetch_add(1, SeqCst);
        }
        if len == TRIGGER && addr == self.trigger_addr.load(SeqCst) {
            self.triggers.fetch_add(1, SeqCst);
            let a = map(NESTED);
            self.nested_addr.store(a, SeqCst);
            // SAFETY: our mapping.
            unsafe { libc::munmap(a as *mut _, NESTED) };
            let v = vec![1u8; 4 * MIB]; // malloc + free (mmapped chunk -> __munmap)
            drop(v);
        }
    }
}

#[test]
fn listener_that_unmaps_does_not_recurse_or_deadlock() {
    let _s = serial();
    let e = env();
    let a = map(TRIGGER);
    let l = Arc::new(Unmapper {
        trigger_addr: AtomicUsize::new(a),
        triggers: AtomicUsize::new(0),
        nested_seen: AtomicUsize::new(0),
        nested_addr: AtomicUsize::new(0),
    });
    let sub = monitor::subscribe(l.clone());
    e.rec.clear();
    // SAFETY: our mapping.
    unsafe { libc::munmap(a as *mut _, TRIGGER) };
    // No recursion: the listener ran once for the trigger...
    assert_eq!(l.triggers.load(SeqCst), 1);
    assert!(e.rec.saw_cover(a, TRIGGER));
    // ...and the munmap it made itself was not lost: once it returned, everyone was told of a
    // range covering it (merged with the 4 MiB chunk its Vec freed, so wider than the mapping).
    assert!(e.rec.saw_cover(l.nested_addr.load(SeqCst), NESTED));
    drop(sub);
    // After the listener returned, the same thread reports again (the guard was released).
    let b = map(NESTED);
    e.rec.clear(); // (the mmap reported its new range)
                   // SAFETY: our mapping.
    unsafe { libc::munmap(b as *mut _, NESTED) };
    assert!(e.rec.saw_cover(b, NESTED));
}

#[test]
fn forty_thousand_cycles_do_not_grow_rss() {
    let _s = serial();
    let _e = env();
    struct Nothing;
    impl MemoryListener for Nothing {
        fn on_unmap(&self, _: usize, _: usize) {}
    }
    let sub = monitor::subscribe(Arc::new(Nothing));
    for _ in 0..1000 {
        let a = map(4 * PAGE);
        // SAFETY: our mapping.
        unsafe { libc::munmap(a as *mut _, 4 * PAGE) };
    }
    let before = monitor_util::rss();
    for _ in 0..40_000 {
        let a = map(4 * PAGE);
        // SAFETY: our mapping.
        unsafe { libc::munmap(a as *mut _, 4 * PAGE) };
    }
    let grown = monitor_util::rss().saturating_sub(before);
    assert!(grown < 512 * 1024, "RSS grew {grown} bytes");
    drop(sub);
}

/// glibc's malloc_trim on the brk heap: which part do the hooks see? Interior free pages go
/// through the internal __madvise(MADV_DONTNEED) (seen here); the top of the heap is returned by
/// __sbrk (brk), which no hook sees (that part is left to userfaultfd, see monitor_uffd.rs).
#[test]
fn malloc_trim_interior_pages_seen_through_madvise() {
    if !in_child() {
        // One arena, so this thread's mallocs come from the brk heap.
        return run_in_child(
            "malloc_trim_interior_pages_seen_through_madvise",
            &[("MALLOC_ARENA_MAX", "1")],
        );
    }
    let e = env();
    // Chunks below the mmap threshold, so they live on the brk heap.
    let blocks: Vec<Vec<u8>> = (0..256).map(|_| vec![5u8; 64 * 1024]).collect();
    let heap = find_heap().expect("a [heap] mapping");
    assert!(blocks
        .iter()
        .all(|b| (b.as_ptr() as usize) >= heap.0 && (b.as_ptr() as usize) < heap.1));
    let spans: Vec<(usize, usize)> = blocks
        .iter()
        .map(|b| (b.as_ptr() as usize, b.len()))
        .collect();
    // Free every other block (interior holes that cannot be trimmed by brk) and the top ones.
    let mut kept = vec![];
    for (i, b) in blocks.into_iter().enumerate() {
        if i % 2 == 0 && i < 200 {
            kept.push(b);
        }
    }
    e.rec.clear();
    // SAFETY: plain glibc call.
    unsafe { libc::malloc_trim(0) };
    let holes_seen = spans
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 2 == 1 && *i < 200)
        .filter(|(_, &(p, l))| e.rec.saw_overlap(p, l))
        .count();
    assert!(
        holes_seen >= 90,
        "madvise from malloc_trim seen for only {holes_seen} of 100 holes"
    );
    drop(kept);
}

fn find_heap() -> Option<(usize, usize)> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let line = maps.lines().find(|l| l.ends_with("[heap]"))?;
    let r = line.split_whitespace().next()?;
    let (s, e) = r.split_once('-')?;
    Some((
        usize::from_str_radix(s, 16).ok()?,
        usize::from_str_radix(e, 16).ok()?,
    ))
}
