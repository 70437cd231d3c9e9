/* Case 4: hook re-entrancy. glibc is tuned so that nearly every free() unmaps or trims (munmap /
 * madvise from inside free, i.e. from inside the allocator, also while the library itself is
 * freeing its own metadata under its cache lock). 8 threads malloc/register/free large and small
 * blocks (some freed while still registered), one thread flushes and changes limits (the paths
 * that unpin and free metadata), and another churns mmap/munmap next to them. No deadlock (the
 * alarm() watchdog fails the test), every call returns a defined status, and at the end the
 * counters add up and nothing is left in use.
 *
 * The library has no logging of its own to turn on; this test prints progress from the workers. */
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>

#include "case_util.h"

#define WORKERS 8
#define ITERS 1500

static fh_cache *cache;
static atomic_ulong registrations;
static atomic_int stop;

static void *worker(void *arg) {
    uint64_t seed = (uintptr_t)arg;
    for (int i = 0; i < ITERS; i++) {
        /* 4 KiB .. 1 MiB: around the (lowered) mmap threshold, so both unmap and trim paths run. */
        size_t len = 4096 + (size_t)(fh_rand(&seed) % (1u << 20));
        char *p = malloc(len);
        CHECK(p != NULL);
        p[0] = (char)i;
        p[len - 1] = (char)i;
        fh_mr mr;
        fh_status st = fh_register(cache, p, len, FH_ACCESS_LOCAL_WRITE, &mr);
        CHECK(st == FH_OK);
        atomic_fetch_add(&registrations, 1);
        /* Small allocations while holding the registration: metadata paths allocate too. */
        void *small[4];
        for (int k = 0; k < 4; k++) small[k] = malloc(32 + fh_rand(&seed) % 4000);
        if (fh_rand(&seed) % 3 == 0) {
            free(p); /* freed while still registered: the hook runs, the handle stays valid */
            CHECK_OK(fh_deregister(cache, mr.handle));
        } else {
            CHECK_OK(fh_deregister(cache, mr.handle));
            free(p);
        }
        for (int k = 0; k < 4; k++) free(small[k]);
        if (i % 500 == 0) fprintf(stderr, "  worker %lu: %d/%d\n", (unsigned long)(uintptr_t)arg, i, ITERS);
    }
    return NULL;
}

/* Paths that unpin and free the cache's own metadata (with its lock held) while hooks fire. */
static void *flusher(void *arg) {
    (void)arg;
    unsigned n = 0;
    while (!atomic_load(&stop)) {
        size_t unpinned;
        CHECK_OK(fh_flush(cache, &unpinned));
        n++;
        CHECK_OK(fh_set_limits(cache, (n % 2) ? (size_t)8 << 20 : (size_t)256 << 20, 32 + n % 64));
        fh_stats s;
        CHECK_OK(fh_get_stats(cache, &s));
    }
    return NULL;
}

static void *mapper(void *arg) {
    (void)arg;
    while (!atomic_load(&stop)) {
        void *m = mmap(NULL, 64 << 10, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(m != MAP_FAILED);
        ((char *)m)[0] = 1;
        CHECK(munmap(m, 64 << 10) == 0);
    }
    return NULL;
}

int main(void) {
    case_skip_under_asan("drives glibc malloc trimming (mallopt), which ASan replaces");
    case_watchdog(100);
    /* Everything from 32 KiB up is mmapped (free = munmap), and the heaps trim at once. */
    CHECK(mallopt(M_MMAP_THRESHOLD, 32 << 10) == 1);
    CHECK(mallopt(M_TRIM_THRESHOLD, 4096) == 1);
    cache = case_cache((size_t)256 << 20, 64);

    pthread_t w[WORKERS], f, m;
    CHECK(pthread_create(&f, NULL, flusher, NULL) == 0);
    CHECK(pthread_create(&m, NULL, mapper, NULL) == 0);
    for (uintptr_t i = 0; i < WORKERS; i++) CHECK(pthread_create(&w[i], NULL, worker, (void *)i) == 0);
    for (int i = 0; i < WORKERS; i++) CHECK(pthread_join(w[i], NULL) == 0);
    atomic_store(&stop, 1);
    CHECK(pthread_join(f, NULL) == 0);
    CHECK(pthread_join(m, NULL) == 0);

    fh_stats s = fh_test_stats(cache);
    printf("case4: %lu registrations: %llu hits, %llu misses, %llu invalidations, %llu evictions\n",
           atomic_load(&registrations), (unsigned long long)s.hits, (unsigned long long)s.misses,
           (unsigned long long)s.invalidations, (unsigned long long)s.evictions);
    CHECK_EQ_U64(s.hits + s.misses, (uint64_t)WORKERS * ITERS);
    CHECK_EQ_U64(s.in_use, 0);
    CHECK(s.invalidations > 0); /* the frees were seen */
    CHECK_EQ_U64(s.pin_failures, 0);
    CHECK_OK(fh_cache_finalize(cache));
    puts("case4_reentrancy: ok");
    return 0;
}
