/* Stale registrations under libfirehose_preload.so with many threads in one protection domain
 * (the shim's twin of c-tests/stale_threads.h): N threads (PST_THREADS, default 16), each with its
 * own loopback QP in ONE shared PD (so every thread's ibv_reg_mr goes to the same cache), run
 * rounds of
 *
 *   get 64-112 KiB (mmap, or malloc for `free`), write pattern A;
 *   ibv_reg_mr, ibv_dereg_mr, ibv_reg_mr again (under the shim: a cache hit), ibv_dereg_mr;
 *   replace the memory under the same address by the round's path;
 *   write pattern B; ibv_reg_mr of the same range; RDMA READ through the new rkey must return B.
 *
 * The path rotates per round and per thread, so at any moment the threads replace memory in
 * different ways next to each other: munmap, raw syscall munmap, madvise(MADV_DONTNEED), mremap
 * away (then a new mapping at the old address), mmap(MAP_FIXED) over it, and free -> malloc of a
 * chunk glibc mmapped (its munmap happens inside glibc). A round whose address was taken by
 * another thread before it could be mapped again is skipped and counted.
 *
 * Exit 0: every checked READ saw B; 1: some READ saw other data (a stale registration) or a call
 * failed; 3: too few rounds could be checked; 77: no device. Must pass without the shim (the test
 * is sound) and with it; with FH_TEST_NO_INVALIDATE=1 under the shim it must exit 1. */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../common/fh_rand.h"
#include "../common/verbs_loopback.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

#define MAX_LEN (112 * 1024)
#define MAX_THREADS 64
#define RW (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

enum { P_MUNMAP, P_RAW_MUNMAP, P_MADVISE, P_MREMAP, P_MMAP_FIXED, P_FREE, NPATHS };
static const char *const path_name[NPATHS] = {"munmap",      "raw_munmap", "madvise_dontneed",
                                              "mremap_move", "mmap_fixed", "free"};

static struct vl_loop base;
static int nthreads = 16, rounds = 40;
static atomic_ulong checked[NPATHS], stale[NPATHS], skipped[NPATHS], failed;

struct thr {
    int id;
    pthread_t t;
    struct vl_loop l;
    char *scratch;
    struct ibv_mr *scratch_mr;
    uint64_t seed; /* fh_rand state */
    int dead; /* its QP went to the error state */
};

static unsigned char pat(unsigned seed, size_t i)
{
    return (unsigned char)(seed * 131u + i * 7u + (i >> 12) + 1);
}

static void fill(char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (char)pat(seed, i);
}

static long mismatch(const char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)p[i] != pat(seed, i))
            return (long)i;
    return -1;
}

static void *map_at(void *a, size_t n, int flags)
{
    return mmap(a, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0);
}

static void fail(struct thr *t, const char *what)
{
    if (atomic_fetch_add(&failed, 1) < 5)
        fprintf(stderr, "thread %d: %s failed\n", t->id, what);
}

/* A fresh mapping exactly at `a` (freed just before): 0, or 1 if another thread took the hole. */
static int remap_at(char *a, size_t n)
{
    void *r = map_at(a, n, MAP_FIXED_NOREPLACE);
    if (r == a)
        return 0;
    if (r != MAP_FAILED)
        munmap(r, n); /* a kernel that ignored NOREPLACE: not ours */
    return 1;
}

static void round_(struct thr *t, int path)
{
    unsigned rnd = (unsigned)fh_rand(&t->seed);
    size_t len = (16 + rnd % 13) * 4096;
    unsigned seed_a = rnd, seed_b = rnd ^ 0x5a5a5a5au;
    char *p;
    if (path == P_FREE) {
        len -= 64;
        p = malloc(len);
        if (!p) {
            fail(t, "malloc");
            return;
        }
        /* glibc's size word, bit 1 = IS_MMAPPED: an arena chunk keeps its pages on free. */
        if (!(((const size_t *)p)[-1] & 2)) {
            free(p);
            atomic_fetch_add(&skipped[path], 1);
            return;
        }
    } else {
        p = map_at(NULL, len, 0);
        if (p == MAP_FAILED) {
            fail(t, "mmap");
            return;
        }
    }
    fill(p, len, seed_a);
    struct ibv_mr *m = ibv_reg_mr(t->l.pd, p, len, RW);
    if (!m || ibv_dereg_mr(m) || !(m = ibv_reg_mr(t->l.pd, p, len, RW)) || ibv_dereg_mr(m)) {
        fail(t, "ibv_reg_mr/ibv_dereg_mr of fresh memory");
        goto out;
    }

    int lost = 0; /* the address went to another thread */
    switch (path) {
    case P_MUNMAP:
    case P_RAW_MUNMAP:
        if (path == P_MUNMAP ? munmap(p, len) : syscall(SYS_munmap, p, len)) {
            fail(t, "munmap");
            goto out;
        }
        lost = remap_at(p, len);
        break;
    case P_MADVISE:
        if (madvise(p, len, MADV_DONTNEED)) {
            fail(t, "madvise");
            goto out;
        }
        break;
    case P_MREMAP: {
        char *q = map_at(NULL, len, 0);
        if (q == MAP_FAILED || mremap(p, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, q) != q) {
            fail(t, "mremap");
            goto out;
        }
        munmap(q, len);
        lost = remap_at(p, len);
        break;
    }
    case P_MMAP_FIXED:
        if (map_at(p, len, MAP_FIXED) != p) {
            fail(t, "mmap(MAP_FIXED)");
            goto out;
        }
        break;
    case P_FREE: {
        char *was = p;
        free(p);
        p = NULL;
        void *extra[16];
        int n = 0;
        while (n < 16) {
            char *x = malloc(len);
            if (x == was) {
                p = x;
                break;
            }
            extra[n++] = x;
        }
        for (int i = 0; i < n; i++)
            free(extra[i]);
        lost = p == NULL;
        break;
    }
    }
    if (lost) {
        atomic_fetch_add(&skipped[path], 1);
        return; /* nothing of ours is at p any more */
    }

    fill(p, len, seed_b);
    m = ibv_reg_mr(t->l.pd, p, len, RW);
    if (!m) {
        fail(t, "ibv_reg_mr of the new memory");
        goto out;
    }
    memset(t->scratch, 0, len);
    int st = vl_rdma(&t->l, IBV_WR_RDMA_READ, t->scratch, t->scratch_mr->lkey, (uintptr_t)p,
                       m->rkey, (uint32_t)len);
    long bad = st == 0 ? mismatch(t->scratch, len, seed_b) : 0;
    atomic_fetch_add(&checked[path], 1);
    if (st != 0 || bad >= 0) {
        if (atomic_fetch_add(&stale[path], 1) < 5)
            fprintf(stderr, "STALE [%s] thread %d: RDMA READ of [%p, +%zu) through rkey %#x: "
                    "status %d, first wrong byte %ld (%s)\n", path_name[path], t->id, (void *)p,
                    len, m->rkey, st, bad,
                    st == 0 && mismatch(t->scratch, len, seed_a) < 0 ? "the old pages' data"
                                                                     : "other data");
        if (st != 0) { /* the QP is in the error state now: this thread stops */
            ibv_dereg_mr(m);
            t->dead = 1;
            goto out;
        }
    }
    ibv_dereg_mr(m);
out:
    if (path == P_FREE)
        free(p);
    else
        munmap(p, len);
}

static void *worker(void *arg)
{
    struct thr *t = arg;
    for (int r = 0; r < rounds && !t->dead; r++)
        round_(t, (t->id + r) % NPATHS);
    return NULL;
}

static int env_int(const char *name, int dflt, int hi)
{
    const char *v = getenv(name);
    int x = v && *v ? atoi(v) : dflt;
    return x < 1 ? 1 : x > hi ? hi : x;
}

int main(void)
{
    nthreads = env_int("PST_THREADS", 16, MAX_THREADS);
    rounds = env_int("PST_ROUNDS", 40, 100000);
    /* Chunks of 64-112 KiB from mmap, no dynamic threshold; no top padding, so an arena's top
     * rarely serves them (those rounds are skipped: their pages stay on free). */
    mallopt(M_MMAP_THRESHOLD, 32 * 1024);
    mallopt(M_TOP_PAD, 0);
    int rc = vl_open_main(&base);
    if (rc)
        return rc;
    static struct thr thr[MAX_THREADS];
    for (int i = 0; i < nthreads; i++) {
        struct thr *t = &thr[i];
        t->id = i;
        t->seed = (uint64_t)i;
        if (vl_open_in(&t->l, &base)) {
            fprintf(stderr, "%s\n", t->l.err);
            return 1;
        }
        t->scratch = aligned_alloc(4096, MAX_LEN);
        t->scratch_mr = t->scratch ? ibv_reg_mr(base.pd, t->scratch, MAX_LEN, RW) : NULL;
        if (!t->scratch_mr) {
            fprintf(stderr, "scratch registration failed\n");
            return 1;
        }
    }
    for (int i = 0; i < nthreads; i++)
        pthread_create(&thr[i].t, NULL, worker, &thr[i]);
    for (int i = 0; i < nthreads; i++)
        pthread_join(thr[i].t, NULL);

    unsigned long total = 0, bad = 0;
    for (int i = 0; i < NPATHS; i++) {
        printf("  %-17s checked %4lu  stale %4lu  skipped %4lu\n", path_name[i], checked[i],
               stale[i], skipped[i]);
        total += checked[i];
        bad += stale[i];
    }
    for (int i = 0; i < nthreads; i++) {
        ibv_dereg_mr(thr[i].scratch_mr);
        vl_close(&thr[i].l);
    }
    vl_close(&base);
    printf("preload_stale_threads: %d threads in one PD, %lu reads checked, %lu stale, %lu call "
           "failures\n", nthreads, total, bad, (unsigned long)failed);
    if (bad || failed)
        return 1;
    /* At least half of the rounds must have been checked, and every path some. */
    int thin = total * 2 < (unsigned long)nthreads * (unsigned long)rounds;
    for (int i = 0; i < NPATHS; i++)
        thin |= checked[i] == 0;
    return thin ? 3 : 0;
}
