/* Case 2 (madvise): MADV_DONTNEED, MADV_FREE and MADV_REMOVE over a registered range, on the main
 * thread and from a worker thread, and glibc trimming a worker thread's arena (its internal
 * madvise/mmap, which no LD_PRELOAD of madvise sees). After each, registering the range again must
 * be a miss; a handle taken before stays valid until released.
 *
 * With the mlock backend the kernel refuses to drop locked pages (EINVAL: the pages stay), so only
 * the cache's reaction is checked here; with ibv_reg_mr the pages really go (verbs_case2_unmap.c).
 * Proof that the libc hooks matter: FH_MONITOR=patch FH_TEST_DISABLE_HOOKS=madvise fails here. */
#include <malloc.h>
#include <pthread.h>

#include "case_util.h"

struct job {
    fh_cache *c;
    int advice;
    const char *name;
    int shared;
};

static void *map_for(const struct job *j, size_t len) {
    if (!j->shared) return fh_test_map(len);
    /* MADV_REMOVE only works on shmem: an anonymous shared mapping is one. */
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    memset(p, 0x5a, len);
    return p;
}

static void run(const struct job *j) {
    size_t page = fh_test_page();
    size_t len = 16 * page;
    char *buf = map_for(j, len);
    fh_mr held;
    uint64_t inv0 = case_prime(j->c, buf, len, &held);
    int rc = madvise(buf + 4 * page, 4 * page, j->advice);
    /* 0, or EINVAL because the mlock backend locked the pages (see the top comment). */
    CHECK(rc == 0 || errno == EINVAL);
    case_expect_miss(j->c, j->name, buf, len, &held, inv0);
    CHECK(munmap(buf, len) == 0);
}

static void *worker(void *arg) {
    run(arg);
    return NULL;
}

/* In a worker thread (its own malloc arena): malloc, register, free (glibc shrinks the arena's heap
 * with its internal madvise(MADV_DONTNEED) or mmap(MAP_FIXED)), malloc again. */
static void *arena_worker(void *arg) {
    fh_cache *c = arg;
    size_t len = 512 << 10;
    char *a = malloc(len);
    CHECK(a != NULL);
    memset(a, 1, len);
    fh_mr held;
    uint64_t inv0 = case_prime(c, a, len, &held);
    uintptr_t freed = (uintptr_t)a; /* only the number is used after free */
    free(a);
    malloc_trim(0); /* trims every arena, this thread's too */
    char *b = malloc(len);
    CHECK(b != NULL);
    if ((uintptr_t)b != freed) {
        printf("  arena trim: malloc moved (%p, was %#lx); checking the old handle only\n",
               (void *)b, (unsigned long)freed);
        CHECK_OK(fh_deregister(c, held.handle));
    } else {
        memset(b, 2, len);
        case_expect_miss(c, "free in a thread arena + malloc", b, len, &held, inv0);
    }
    free(b);
    return NULL;
}

int main(void) {
    case_skip_under_asan("tunes glibc malloc (mallopt), which ASan replaces");
    case_watchdog(60);
    /* Thread arenas: small chunks stay in the heap, and a free trims as soon as it can. */
    CHECK(mallopt(M_MMAP_THRESHOLD, 4 << 20) == 1);
    CHECK(mallopt(M_TRIM_THRESHOLD, 64 << 10) == 1);
    fh_cache *c = case_cache((size_t)256 << 20, 64);
    struct job jobs[] = {
        {c, MADV_DONTNEED, "madvise DONTNEED", 0},
        {c, MADV_FREE, "madvise FREE", 0},
        {c, MADV_REMOVE, "madvise REMOVE (shmem)", 1},
        {c, MADV_DONTNEED, "madvise DONTNEED from a thread", 0},
        {c, MADV_REMOVE, "madvise REMOVE from a thread", 1},
    };
    for (int i = 0; i < 3; i++) run(&jobs[i]);
    for (int i = 3; i < 5; i++) {
        pthread_t t;
        CHECK(pthread_create(&t, NULL, worker, &jobs[i]) == 0);
        CHECK(pthread_join(t, NULL) == 0);
    }
    pthread_t t;
    CHECK(pthread_create(&t, NULL, arena_worker, c) == 0);
    CHECK(pthread_join(t, NULL) == 0);

    /* Advice that keeps the pages must not invalidate. */
    size_t page = fh_test_page();
    char *k = fh_test_map(8 * page);
    fh_mr held;
    uint64_t inv0 = case_prime(c, k, 8 * page, &held);
    CHECK(madvise(k, 8 * page, MADV_WILLNEED) == 0);
    CHECK(madvise(k, 8 * page, MADV_DONTFORK) == 0);
    CHECK_OK(fh_deregister(c, held.handle));
    fh_stats s0 = fh_test_stats(c);
    CHECK_EQ_U64(s0.invalidations, inv0);
    fh_mr again;
    CHECK_OK(fh_register(c, k, 8 * page, FH_ACCESS_LOCAL_WRITE, &again));
    fh_stats s1 = fh_test_stats(c);
    CHECK_EQ_U64(s1.hits, s0.hits + 1);
    CHECK_OK(fh_deregister(c, again.handle));

    CHECK_OK(fh_cache_finalize(c));
    puts("case2_madvise: ok");
    return 0;
}
