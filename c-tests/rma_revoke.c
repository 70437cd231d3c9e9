/* Remote invalidation end to end: memory a rank frees or unmaps while peers hold
 * firehoses on it is revoked from them before free/munmap returns, so no put issued after that
 * lands in the old pages, and a put to new memory at the same address lands in the new pages.
 * Runs under mpirun on a device (tests/verbs-suite.d/64-rma-revoke.sh, 2 and 4 ranks, through
 * `setarch -R` so the static tables below sit at the same address in every rank), and as a job
 * of one in ctest (every operation is then a local copy: the flow runs, nothing is revoked).
 *
 * Phase A (sequential; with FH_REMOTE_INVALIDATION=0 it must fail):
 *   every rank has three buffers of its own sizes: one malloc'ed (an mmapped chunk: the
 *   threshold is pinned to 128 KiB so free unmaps it), one mmapped, one mmapped that will be
 *   dropped with madvise(MADV_DONTNEED). Peers put into them (firehoses now exist), the owner
 *   checks; barrier; every owner frees / munmaps / madvises them and gets new memory at the
 *   same addresses (malloc again, or mmap MAP_FIXED_NOREPLACE; madvise leaves new zero pages)
 *   and raises a word its peers poll with one-sided gets: each peer puts into the new memory
 *   the moment it sees it (racing anything the library would still do after free returned);
 *   barrier; the owner checks those puts are in the new pages. Then the owner fills the new
 *   memory with a new pattern; barrier; every peer first gets its stripe (must read the NEW
 *   pattern, not the old pages) and then puts new data; fh_quiet; barrier; every owner checks
 *   that the NEW pages hold exactly the peers' data.
 * Phase B (n > 1): rank 0 keeps replacing one region (munmap, mmap at the same address, fill)
 *   while every other rank hammers it from 16 threads with puts and gets. Rank 0 publishes an
 *   epoch word: 2k while mapping k is in place, 2k+1 while it is being replaced. A thread reads
 *   the epoch, puts {k, counter} into its own slot, gets it back, reads the epoch again; if the
 *   epoch did not change, the mapping was in place throughout: both ops must have succeeded,
 *   the get must return the put, and the thread records {k, counter} as a witness at rank 0.
 *   Before unmapping mapping k, rank 0 checks every witness of epoch k against the slot in its
 *   current pages: a put that landed in older pages (a stale firehose) is missing there. Every
 *   other op may end in FH_OK or FH_ERR_REMOTE_FAULT (the region was being replaced), nothing
 *   else (rank 0 calls fh_progress while a mapping is in place: it serves misses). Meanwhile a
 *   thread of rank 0 forks children (malloc, free, munmap, exit): once during each munmap that
 *   waits for a revocation, and every ~200 ms.
 *
 * A revocation that timed out (FH_REVOKE_TIMEOUT), or a wait ended by FH_REVOKE_STALL, voids the
 * guarantee: a run with one fails.
 *
 * Environment: FH_TEST_EPOCHS (6), FH_TEST_EPOCH_MS (30), FH_TEST_FORK (1), FH_TEST_FAIL_LOG
 * (a failing rank appends its FAIL line there too: mpirun can drop stderr). */
#include "fh_test.h"

#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <sys/wait.h>
#include <time.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

#define MAX_RANKS 16
#define THREADS 16
#define PG 4096
#define NKIND 3
enum { K_MALLOC, K_MMAP, K_MADV };
static const char *kind_name[NKIND] = {"free+malloc", "munmap+mmap", "madvise(DONTNEED)"};

struct slot {
    uint64_t addr[NKIND], size[NKIND];
    uint64_t same[NKIND]; /* 1: new memory got the same address (else the buffer is skipped) */
    uint64_t churn, churn_size;
};
/* Filled at rank 0 by puts from every rank, then read by everyone (same address everywhere
 * only without ASLR). */
static struct slot table[MAX_RANKS];

struct rec {
    uint64_t tag, counter;
};
/* Rank 0's: the epoch word of phase B, and the witnesses peers put there. */
static volatile uint64_t epoch_word;
/* Every rank's: non-zero once its buffers were replaced (bit 8 + kind: at the same address). */
static volatile uint64_t released_word;
static struct rec witness[MAX_RANKS][THREADS];
#define DONE_EPOCH (UINT64_MAX - 1) /* even: "stable", and never a real epoch */

static fh_ctx *ctx;
static uint32_t me, n;

static uint8_t pat(uint32_t owner, uint32_t gen, uint64_t off) {
    uint64_t x = (off + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)owner << 40) ^ ((uint64_t)gen << 52);
    x ^= x >> 29;
    return (uint8_t)(x * 0xBF58476D1CE4E5B9ull >> 56);
}

#define FAIL(...)                                                                            \
    do {                                                                                     \
        char line_[320];                                                                     \
        int k_ = snprintf(line_, sizeof line_, "FAIL: rank %u: ", me);                       \
        snprintf(line_ + k_, sizeof line_ - (size_t)k_, __VA_ARGS__);                        \
        strncat(line_, "\n", sizeof line_ - strlen(line_) - 1);                              \
        fh_test_report_fail(line_);                                                          \
        exit(1);                                                                             \
    } while (0)

static size_t env_num(const char *k, size_t dflt) {
    const char *v = getenv(k);
    return v && *v ? (size_t)strtoull(v, NULL, 0) : dflt;
}

static void sleep_ms(unsigned ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Sleeps about `ms` while answering peers (fh_progress): a target without a progress thread
 * serves misses only when it calls into the library. */
static void busy_ms(unsigned ms) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        CHECK_OK(fh_progress(ctx));
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((double)(t.tv_sec - t0.tv_sec) * 1e3 + (double)(t.tv_nsec - t0.tv_nsec) / 1e6 >= ms) return;
        struct timespec nap = {0, 200000};
        nanosleep(&nap, NULL);
    }
}

static uint8_t *map_rw(void *hint, size_t len, int flags) {
    void *p = mmap(hint, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* ---- phase A ------------------------------------------------------------------------------ */

static uint8_t *bufs[NKIND];
static size_t sizes[NKIND];
/* How to give each buffer back at the end: 1 free, 2 munmap of its pages. */
static int release_how[NKIND];

static void fill(int kind, uint32_t gen) {
    for (size_t i = 0; i < sizes[kind]; i++) bufs[kind][i] = pat(me, gen, i);
}

/* Pages of [p, p + len). */
static uintptr_t page_lo(const void *p) { return (uintptr_t)p & ~(uintptr_t)(PG - 1); }
static uintptr_t page_hi(const void *p, size_t len) {
    return ((uintptr_t)p + len + PG - 1) & ~(uintptr_t)(PG - 1);
}

/* Gives the buffer's memory back (the revocation happens in here), then gets new memory at the
 * same address. Returns 1 if the new memory is at the same address. */
static int replace(int kind) {
    uint8_t *p = bufs[kind];
    size_t len = sizes[kind];
    switch (kind) {
    case K_MALLOC: {
        /* Only the address is used after the free (to compare and to map there). */
        uintptr_t pa = (uintptr_t)p;
        free(p);
        uint8_t *q = malloc(len);
        if ((uintptr_t)q == pa) return 1;
        free(q);
        /* Another address: map the freed pages ourselves (they are unmapped now). */
        uintptr_t lo = pa & ~(uintptr_t)(PG - 1), hi = (pa + len + PG - 1) & ~(uintptr_t)(PG - 1);
        uint8_t *m = map_rw((void *)lo, hi - lo, MAP_FIXED_NOREPLACE);
        if ((uintptr_t)m == lo) {
            release_how[kind] = 2;
            return 1;
        }
        if (m) munmap(m, hi - lo);
        release_how[kind] = 0;
        return 0;
    }
    case K_MMAP: {
        CHECK(munmap(p, len) == 0);
        uint8_t *m = map_rw(p, len, MAP_FIXED_NOREPLACE);
        if (m == p) return 1;
        if (m) munmap(m, len);
        release_how[kind] = 0;
        return 0;
    }
    default:
        CHECK(madvise(p, len, MADV_DONTNEED) == 0);
        return 1;
    }
}

/* Writer `w`'s stripe of a buffer of `size` bytes written by the ranks other than its owner `t`
 * (all ranks in a job of one). */
static void stripe(uint32_t w, uint32_t t, uint64_t size, uint64_t *lo, uint64_t *hi) {
    uint32_t writers = n > 1 ? n - 1 : 1;
    uint32_t idx = n > 1 ? (w < t ? w : w - 1) : 0;
    uint64_t s = size / writers;
    *lo = idx * s;
    *hi = idx == writers - 1 ? size : *lo + s;
}

/* Every peer puts generation `gen + t` into its stripe of every buffer of every target t;
 * with `expect_old` >= 0 it first gets the stripe and checks it holds the owner's generation
 * `expect_old` (the new pages, not the old ones). */
static void peers_put(uint32_t gen, int expect_old) {
    for (uint32_t t = 0; t < n; t++) {
        if (n > 1 && t == me) continue;
        for (int k = 0; k < NKIND; k++) {
            if (!table[t].same[k]) continue;
            uint64_t lo, hi;
            stripe(me, t, table[t].size[k], &lo, &hi);
            size_t len = (size_t)(hi - lo);
            uint8_t *src = malloc(len);
            CHECK(src);
            if (expect_old >= 0) {
                memset(src, 0xEE, len);
                CHECK_OK(fh_get(ctx, src, t, table[t].addr[k] + lo, len));
                for (size_t i = 0; i < len; i++) {
                    if (src[i] != pat(t, (uint32_t)expect_old, lo + i)) {
                        FAIL("stale get: %s buffer of rank %u, byte %" PRIu64
                             ": got %#x want %#x (read the old pages)",
                             kind_name[k], t, lo + i, src[i], pat(t, (uint32_t)expect_old, lo + i));
                    }
                }
            }
            for (size_t i = 0; i < len; i++) src[i] = pat(me, gen + t, lo + i);
            /* Several pieces, one implicit: more than one firehose per stripe. */
            size_t half = len / 2;
            CHECK_OK(fh_put_nb(ctx, t, table[t].addr[k] + lo, src, half, NULL));
            CHECK_OK(fh_put(ctx, t, table[t].addr[k] + lo + half, src + half, len - half));
            CHECK_OK(fh_quiet(ctx));
            free(src);
        }
    }
}

/* As an owner: every writer's stripe of every buffer holds its generation `gen + me`. */
static void owner_check(uint32_t gen, const char *what) {
    for (int k = 0; k < NKIND; k++) {
        if (!table[me].same[k]) continue;
        for (uint32_t w = 0; w < n; w++) {
            if (n > 1 && w == me) continue;
            uint64_t lo, hi;
            stripe(w, me, sizes[k], &lo, &hi);
            for (uint64_t i = lo; i < hi; i++) {
                if (bufs[k][i] != pat(w, gen + me, i)) {
                    FAIL("%s: %s buffer, byte %" PRIu64 " (stripe of rank %u): got %#x want %#x", what,
                         kind_name[k], i, w, bufs[k][i], pat(w, gen + me, i));
                }
            }
        }
    }
}

static void phase_a(void) {
    CHECK_OK(fh_barrier(ctx));
    peers_put(2, -1);
    CHECK_OK(fh_barrier(ctx));
    owner_check(2, "first puts");
    fh_rma_stats before;
    CHECK_OK(fh_get_rma_stats(ctx, &before));
    CHECK_OK(fh_barrier(ctx));

    /* Give the memory back and take new memory at the same addresses (zero pages), then tell
     * the peers at once through a word they poll one-sidedly: each puts into the new memory
     * right away, racing whatever the library still has to do after free/munmap returned. */
    struct slot mine = table[me];
    int same = 0;
    uint64_t flag = 1;
    for (int k = 0; k < NKIND; k++) {
        mine.same[k] = (uint64_t)replace(k);
        if (mine.same[k]) {
            flag |= 1ull << (8 + k);
            same++;
        } else {
            printf("rank %u: %s: no new memory at the old address; buffer skipped\n", me, kind_name[k]);
        }
    }
    fh_rma_stats after;
    CHECK_OK(fh_get_rma_stats(ctx, &after));
    __atomic_store_n(&released_word, flag, __ATOMIC_SEQ_CST);
    for (uint32_t t = 0; t < n; t++) {
        if (n > 1 && t == me) continue;
        uint64_t w = 0;
        while (w == 0) CHECK_OK(fh_get(ctx, &w, t, (uint64_t)(uintptr_t)&released_word, sizeof w));
        for (int k = 0; k < NKIND; k++) {
            if (!(w & (1ull << (8 + k)))) continue;
            uint64_t lo, hi;
            stripe(me, t, table[t].size[k], &lo, &hi);
            uint8_t *src = malloc(hi - lo);
            CHECK(src);
            for (uint64_t i = lo; i < hi; i++) src[i - lo] = pat(me, 300 + t, i);
            CHECK_OK(fh_put(ctx, t, table[t].addr[k] + lo, src, hi - lo));
            free(src);
        }
    }
    CHECK_OK(fh_barrier(ctx));
    for (int k = 0; k < NKIND; k++) table[me].same[k] = mine.same[k];
    owner_check(300, "stale: a put issued right after free/munmap returned is not in the new pages");
    __atomic_store_n(&released_word, 0, __ATOMIC_SEQ_CST);
    for (int k = 0; k < NKIND; k++)
        if (mine.same[k]) fill(k, 100);
    CHECK_OK(fh_put(ctx, 0, (uint64_t)(uintptr_t)&table[me], &mine, sizeof mine));
    CHECK_OK(fh_barrier(ctx));
    CHECK_OK(fh_get(ctx, table, 0, (uint64_t)(uintptr_t)table, n * sizeof table[0]));
    CHECK_OK(fh_barrier(ctx));

    /* Peers read the new pages, then write them. */
    peers_put(200, 100);
    CHECK_OK(fh_barrier(ctx));
    owner_check(200, "stale: a put after free/munmap returned is not in the new pages");

    const char *inv = getenv("FH_REMOTE_INVALIDATION");
    int on = !(inv && strcmp(inv, "0") == 0);
    uint64_t started = after.revoke_started - before.revoke_started;
    printf("rank %u: phase A ok: %d of %d buffers at their old address, revocations started %" PRIu64
           ", waited for %" PRIu64 " (timeouts %" PRIu64 ")\n",
           me, same, NKIND, started, after.revoke_waits - before.revoke_waits,
           after.revoke_timeouts - before.revoke_timeouts);
    if (n > 1 && on && !getenv("FH_M")) {
        /* Each replaced buffer was pinned for a peer (with the default M nothing was evicted):
         * a revocation started for it. (Not always a wait: with userfaultfd on, the event of
         * the unmap may start it and it may finish before the patched munmap checks.) */
        CHECK(started >= (uint64_t)same);
        CHECK_EQ_U64(after.revoke_timeouts - before.revoke_timeouts, 0);
        /* free of an mmapped chunk holds no lock: never a trim's shortened wait. */
        CHECK_EQ_U64(after.revoke_stalls - before.revoke_stalls, 0);
    }
    CHECK_OK(fh_barrier(ctx));
}

/* ---- phase B ------------------------------------------------------------------------------ */

static uint64_t slot_off(uint32_t rank, uint32_t thread, uint64_t region) {
    uint64_t i = (uint64_t)rank * THREADS + thread;
    uint64_t pages = region / PG;
    return (i % pages) * PG + (i / pages) * 2 * sizeof(struct rec);
}

struct tstats {
    uint64_t ops, stable, faults;
};

static void *hammer(void *arg) {
    uint32_t j = (uint32_t)(uintptr_t)arg;
    struct tstats *st = calloc(1, sizeof *st);
    CHECK(st);
    uint64_t base = table[0].churn, region = table[0].churn_size;
    uint64_t at = base + slot_off(me, j, region);
    uint64_t ew = (uint64_t)(uintptr_t)&epoch_word;
    uint64_t counter = 0;
    uint8_t bulk[1024];
    memset(bulk, 0x5A, sizeof bulk);
    /* The bigger ops stay in this thread's own page only while every slot has a page. */
    int bulk_ok = (uint64_t)n * THREADS <= region / PG;
    for (;;) {
        uint64_t e1 = 0, e2 = 0;
        CHECK_OK(fh_get(ctx, &e1, 0, ew, sizeof e1));
        if (e1 == DONE_EPOCH) break;
        if (e1 & 1) {
            sched_yield();
            continue;
        }
        struct rec mine = {e1 / 2, ++counter}, got = {0, 0};
        fh_status s1 = fh_put(ctx, 0, at, &mine, sizeof mine);
        fh_status s2 = fh_get(ctx, &got, 0, at, sizeof got);
        /* A bigger op in the rest of this thread's page (other threads' slots untouched when
         * the region has a page per slot). */
        size_t blen = 64 + counter % (sizeof bulk - 64);
        fh_status s3 = !bulk_ok       ? FH_OK
                       : counter % 2 ? fh_put(ctx, 0, at + 2 * sizeof mine, bulk, blen)
                                     : fh_get(ctx, bulk, 0, at + 2 * sizeof mine, blen);
        CHECK_OK(fh_get(ctx, &e2, 0, ew, sizeof e2));
        fh_status s[3] = {s1, s2, s3};
        for (int i = 0; i < 3; i++) {
            if (s[i] != FH_OK && s[i] != FH_ERR_REMOTE_FAULT)
                FAIL("phase B: op %d returned %d (%s)", i, (int)s[i], fh_status_str((int)s[i]));
            st->faults += s[i] == FH_ERR_REMOTE_FAULT;
        }
        st->ops += 3;
        if (e1 == e2) {
            if (s1 != FH_OK || s2 != FH_OK || s3 != FH_OK)
                FAIL("phase B: an op failed while mapping %" PRIu64 " stayed in place (%d %d %d)",
                     e1 / 2, (int)s1, (int)s2, (int)s3);
            if (got.tag != mine.tag || got.counter != mine.counter)
                FAIL("phase B: thread %u read {%" PRIu64 ", %" PRIu64 "} after putting {%" PRIu64
                     ", %" PRIu64 "}",
                     j, got.tag, got.counter, mine.tag, mine.counter);
            CHECK_OK(fh_put(ctx, 0, (uint64_t)(uintptr_t)&witness[me][j], &mine, sizeof mine));
            st->stable++;
        }
    }
    return st;
}

static volatile int churning, in_unmap;
static uint64_t forks, forks_mid;

/* One child: malloc, free and munmap in it must not wait for a revoke worker that does not
 * exist there (its listeners are inert after fork). */
static void fork_once(void) {
    pid_t pid = fork();
    if (pid == 0) {
        uint8_t *m = malloc(1 << 20);
        if (!m) _exit(2);
        memset(m, 1, 1 << 20);
        free(m);
        uint8_t *q = map_rw(NULL, 4 * PG, 0);
        if (!q) _exit(3);
        q[0] = 1;
        munmap(q, 4 * PG);
        _exit(0);
    }
    CHECK(pid > 0);
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) FAIL("phase B: fork child ended with status %#x", status);
    forks++;
}

/* Forks once during each munmap that waits for a revocation, and every ~200 ms otherwise (not
 * more: fork holds the library's process-wide locks, and under emulation it is slow). */
static void *forker(void *arg) {
    (void)arg;
    unsigned idle = 0;
    while (__atomic_load_n(&churning, __ATOMIC_SEQ_CST)) {
        if (__atomic_load_n(&in_unmap, __ATOMIC_SEQ_CST)) {
            fork_once();
            if (__atomic_load_n(&in_unmap, __ATOMIC_SEQ_CST)) forks_mid++;
            while (__atomic_load_n(&in_unmap, __ATOMIC_SEQ_CST)) sleep_ms(1);
        } else if (++idle % 200 == 0) {
            fork_once();
        } else {
            sleep_ms(1);
        }
    }
    return NULL;
}

/* Rank 0: every peer rank has put a witness of epoch k (at least one stable window each). */
static int witnessed_by_all(uint64_t k) {
    for (uint32_t p = 1; p < n; p++) {
        int any = 0;
        for (uint32_t j = 0; j < THREADS && !any; j++)
            any = __atomic_load_n(&witness[p][j].tag, __ATOMIC_SEQ_CST) == k;
        if (!any) return 0;
    }
    return 1;
}

/* Rank 0, before unmapping mapping k: every witness of epoch k is in the current pages. */
static void check_witnesses(uint64_t k, uint8_t *region) {
    for (uint32_t p = 1; p < n; p++) {
        for (uint32_t j = 0; j < THREADS; j++) {
            struct rec w;
            w.tag = __atomic_load_n(&witness[p][j].tag, __ATOMIC_SEQ_CST);
            w.counter = __atomic_load_n(&witness[p][j].counter, __ATOMIC_SEQ_CST);
            if (w.tag != k) continue;
            struct rec *s = (struct rec *)(region + slot_off(p, j, table[0].churn_size));
            uint64_t tag = __atomic_load_n(&s->tag, __ATOMIC_SEQ_CST);
            uint64_t cnt = __atomic_load_n(&s->counter, __ATOMIC_SEQ_CST);
            if (tag != k || cnt < w.counter)
                FAIL("stale landing: rank %u thread %u put {%" PRIu64 ", %" PRIu64
                     "} while mapping %" PRIu64 " was in place, but its slot holds {%" PRIu64 ", %" PRIu64 "}",
                     p, j, w.tag, w.counter, k, tag, cnt);
        }
    }
}

static void phase_b(void) {
    size_t epochs = env_num("FH_TEST_EPOCHS", 6);
    unsigned epoch_ms = (unsigned)env_num("FH_TEST_EPOCH_MS", 30);
    int do_fork = (int)env_num("FH_TEST_FORK", 1);
    CHECK_OK(fh_barrier(ctx));
    if (me == 0) {
        uint8_t *region = (uint8_t *)(uintptr_t)table[0].churn;
        size_t rlen = (size_t)table[0].churn_size;
        pthread_t ft;
        __atomic_store_n(&churning, 1, __ATOMIC_SEQ_CST);
        if (do_fork) CHECK(pthread_create(&ft, NULL, forker, NULL) == 0);
        for (uint64_t k = 0; k < epochs; k++) {
            struct timespec t0, t1, t2;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            t1 = t0;
            if (k > 0) {
                __atomic_store_n(&in_unmap, 1, __ATOMIC_SEQ_CST);
                CHECK(munmap(region, rlen) == 0);
                __atomic_store_n(&in_unmap, 0, __ATOMIC_SEQ_CST);
                clock_gettime(CLOCK_MONOTONIC, &t1);
                uint8_t *m = map_rw(region, rlen, MAP_FIXED_NOREPLACE);
                if (m != region) FAIL("phase B: cannot map the region again at %p (got %p)", (void *)region, (void *)m);
                for (size_t i = 0; i < rlen; i++) region[i] = pat(0, 1000 + (uint32_t)k, i);
            }
            __atomic_store_n(&epoch_word, 2 * k, __ATOMIC_SEQ_CST);
            busy_ms(epoch_ms);
            /* Long enough for every peer to check a stable window (slow under emulation), at
             * most about 20 s more. */
            for (int w = 0; w < 2000 && !witnessed_by_all(k); w++) busy_ms(10);
            __atomic_store_n(&epoch_word, 2 * k + 1, __ATOMIC_SEQ_CST);
            check_witnesses(k, region);
            clock_gettime(CLOCK_MONOTONIC, &t2);
            printf("rank 0: epoch %" PRIu64 ": munmap %.1f ms, mapping in place %.1f ms\n", k,
                   (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6,
                   (double)(t2.tv_sec - t1.tv_sec) * 1e3 + (double)(t2.tv_nsec - t1.tv_nsec) / 1e6);
        }
        __atomic_store_n(&epoch_word, DONE_EPOCH, __ATOMIC_SEQ_CST);
        __atomic_store_n(&churning, 0, __ATOMIC_SEQ_CST);
        if (do_fork) CHECK(pthread_join(ft, NULL) == 0);
        printf("rank 0: phase B ok: %zu epochs, %" PRIu64 " forks (%" PRIu64 " while munmap waited for a revocation)\n",
               epochs, forks, forks_mid);
    } else {
        pthread_t th[THREADS];
        for (uint32_t j = 0; j < THREADS; j++)
            CHECK(pthread_create(&th[j], NULL, hammer, (void *)(uintptr_t)j) == 0);
        struct tstats sum = {0, 0, 0};
        for (uint32_t j = 0; j < THREADS; j++) {
            void *r = NULL;
            CHECK(pthread_join(th[j], &r) == 0);
            struct tstats *t = r;
            sum.ops += t->ops;
            sum.stable += t->stable;
            sum.faults += t->faults;
            free(t);
        }
        printf("rank %u: phase B ok: %d threads, %" PRIu64 " ops, %" PRIu64 " stable windows checked, %" PRIu64
               " remote faults\n",
               me, THREADS, sum.ops, sum.stable, sum.faults);
        CHECK(sum.stable > 0);
    }
    CHECK_OK(fh_barrier(ctx));
}

int main(void) {
    if (!getenv("PMIX_RANK")) unsetenv("FH_BOOTSTRAP");
    /* free of these buffers must unmap them (no dynamic threshold raising after a free). ASan
     * keeps its own allocator and ignores this: there a buffer may be skipped. */
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    CHECK_OK(fh_init(NULL, &ctx));
    me = fh_rank(ctx);
    n = fh_size(ctx);
    CHECK(n <= MAX_RANKS);

    struct slot mine;
    memset(&mine, 0, sizeof mine);
    for (int k = 0; k < NKIND; k++) {
        sizes[k] = (size_t)(192 + 64 * k + 16 * me) * 1024 + 100 * (me + 1);
        bufs[k] = k == K_MALLOC ? malloc(sizes[k]) : map_rw(NULL, sizes[k], 0);
        CHECK(bufs[k]);
        release_how[k] = k == K_MALLOC ? 1 : 2;
        fill(k, 1);
        mine.addr[k] = (uint64_t)(uintptr_t)bufs[k];
        mine.size[k] = sizes[k];
        mine.same[k] = 1;
    }
    uint8_t *region = NULL;
    if (me == 0) {
        memset(witness, 0xFF, sizeof witness);
        mine.churn_size = 64 * PG;
        region = map_rw(NULL, (size_t)mine.churn_size, 0);
        CHECK(region);
        mine.churn = (uint64_t)(uintptr_t)region;
    }
    CHECK_OK(fh_put(ctx, 0, (uint64_t)(uintptr_t)&table[me], &mine, sizeof mine));
    CHECK_OK(fh_barrier(ctx));
    CHECK_OK(fh_get(ctx, table, 0, (uint64_t)(uintptr_t)table, n * sizeof table[0]));
    CHECK(table[me].addr[0] == mine.addr[0]);

    phase_a();
    if (n > 1) phase_b();

    fh_rma_stats st;
    CHECK_OK(fh_get_rma_stats(ctx, &st));
    printf("rank %u/%u: revocations started %" PRIu64 " completed %" PRIu64 ", unmaps waited %" PRIu64
           " (mean %.2f ms, max %.2f ms) timed out %" PRIu64 ", queued without a wait %" PRIu64
           ", fast returns %" PRIu64 ", REVOKE messages %" PRIu64 ", pins %" PRIu64 " unpins %" PRIu64
           ", failures %" PRIu64 "\n",
           me, n, st.revoke_started, st.revoke_completed, st.revoke_waits,
           st.revoke_waits ? (double)st.revoke_wait_ns / (double)st.revoke_waits / 1e6 : 0.0,
           (double)st.revoke_wait_ns_max / 1e6, st.revoke_timeouts, st.revoke_detached,
           st.revoke_fast_returns, st.revokes, st.pins, st.unpins, st.failures);
    CHECK_EQ_U64(st.rejected, 0);
    const char *inv = getenv("FH_REMOTE_INVALIDATION");
    if (n > 1 && !(inv && strcmp(inv, "0") == 0) && st.revoke_timeouts != 0)
        FAIL("%" PRIu64 " revocations timed out (FH_REVOKE_TIMEOUT): the guarantee did not hold for them",
             st.revoke_timeouts);
    if (n > 1 && !(inv && strcmp(inv, "0") == 0) && st.revoke_stalls != 0)
        FAIL("%" PRIu64 " waits ended on FH_REVOKE_STALL: the guarantee did not hold for them",
             st.revoke_stalls);
    CHECK_OK(fh_barrier(ctx));
    CHECK_OK(fh_finalize(ctx));
    for (int k = 0; k < NKIND; k++) {
        if (release_how[k] == 1) free(bufs[k]);
        if (release_how[k] == 2) munmap((void *)page_lo(bufs[k]), page_hi(bufs[k], sizes[k]) - page_lo(bufs[k]));
    }
    if (region) munmap((void *)(uintptr_t)table[0].churn, (size_t)table[0].churn_size);
    printf("PASS: rma_revoke rank %u of %u\n", me, n);
    return 0;
}
