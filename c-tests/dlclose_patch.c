/* libfirehose.so loaded with dlopen: a cache with the libc-patching monitor is
 * made, used and freed, then the library is dlclose()d. libc's munmap/madvise/mremap entries stay
 * patched to jump into the library, so the library must never be unmapped (it is linked with
 * `-z nodelete`): afterwards mmap/munmap/malloc/free/madvise must keep working, and this process
 * exits 0. Without that link flag the first munmap after dlclose jumps into unmapped memory
 * (SIGSEGV).
 *
 * The library is used on a thread that has exited before the dlclose: a thread that used it
 * still has thread-local destructors of the library registered, and glibc keeps a library loaded
 * while any are pending, which would hide the bug.
 *
 * Not linked against libfirehose: ctest passes the path of the built library as argv[1]. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "firehose.h"

#define FAIL(...)                                                                            \
    do {                                                                                     \
        fprintf(stderr, "dlclose_patch: " __VA_ARGS__);                                      \
        fputc('\n', stderr);                                                                 \
        exit(1);                                                                             \
    } while (0)

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) FAIL("dlsym(%s): %s", name, dlerror());
    return p;
}

/* Is a file whose path ends in `name` still mapped? */
static int still_mapped(const char *name) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[4096];
    int found = 0;
    size_t n = strlen(name);
    while (fgets(line, sizeof(line), f)) {
        size_t l = strlen(line);
        if (l && line[l - 1] == '\n') line[--l] = 0;
        if (l >= n && strcmp(line + l - n, name) == 0) found = 1;
    }
    fclose(f);
    return found;
}

static void *use_library(void *lib) {

    fh_status (*config_init)(fh_config *) = sym(lib, "fh_config_init");
    fh_status (*cache_new)(const fh_config *, fh_cache **) = sym(lib, "fh_cache_new");
    fh_status (*reg)(fh_cache *, const void *, size_t, uint32_t, fh_mr *) = sym(lib, "fh_register");
    fh_status (*dereg)(fh_cache *, uint64_t) = sym(lib, "fh_deregister");
    void (*cache_free)(fh_cache *) = sym(lib, "fh_cache_free");

    fh_config cfg;
    if (config_init(&cfg) != FH_OK) FAIL("fh_config_init");
    cfg.backend = FH_BACKEND_MLOCK;
    cfg.monitor = FH_MONITOR_PATCH_LIBC; /* the path that rewrites libc's code */
    fh_cache *c = NULL;
    fh_status st = cache_new(&cfg, &c);
    if (st != FH_OK) FAIL("fh_cache_new: %d", (int)st);

    size_t len = 1 << 20;
    char *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) FAIL("mmap");
    memset(buf, 1, len);
    fh_mr mr;
    st = reg(c, buf, len, FH_ACCESS_LOCAL_WRITE, &mr);
    if (st != FH_OK) FAIL("fh_register: %d", (int)st);
    if (dereg(c, mr.handle) != FH_OK) FAIL("fh_deregister");
    if (munmap(buf, len) != 0) FAIL("munmap while loaded"); /* goes through the hook */
    cache_free(c);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) FAIL("usage: %s /path/to/libfirehose.so", argv[0]);
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) FAIL("dlopen(%s): %s", argv[1], dlerror());
    pthread_t t;
    if (pthread_create(&t, NULL, use_library, lib) != 0) FAIL("pthread_create");
    pthread_join(t, NULL);

    const char *base = strrchr(argv[1], '/');
    base = base ? base + 1 : argv[1];
    if (dlclose(lib) != 0) FAIL("dlclose: %s", dlerror());
    printf("dlclose_patch: library closed (%s); using the unmap family now\n",
           still_mapped(base) == 1 ? "still mapped" : "unmapped");
    fflush(stdout);

    for (int i = 0; i < 64; i++) {
        size_t n = (size_t)4096 << (i % 8);
        char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) FAIL("mmap after dlclose");
        memset(p, 2, n);
        if (madvise(p, n, MADV_DONTNEED) != 0) FAIL("madvise after dlclose");
        if (munmap(p, n) != 0) FAIL("munmap after dlclose");
        char *m = malloc(n * 64); /* large: glibc mmaps it and munmaps it in free() */
        if (!m) FAIL("malloc");
        memset(m, 3, n * 64);
        free(m);
    }
    /* The library's atfork handlers are still registered: fork must work too. */
    pid_t pid = fork();
    if (pid < 0) FAIL("fork");
    if (pid == 0) {
        char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        _exit(p != MAP_FAILED && munmap(p, 4096) == 0 ? 0 : 1);
    }
    int st = 0;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        FAIL("forked child after dlclose: status %#x", st);
    printf("dlclose_patch: ok\n");
    return 0;
}
