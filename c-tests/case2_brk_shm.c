/* Case 2 (brk, System V shm): sbrk shrink then grow again at the same address, shmdt then shmat at
 * the same address, and shmat(SHM_REMAP) of another segment over a registered one. After each,
 * registering the range again must be a miss; a handle taken before stays valid until released.
 *
 * brk has no libc entry to patch (glibc's free calls its internal __sbrk): only userfaultfd sees
 * it, and its events arrive after the fact, so this test waits (up to 5 s) for the invalidation
 * before re-registering. Proof that userfaultfd matters: FH_MONITOR=patch (or none) fails here. */
#include <malloc.h>
#include <sys/ipc.h>
#include <sys/shm.h>
#include <time.h>

#include "case_util.h"

/* Wait until the cache counted more than `inv0` invalidations (the asynchronous uffd path). */
static void wait_invalidation(fh_cache *c, uint64_t inv0, const char *what) {
    for (int i = 0; i < 500; i++) {
        if (fh_test_stats(c).invalidations > inv0) {
            if (i > 0) printf("  %s: invalidation arrived after ~%d ms\n", what, i * 10);
            return;
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "%s: no invalidation within 5 s (is userfaultfd on?)\n", what);
    exit(1);
}

static void brk_shrink(fh_cache *c) {
    size_t page = fh_test_page();
    size_t len = 64 * page;
    /* Warm the cache up first on an unrelated mapping: its lazy first-use allocations (slab chunk,
     * index, hash front, monitor thread) must not move the break between our sbrk calls. */
    char *warm = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(warm != MAP_FAILED);
    fh_mr wm;
    CHECK_OK(fh_register(c, warm, page, FH_ACCESS_LOCAL_WRITE, &wm));
    CHECK_OK(fh_deregister(c, wm.handle));
    /* Page-align the break, then grow it by len: [base, base+len) is ours alone. */
    char *cur = sbrk(0);
    size_t pad = (page - (uintptr_t)cur % page) % page;
    void *old = sbrk((intptr_t)(pad + len));
    CHECK(old != (void *)-1);
    char *base = (char *)old + pad;
    memset(base, 0x5a, len);
    fh_mr held;
    uint64_t inv0 = case_prime(c, base, len, &held);
    /* Nobody else moved the break (malloc has its slack, see main): shrinking releases ours. */
    CHECK((char *)sbrk(0) == base + len);
    CHECK(sbrk(-(intptr_t)len) != (void *)-1); /* brk shrink: the pages are gone */
    wait_invalidation(c, inv0, "brk shrink");
    CHECK(sbrk((intptr_t)len) == base); /* same addresses, fresh zero pages */
    CHECK(base[0] == 0);
    memset(base, 0x11, len);
    case_expect_miss(c, "sbrk shrink + grow", base, len, &held, inv0);
    CHECK((char *)sbrk(0) == base + len);
    CHECK(sbrk(-(intptr_t)len) != (void *)-1);
}

static int new_segment(size_t len) {
    int id = shmget(IPC_PRIVATE, len, IPC_CREAT | 0600);
    CHECK(id >= 0);
    return id;
}

static void shm_paths(fh_cache *c) {
    size_t len = 16 * fh_test_page();
    int id1 = new_segment(len), id2 = new_segment(len);

    /* shmdt, then the other segment attached at the same address. */
    char *a = shmat(id1, NULL, 0);
    CHECK(a != (void *)-1);
    memset(a, 0x5a, len);
    fh_mr held;
    uint64_t inv0 = case_prime(c, a, len, &held);
    CHECK(shmdt(a) == 0);
    CHECK(shmat(id2, a, 0) == a);
    memset(a, 0x22, len);
    case_expect_miss(c, "shmdt + shmat same address", a, len, &held, inv0);

    /* shmat(SHM_REMAP) of segment 1 straight over the attached segment 2. */
    inv0 = case_prime(c, a, len, &held);
    CHECK(shmat(id1, a, SHM_REMAP) == a);
    CHECK(a[0] == 0x5a); /* segment 1's contents: really another segment */
    case_expect_miss(c, "shmat(SHM_REMAP) over", a, len, &held, inv0);

    CHECK(shmdt(a) == 0);
    CHECK(shmctl(id1, IPC_RMID, NULL) == 0);
    CHECK(shmctl(id2, IPC_RMID, NULL) == 0);
}

int main(int argc, char **argv) {
    case_skip_under_asan("the brk half tunes glibc malloc (mallopt), which ASan replaces");
    case_watchdog(60);
    /* Our sbrk calls share the break with malloc: give malloc's heap 64 MiB of slack that it
     * never trims, so no allocation (ours, the library's, stdio's) moves the break meanwhile. */
    CHECK(mallopt(M_TOP_PAD, 64 << 20) == 1);
    CHECK(mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1);
    free(malloc(1));
    printf("case2_brk_shm: break at %p\n", sbrk(0));
    fh_cache *c = case_cache((size_t)256 << 20, 64);
    /* `brk` or `shm` runs one half (for the protection proofs); default: both. */
    const char *only = argc > 1 ? argv[1] : "";
    if (!strcmp(only, "") || !strcmp(only, "brk")) brk_shrink(c);
    if (!strcmp(only, "") || !strcmp(only, "shm")) shm_paths(c);
    CHECK_OK(fh_cache_finalize(c));
    puts("case2_brk_shm: ok");
    return 0;
}
