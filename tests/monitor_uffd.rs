//! userfaultfd alone (patching off): events for watched mappings arrive even when no hook can see
//! the call (raw syscalls, glibc's internal __sbrk trimming the heap).

mod monitor_util;

use std::sync::{Arc, OnceLock};

use firehose::cache::RangeWatcher;
use firehose::monitor::{self, MonitorOptions, Subscription, UffdWatcher};
use monitor_util::{in_child, map, run_in_child, serial, Recorder, PAGE};

struct Env {
    rec: Arc<Recorder>,
    _sub: Subscription,
}

fn env() -> &'static Env {
    static E: OnceLock<Env> = OnceLock::new();
    E.get_or_init(|| {
        let st = monitor::install(MonitorOptions {
            patch_libc: false,
            userfaultfd: true,
        });
        assert_eq!(st.patched, 0);
        assert!(st.uffd, "userfaultfd unavailable: {st:?}");
        let rec = Recorder::new();
        let sub = monitor::subscribe(rec.clone());
        Env { rec, _sub: sub }
    })
}

const MIB: usize = 1 << 20;

#[test]
fn raw_munmap_of_watched_mapping_is_reported() {
    let _s = serial();
    let e = env();
    let a = map(16 * PAGE);
    // Watch a sub-range: the whole mapping is registered (no VMA split).
    UffdWatcher.watch(a + 4 * PAGE, PAGE);
    assert_eq!(monitor::uffd_watch(a, 16 * PAGE), 0, "already registered");
    e.rec.clear();
    // SAFETY: our mapping; a raw syscall that no libc hook sees.
    assert_eq!(
        unsafe { libc::syscall(libc::SYS_munmap, a + 8 * PAGE, 8 * PAGE) },
        0
    );
    assert!(
        e.rec.wait_cover(a + 8 * PAGE, 8 * PAGE),
        "UNMAP event not delivered"
    );
    assert!(!e.rec.saw_overlap(a, 8 * PAGE));
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_munmap, a, 8 * PAGE) };
    assert!(e.rec.wait_cover(a, 8 * PAGE));
}

#[test]
fn raw_madvise_and_mremap_are_reported() {
    let _s = serial();
    let e = env();
    let a = map(16 * PAGE);
    UffdWatcher.watch(a, PAGE);
    e.rec.clear();
    // SAFETY: our mapping.
    unsafe { libc::syscall(libc::SYS_madvise, a, 4 * PAGE, libc::MADV_DONTNEED) };
    assert!(e.rec.wait_cover(a, 4 * PAGE), "REMOVE event not delivered");
    e.rec.clear();
    // SAFETY: our mapping; grow and move.
    let b = unsafe {
        libc::syscall(
            libc::SYS_mremap,
            a,
            16 * PAGE,
            4096 * PAGE,
            libc::MREMAP_MAYMOVE,
        )
    } as usize;
    assert_ne!(b as isize, -1);
    if b != a {
        assert!(e.rec.wait_cover(a, 16 * PAGE), "REMAP event not delivered");
    }
    // SAFETY: our mapping.
    unsafe { libc::munmap(b as *mut _, 4096 * PAGE) };
}

#[test]
fn free_of_watched_64mib_chunk_is_reported() {
    let _s = serial();
    let e = env();
    let v = vec![9u8; 64 * MIB];
    let p = v.as_ptr() as usize;
    UffdWatcher.watch(p, 64 * MIB);
    e.rec.clear();
    drop(v);
    assert!(e.rec.wait_cover(p, 64 * MIB));
}

#[test]
fn realloc_growth_of_watched_buffer_still_works() {
    let _s = serial();
    let e = env();
    let mut v = vec![3u8; 32 * MIB];
    // Watch a piece in the middle: must not split the mapping (mremap across split VMAs fails).
    UffdWatcher.watch(v.as_ptr() as usize + 5 * MIB, 64 * 1024);
    let p = v.as_ptr() as usize;
    e.rec.clear();
    v.resize(300 * MIB, 4);
    assert_eq!(v.len(), 300 * MIB);
    assert!(v[..32 * MIB].iter().all(|&b| b == 3) && v[32 * MIB..].iter().all(|&b| b == 4));
    if v.as_ptr() as usize != p {
        assert!(
            e.rec.wait_cover(p, 32 * MIB),
            "move by realloc not reported"
        );
    }
    let st = monitor::status();
    assert!(st.uffd_registered >= 1 && st.uffd_events >= 1, "{st:?}");
}

#[test]
fn file_backed_mapping_is_refused_and_counted() {
    let _s = serial();
    let _e = env();
    let before = monitor::status().uffd_unsupported;
    let f = std::fs::File::open("/proc/self/exe").unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: read-only private file mapping, unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            PAGE,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    monitor::uffd_watch(p as usize, PAGE);
    let after = monitor::status().uffd_unsupported;
    // SAFETY: our mapping.
    unsafe { libc::munmap(p, PAGE) };
    assert_eq!(
        after,
        before + 1,
        "shared file mapping should be refused for WP and counted"
    );
}

/// The brk heap: glibc trims it with __sbrk (no hook can see that); userfaultfd reports it.
/// Runs in a child with one malloc arena, so the allocations come from the brk heap.
#[test]
fn brk_heap_trim_is_reported() {
    if !in_child() {
        return run_in_child("brk_heap_trim_is_reported", &[("MALLOC_ARENA_MAX", "1")]);
    }
    let e = env();
    let blocks: Vec<Vec<u8>> = (0..256).map(|_| vec![5u8; 64 * 1024]).collect();
    let top = blocks.last().unwrap().as_ptr() as usize;
    UffdWatcher.watch(top, 64 * 1024);
    e.rec.clear();
    // Freeing the top blocks makes a large free top chunk; free() trims it with __sbrk(-n).
    drop(blocks);
    // SAFETY: plain glibc call (trims whatever free() left).
    unsafe { libc::malloc_trim(0) };
    assert!(
        e.rec.wait_cover(top, 64 * 1024),
        "brk shrink of the watched heap not reported"
    );
}

/// Direct sbrk shrink, the same kernel path, in a child (nothing else may move the break).
#[test]
fn sbrk_shrink_is_reported() {
    if !in_child() {
        return run_in_child("sbrk_shrink_is_reported", &[("MALLOC_ARENA_MAX", "1")]);
    }
    let e = env();
    // SAFETY: we grow the break, use, and shrink exactly what we added; the test runs alone.
    unsafe {
        let base = libc::sbrk(0) as usize;
        assert_ne!(libc::sbrk((4 * MIB) as libc::intptr_t) as isize, -1);
        std::ptr::write_bytes(base as *mut u8, 1, 4 * MIB);
        UffdWatcher.watch(base, 4 * MIB);
        e.rec.clear();
        libc::sbrk(-((2 * MIB) as libc::intptr_t));
        assert!(
            e.rec.wait_cover(base + 2 * MIB, 2 * MIB),
            "brk shrink not reported"
        );
        libc::sbrk(-((2 * MIB) as libc::intptr_t));
    }
}

/// After fork the child must not register its memory with the parent's userfaultfd context: it
/// opens its own on its first watch, and its events reach its listeners.
#[test]
fn forked_child_gets_its_own_userfaultfd() {
    let _s = serial();
    let e = env();
    let a = map(4 * PAGE);
    UffdWatcher.watch(a, PAGE); // parent's context, reader started
                                // SAFETY: the child only uses async-signal-tolerant paths of glibc (malloc is fork-safe in
                                // glibc) and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let b = map(4 * PAGE);
        e.rec.clear();
        let newly = monitor::uffd_watch(b, PAGE);
        // SAFETY: raw munmap of the child's own mapping.
        unsafe { libc::syscall(libc::SYS_munmap, b, 4 * PAGE) };
        let ok = newly == 1 && e.rec.wait_cover(b, 4 * PAGE);
        // SAFETY: leave the child without running the parent's atexit/test machinery.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waiting for our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child status {status}"
    );
    // SAFETY: our mapping.
    unsafe { libc::munmap(a as *mut _, 4 * PAGE) };
}
