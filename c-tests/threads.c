/* Several threads register/deregister overlapping buffers through the C ABI while another keeps
 * invalidating parts of them: every call succeeds, nothing deadlocks, and the cache ends with
 * nothing in use and finalizes. */
#include <pthread.h>
#include <sched.h>
#include <time.h>

#include "fh_test.h"

#define THREADS 4
#define PAGES 64
#define RUN_NS 200000000LL /* each worker runs this long, overlapping the invalidator */

static fh_cache *cache;
static char *arena;
static size_t page;
static volatile int stop;
static volatile long notifies;

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void *worker(void *arg) {
    uint64_t seed = (uintptr_t)arg * 2654435761u + 1;
    fh_mr held[8];
    int n = 0;
    while (notifies == 0) sched_yield(); /* start only once invalidations are flowing */
    long long end = now_ns() + RUN_NS;
    while (now_ns() < end) {
        if (n < 8 && (fh_rand(&seed) & 1)) {
            size_t off = fh_rand(&seed) % (PAGES * page);
            size_t len = 1 + fh_rand(&seed) % (PAGES * page - off);
            uint32_t access = (uint32_t)(fh_rand(&seed) & 0xf);
            fh_status s = fh_register(cache, arena + off, len, access, &held[n]);
            if (s != FH_OK) {
                fprintf(stderr, "register: %s\n", fh_status_str((int)s));
                exit(1);
            }
            n++;
        } else if (n > 0) {
            int k = (int)(fh_rand(&seed) % (uint64_t)n);
            fh_status s = fh_deregister(cache, held[k].handle);
            if (s != FH_OK) {
                fprintf(stderr, "deregister: %s\n", fh_status_str((int)s));
                exit(1);
            }
            /* Double release must be refused even while others work. */
            CHECK_STATUS(fh_deregister(cache, held[k].handle), FH_ERR_UNKNOWN_HANDLE);
            held[k] = held[--n];
        }
    }
    while (n > 0) CHECK_OK(fh_deregister(cache, held[--n].handle));
    return NULL;
}

static void *invalidator(void *arg) {
    (void)arg;
    uint64_t seed = 99;
    while (!stop) {
        size_t off = fh_rand(&seed) % (PAGES * page);
        CHECK_OK(fh_notify_unmapped(arena + off, page));
        notifies++;
    }
    return NULL;
}

int main(void) {
    page = fh_test_page();
    arena = fh_test_map(PAGES * page);
    cache = fh_test_cache(PAGES * page * 4, 32, 0);
    pthread_t t[THREADS], inv;
    CHECK(pthread_create(&inv, NULL, invalidator, NULL) == 0);
    for (uintptr_t i = 0; i < THREADS; i++) CHECK(pthread_create(&t[i], NULL, worker, (void *)i) == 0);
    for (int i = 0; i < THREADS; i++) CHECK(pthread_join(t[i], NULL) == 0);
    stop = 1;
    CHECK(pthread_join(inv, NULL) == 0);

    /* One more call processes whatever invalidations are still pending. */
    fh_mr last;
    CHECK_OK(fh_register(cache, arena, page, 0, &last));
    CHECK_OK(fh_deregister(cache, last.handle));
    fh_stats s = fh_test_stats(cache);
    CHECK_EQ_U64(s.in_use, 0);
    CHECK(s.regions <= 32);
    /* The invalidations really cut through the workers' regions. (How many depends on how often
     * the scheduler runs the threads truly in parallel; on a loaded 2-core host, few.) */
    CHECK(s.invalidations > 0);
    printf("threads: %llu hits, %llu misses, %llu invalidations, %llu evictions, %ld notifies\n",
           (unsigned long long)s.hits, (unsigned long long)s.misses,
           (unsigned long long)s.invalidations, (unsigned long long)s.evictions, notifies);
    CHECK_OK(fh_cache_finalize(cache));
    puts("threads: ok");
    return 0;
}
