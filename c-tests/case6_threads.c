/* Case 6: 16 threads register/deregister overlapping ranges (of their own mapping and of one shared
 * mapping), malloc/register/free buffers, and remap their own mapping now and then, while another
 * thread keeps unmapping and re-mapping the shared mapping. No deadlock (alarm() watchdog) and no
 * stale hit.
 *
 * How a stale hit is detected without a NIC: the mlock backend hands out a fresh key per pin (a
 * process-wide counter), so a key identifies one pin of one set of pages. Each mapping ("area")
 * has a generation, bumped around every unmap+remap. A registration observed while no remap of its
 * area was in progress records "key K seen in generation G"; if K is later returned in a LATER
 * clean generation of the same area, the cache handed out a region whose pages were unmapped. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "case_util.h"

#define THREADS 16
#define ITERS 600
#define KEYMAX (1u << 20)
#define AREA_PAGES 16
#define SHARED_AREA THREADS /* area ids 0..15: one per thread; 16: the shared one */

struct area {
    char *base;
    atomic_ulong gen_start; /* bumped before the unmap */
    atomic_ulong gen_end;   /* bumped after the remap: equal = no remap in progress */
};

static fh_cache *cache;
static struct area areas[THREADS + 1];
static _Atomic uint64_t first_seen[KEYMAX]; /* (area << 40 | generation) + 1, 0 = never seen */
static atomic_ulong stale, checked, unchecked, pin_failed;
static atomic_int stop;
static size_t pg;

/* New pages at the same addresses. mmap(MAP_FIXED) replaces the old ones in one step (an unmap
 * path of its own): a munmap + mmap pair could lose the hole to another thread's malloc. */
static void remap(struct area *a, int fill) {
    atomic_fetch_add(&a->gen_start, 1);
    void *p = mmap(a->base, AREA_PAGES * pg, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    CHECK(p == a->base);
    memset(p, fill, AREA_PAGES * pg);
    atomic_fetch_add(&a->gen_end, 1);
}

/* Register [first, first+n) pages of area `id`, check the key against earlier generations, and
 * release it. */
static void reg_check(int id, size_t first, size_t n, unsigned char pattern) {
    struct area *a = &areas[id];
    uint64_t g0 = atomic_load(&a->gen_start), e0 = atomic_load(&a->gen_end);
    fh_mr mr;
    fh_status st = fh_register(cache, a->base + first * pg, n * pg, FH_ACCESS_LOCAL_WRITE, &mr);
    uint64_t g1 = atomic_load(&a->gen_start);
    if (st == FH_ERR_PIN_FAILED && id == SHARED_AREA) {
        atomic_fetch_add(&pin_failed, 1); /* the shared area was unmapped at that moment */
        return;
    }
    CHECK_OK(st);
    if (id != SHARED_AREA) CHECK((unsigned char)a->base[first * pg] == pattern);
    if (g0 != e0 || g0 != g1 || mr.lkey >= KEYMAX) {
        atomic_fetch_add(&unchecked, 1); /* raced with a remap: either answer is allowed */
    } else {
        uint64_t tag = ((uint64_t)id << 40 | g0) + 1, zero = 0;
        if (!atomic_compare_exchange_strong(&first_seen[mr.lkey], &zero, tag) && zero != tag) {
            uint64_t seen_id = (zero - 1) >> 40, seen_gen = (zero - 1) & ((1ull << 40) - 1);
            /* Same key in a later generation of the same area: its pages were unmapped. */
            if (seen_id == (uint64_t)id && seen_gen < g0) {
                fprintf(stderr, "STALE HIT: area %d key %u seen in generation %llu, again in %llu\n",
                        id, mr.lkey, (unsigned long long)seen_gen, (unsigned long long)g0);
                atomic_fetch_add(&stale, 1);
            }
        }
        atomic_fetch_add(&checked, 1);
    }
    CHECK_OK(fh_deregister(cache, mr.handle));
}

static void *worker(void *arg) {
    int id = (int)(uintptr_t)arg;
    uint64_t seed = (uint64_t)id;
    unsigned char pattern = (unsigned char)(id + 1);
    memset(areas[id].base, pattern, AREA_PAGES * pg);
    for (int i = 0; i < ITERS; i++) {
        /* Overlapping ranges of our own area (merged into unions by the cache). */
        for (int k = 0; k < 3; k++) {
            uint64_t r = fh_rand(&seed);
            size_t first = r % AREA_PAGES;
            size_t n = 1 + (r >> 16) % (AREA_PAGES - first);
            reg_check(id, first, n, pattern);
        }
        /* Overlapping ranges of the shared area, which another thread keeps remapping. */
        uint64_t r = fh_rand(&seed);
        size_t first = r % AREA_PAGES;
        reg_check(SHARED_AREA, first, 1 + (r >> 16) % (AREA_PAGES - first), 0);
        /* malloc / register / free (sometimes freed while still registered). */
        size_t len = 64 * 1024 + (r >> 32) % (512 * 1024);
        char *p = malloc(len);
        CHECK(p != NULL);
        memset(p, pattern, len);
        fh_mr mr;
        CHECK_OK(fh_register(cache, p, len, FH_ACCESS_LOCAL_WRITE, &mr));
        CHECK(p[len - 1] == (char)pattern);
        if (i % 2) free(p);
        CHECK_OK(fh_deregister(cache, mr.handle));
        if (!(i % 2)) free(p);
        /* New pages under our own area every 8 iterations, with a new pattern. */
        if (i % 8 == 7) {
            pattern = (unsigned char)(pattern + THREADS);
            remap(&areas[id], pattern);
        }
    }
    return NULL;
}

static void *unmapper(void *arg) {
    (void)arg;
    unsigned n = 0;
    while (!atomic_load(&stop)) {
        remap(&areas[SHARED_AREA], (int)(++n & 0xff));
        sched_yield();
    }
    return NULL;
}

int main(void) {
    case_watchdog(110);
    pg = fh_test_page();
    cache = case_cache((size_t)512 << 20, 4096);
    for (int i = 0; i <= THREADS; i++) areas[i].base = fh_test_map(AREA_PAGES * pg);

    pthread_t w[THREADS], u;
    CHECK(pthread_create(&u, NULL, unmapper, NULL) == 0);
    for (uintptr_t i = 0; i < THREADS; i++) CHECK(pthread_create(&w[i], NULL, worker, (void *)i) == 0);
    for (int i = 0; i < THREADS; i++) CHECK(pthread_join(w[i], NULL) == 0);
    atomic_store(&stop, 1);
    CHECK(pthread_join(u, NULL) == 0);

    fh_stats s = fh_test_stats(cache);
    printf("case6: %lu checked, %lu raced with a remap, %lu pin failures on the unmapped shared area, "
           "%lu stale; %llu hits, %llu misses, %llu invalidations, shared area remapped %lu times\n",
           atomic_load(&checked), atomic_load(&unchecked), atomic_load(&pin_failed),
           atomic_load(&stale), (unsigned long long)s.hits, (unsigned long long)s.misses,
           (unsigned long long)s.invalidations, atomic_load(&areas[SHARED_AREA].gen_end));
    CHECK_EQ_U64(atomic_load(&stale), 0);
    CHECK(atomic_load(&checked) > THREADS * ITERS); /* the check really ran */
    CHECK(s.hits > 0 && s.invalidations > 0);
    CHECK_EQ_U64(s.in_use, 0);
    CHECK_OK(fh_cache_finalize(cache));
    puts("case6_threads: ok");
    return 0;
}
