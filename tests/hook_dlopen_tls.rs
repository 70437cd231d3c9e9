//! A hook on a thread that never called the library, when the library was loaded with `dlopen`
//! (a supported way: c-tests/dlclose_patch.c), called by glibc with a malloc arena lock held.
//!
//! A `dlopen`ed shared object's TLS is dynamic (libfirehose.so has `R_X86_64_DTPMOD64` relocations
//! and calls `__tls_get_addr`): glibc allocates a thread's block with `malloc` on that thread's
//! first access. The hook path touched TLS on every call (the guard's flag, before it became a
//! table of slots; `inside::DEPTH` in the revoke listener still does). So the first patched call on a
//! thread that never entered the library mallocs from inside the hook -- and glibc calls the
//! patched `__madvise` from `malloc_trim` (and `__madvise`/`__munmap`/`mmap(MAP_FIXED)` from
//! `heap_trim`/`shrink_heap`/`delete_heap` in `free` on a non-main arena) with the arena lock
//! held: the thread waits for its own arena lock forever.
//!
//! The C program below: `dlopen`s libfirehose.so, makes a cache with libc patching on another
//! thread (as dlclose_patch.c does), then on the main thread (which never entered the library)
//! frees a heap chunk and calls `malloc_trim(0)` (with its tcache bin for the 128-byte TLS block
//! empty, so the hook's malloc must take the arena lock). Expected: "ok" and exit 0. A watchdog thread
//! exits with status 3 after 10 s.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

const PROGRAM: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "firehose.h"

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) { fprintf(stderr, "dlsym(%s) failed\n", name); _exit(1); }
    return p;
}

static void *setup(void *lib) {
    fh_status (*config_init)(fh_config *) = sym(lib, "fh_config_init");
    fh_status (*cache_new)(const fh_config *, fh_cache **) = sym(lib, "fh_cache_new");
    fh_config cfg;
    if (config_init(&cfg) != FH_OK) _exit(1);
    cfg.backend = FH_BACKEND_MLOCK;
    cfg.monitor = FH_MONITOR_PATCH_LIBC;
    fh_cache *c = NULL;
    if (cache_new(&cfg, &c) != FH_OK) { fprintf(stderr, "fh_cache_new failed\n"); _exit(1); }
    return c; /* kept: its listener stays subscribed */
}

static void *watchdog(void *arg) {
    (void)arg;
    sleep(10);
    static const char msg[] = "DEADLOCK: malloc_trim did not return within 10 s\n";
    write(2, msg, sizeof msg - 1);
    _exit(3);
}

int main(int argc, char **argv) {
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }
    pthread_t t, w;
    void *cache = NULL;
    if (pthread_create(&t, NULL, setup, lib) != 0) return 1;
    pthread_join(t, &cache);
    if (pthread_create(&w, NULL, watchdog, NULL) != 0) return 1;
    /* A free chunk of whole pages in the main arena, not at the top (q keeps it off). */
    char *p = malloc(100 * 1024);
    char *q = malloc(64);
    memset(p, 1, 100 * 1024);
    free(p);
    /* Empty this thread's tcache bin of the size the TLS block takes (128 bytes): a bin that
       happens to hold a chunk serves the hook's malloc without the arena lock. (An empty bin is
       the common case; set GLIBC_TUNABLES=glibc.malloc.tcache_count=0 to see it without this.) */
    for (int i = 0; i < 16; i++) (void)malloc(128);
    static const char trimming[] = "trimming\n";
    write(2, trimming, sizeof trimming - 1);
    /* main arena lock held -> __madvise(MADV_DONTNEED) -> patched hook -> first TLS access on
       this thread -> __tls_get_addr -> malloc -> main arena lock */
    malloc_trim(0);
    static const char ok[] = "ok\n";
    write(1, ok, sizeof ok - 1);
    (void)q;
    _exit(0);
}
"#;

fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    for p in [deps.join("../libfirehose.so"), deps.join("libfirehose.so")] {
        if p.exists() {
            return p.canonicalize().unwrap();
        }
    }
    panic!("libfirehose.so not built next to {}", exe.display());
}

#[test]
fn first_hook_on_a_thread_under_malloc_lock_does_not_deadlock() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hook_audit_dlopen_tls");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("prog.c");
    let bin = dir.join("prog");
    std::fs::write(&src, PROGRAM).unwrap();
    let include = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("include");
    let cc = Command::new("cc")
        .arg("-O0")
        .arg("-g")
        .arg("-I")
        .arg(&include)
        .arg(&src)
        .arg("-o")
        .arg(&bin)
        .args(["-ldl", "-lpthread"])
        .output()
        .expect("cc");
    assert!(
        cc.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let t0 = Instant::now();
    let out = Command::new(&bin).arg(library()).output().unwrap();
    let took = t0.elapsed();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && text.contains("ok") && took < Duration::from_secs(9),
        "status {:?} after {took:?}: {text}",
        out.status
    );
}
