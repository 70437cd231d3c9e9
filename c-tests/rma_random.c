/* fh_put / fh_get to any address of any rank, every byte checked. Runs as a job of one (ctest:
 * every operation is a local copy through the same API) and under mpirun on a device
 * (tests/verbs-suite.d/63-rma-mpi.sh, 2 and 4 ranks, started through `setarch -R` so the static
 * exchange table below sits at the same address in every rank).
 *
 * Every rank allocates a buffer of its own random size (not symmetric), fills it with a pattern
 * that is a function of (owner, generation, offset), and publishes (address, size) in rank 0's
 * table; then:
 *   1. random gets of random lengths at random offsets from random ranks (self included), every
 *      byte compared with the owner's pattern; half blocking, half non-blocking with fh_wait;
 *   2. puts: writer w covers its stripe of every target's buffer with random-sized puts in random
 *      order (some implicit, collected by fh_quiet); after a barrier each owner checks every
 *      stripe of its own buffer holds the writer's pattern;
 *   3. bad input: NULL, zero length, overflow, bad rank, spent and made-up handles; a get and a
 *      put at an address unmapped in the target get FH_ERR_REMOTE_FAULT and change nothing;
 *   4. stats: the one-sided hit rate and the pin counters are printed; no peer message may have
 *      been rejected.
 * FH_TEST_BREAK=1: rank 0 flips one byte of its expectation once: the run must fail. */
#include "fh_test.h"

#include <inttypes.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_RANKS 64
struct slot {
    uint64_t addr, size, dead;
};
/* Filled at rank 0 by puts from every rank, then read by everyone. Same address in every rank
 * only without ASLR (setarch -R); a job of one does not care. */
static struct slot table[MAX_RANKS];

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void) {
    return fh_rand(&rng);
}

static uint8_t pat(uint32_t owner, uint32_t gen, uint64_t off) {
    uint64_t x = (off + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)owner << 40) ^ ((uint64_t)gen << 56);
    x ^= x >> 29;
    return (uint8_t)(x * 0xBF58476D1CE4E5B9ull >> 56);
}

static int break_once;

static void check_bytes(const uint8_t *got, uint32_t owner, uint32_t gen, uint64_t off, size_t len,
                        const char *what) {
    for (size_t i = 0; i < len; i++) {
        uint8_t want = pat(owner, gen, off + i);
        if (break_once && i == len / 2) {
            break_once = 0;
            want ^= 1;
        }
        if (got[i] != want) {
            char line[256];
            snprintf(line, sizeof line,
                     "FAIL: %s: byte %zu of %zu (owner %u, offset %" PRIu64 "): got %#x want %#x\n", what, i,
                     len, owner, off + i, got[i], want);
            fh_test_report_fail(line);
            exit(1);
        }
    }
}

static size_t env_size(const char *k, size_t dflt) {
    const char *v = getenv(k);
    return v && *v ? (size_t)strtoull(v, NULL, 0) : dflt;
}

int main(void) {
    if (!getenv("PMIX_RANK")) unsetenv("FH_BOOTSTRAP");
    break_once = getenv("FH_TEST_BREAK") && atoi(getenv("FH_TEST_BREAK")) == 1;
    fh_ctx *ctx = NULL;
    CHECK_OK(fh_init(NULL, &ctx));
    uint32_t me = fh_rank(ctx), n = fh_size(ctx);
    CHECK(n <= MAX_RANKS);
    if (getenv("PMIX_RANK")) {
        /* A forked child cannot bootstrap through its parent's PMIx connection: fh_init there
         * fails at once (it hung in libpmix, with no progress thread in the child). */
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            alarm(30);
            fh_ctx *c2 = NULL;
            fh_status s = fh_init(NULL, &c2);
            _exit(s == FH_ERR_BOOTSTRAP && c2 == NULL ? 0 : 1);
        }
        int ws = 0;
        CHECK(waitpid(pid, &ws, 0) == pid);
        if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
            fprintf(stderr, "fh_init in a forked child: %s %d (want a prompt FH_ERR_BOOTSTRAP)\n",
                    WIFEXITED(ws) ? "exit" : "signal", WIFEXITED(ws) ? WEXITSTATUS(ws) : WTERMSIG(ws));
            exit(1);
        }
    }
    rng ^= (uint64_t)(me + 1) * 0x2545F4914F6CDD1Dull;
    size_t base = env_size("FH_TEST_BUF", 256 << 10);
    size_t ops = env_size("FH_TEST_OPS", 400);
    break_once = break_once && me == 0;

    /* A buffer of this rank's own size, and a page that is unmapped (its address published). */
    size_t size = base + (next() % base);
    uint8_t *buf = malloc(size);
    CHECK(buf);
    for (size_t i = 0; i < size; i++) buf[i] = pat(me, 1, i);
    /* A one-page hole between two PROT_NONE guard pages: nothing the test allocates later can
     * land in it (malloc never maps a single page), and both neighbours fault too. */
    uint8_t *guard = mmap(NULL, 3 * 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(guard != MAP_FAILED);
    uint8_t *dead = guard + 4096;
    CHECK(munmap(dead, 4096) == 0);
    struct slot mine = {(uint64_t)(uintptr_t)buf, size, (uint64_t)(uintptr_t)dead};
    CHECK_OK(fh_put(ctx, 0, (uint64_t)(uintptr_t)&table[me], &mine, sizeof mine));
    CHECK_OK(fh_barrier(ctx));
    CHECK_OK(fh_get(ctx, table, 0, (uint64_t)(uintptr_t)table, n * sizeof table[0]));
    CHECK(table[me].addr == mine.addr && table[me].size == size);
    CHECK_OK(fh_barrier(ctx));

    /* 1. Random gets. */
    size_t maxlen = 3 * 4096 + 100;
    uint8_t *got = malloc(maxlen);
    CHECK(got);
    for (size_t k = 0; k < ops; k++) {
        uint32_t t = (uint32_t)(next() % n);
        size_t len = 1 + next() % (k % 4 == 0 ? maxlen : 64);
        if (len > table[t].size) len = table[t].size;
        uint64_t off = next() % (table[t].size - len + 1);
        memset(got, 0xEE, len);
        if (k % 2) {
            CHECK_OK(fh_get(ctx, got, t, table[t].addr + off, len));
        } else {
            fh_op op = 0;
            CHECK_OK(fh_get_nb(ctx, got, t, table[t].addr + off, len, &op));
            CHECK(op != 0);
            CHECK_OK(fh_wait(ctx, op));
            CHECK(fh_wait(ctx, op) == FH_ERR_UNKNOWN_HANDLE); /* spent */
        }
        check_bytes(got, t, 1, off, len, "get");
    }
    CHECK_OK(fh_barrier(ctx));

    /* 2. Puts: writer w covers stripe w of every target, in random-sized pieces, random order. */
    for (uint32_t t = 0; t < n; t++) {
        uint64_t stripe = table[t].size / n, lo = me * stripe;
        uint64_t hi = me == n - 1 ? table[t].size : lo + stripe;
        uint8_t *src = malloc(hi - lo + 1);
        CHECK(src);
        for (uint64_t i = lo; i < hi; i++) src[i - lo] = pat(me, 2 + t, i);
        /* Cut [lo, hi) into pieces, then issue them in a shuffled order. */
        uint64_t cuts[512];
        size_t nc = 0;
        for (uint64_t at = lo; at < hi && nc < 511;) {
            cuts[nc++] = at;
            at += 1 + next() % (nc % 3 == 0 ? 9000 : 300);
        }
        cuts[nc] = hi;
        size_t order[512];
        for (size_t i = 0; i < nc; i++) order[i] = i;
        for (size_t i = nc; i > 1; i--) {
            size_t j = next() % i, tmp = order[i - 1];
            order[i - 1] = order[j];
            order[j] = tmp;
        }
        for (size_t i = 0; i < nc; i++) {
            size_t c = order[i];
            uint64_t a = cuts[c], b = cuts[c + 1] < hi ? cuts[c + 1] : hi;
            if (a >= b) continue;
            if (i % 3 == 0)
                CHECK_OK(fh_put_nb(ctx, t, table[t].addr + a, src + (a - lo), b - a, NULL));
            else
                CHECK_OK(fh_put(ctx, t, table[t].addr + a, src + (a - lo), b - a));
        }
        CHECK_OK(fh_quiet(ctx));
        free(src);
    }
    CHECK_OK(fh_barrier(ctx));
    for (uint32_t w = 0; w < n; w++) {
        uint64_t stripe = size / n, lo = w * stripe, hi = w == n - 1 ? size : lo + stripe;
        for (uint64_t i = lo; i < hi; i++) {
            if (buf[i] != pat(w, 2 + me, i)) {
                char line[256];
                snprintf(line, sizeof line,
                         "FAIL: put: rank %u's byte %" PRIu64 " (stripe of %u): got %#x want %#x\n", me, i, w,
                         buf[i], pat(w, 2 + me, i));
                fh_test_report_fail(line);
                return 1;
            }
        }
    }
    CHECK_OK(fh_barrier(ctx));

    /* 3. Bad input: a documented status, nothing done. */
    uint32_t peer = (me + 1) % n;
    uint64_t some = table[peer].addr;
    CHECK_STATUS(fh_put(NULL, peer, some, got, 8), FH_ERR_NULL);
    CHECK_STATUS(fh_put(ctx, peer, some, NULL, 8), FH_ERR_NULL);
    CHECK_STATUS(fh_put(ctx, peer, some, got, 0), FH_ERR_ZERO_LENGTH);
    CHECK_STATUS(fh_get(ctx, got, peer, UINT64_MAX - 3, 8), FH_ERR_OVERFLOW);
    CHECK_STATUS(fh_get(ctx, got, n, some, 8), FH_ERR_BAD_RANK);
    CHECK_STATUS(fh_wait(ctx, 0), FH_ERR_UNKNOWN_HANDLE);
    CHECK_STATUS(fh_wait(ctx, 0xdeadbeef), FH_ERR_UNKNOWN_HANDLE);
    int done = 7;
    CHECK_STATUS(fh_test(ctx, 0xdeadbeef, &done), FH_ERR_UNKNOWN_HANDLE);
    CHECK(done == 7);
    CHECK_STATUS(fh_test(ctx, 1, NULL), FH_ERR_NULL);
    CHECK_STATUS(fh_quiet(NULL), FH_ERR_NULL);
    memset(got, 0x5A, 64);
    CHECK_STATUS(fh_get(ctx, got, peer, table[peer].dead, 64), FH_ERR_REMOTE_FAULT);
    CHECK_STATUS(fh_put(ctx, peer, table[peer].dead + 100, got, 64), FH_ERR_REMOTE_FAULT);
    /* A range that starts mapped and runs into the unmapped page cannot be pinned either. */
    CHECK_STATUS(fh_get(ctx, got, peer, table[peer].dead - 8, 16), FH_ERR_REMOTE_FAULT);
    fh_op op = 0;
    CHECK_OK(fh_put_nb(ctx, peer, table[peer].dead, got, 8, &op));
    CHECK_STATUS(fh_wait(ctx, op), FH_ERR_REMOTE_FAULT);
    CHECK_OK(fh_barrier(ctx));
    /* Still working after the faults: one more checked get from every rank (the start of
     * stripe 0, written by rank 0 in step 2). */
    for (uint32_t t = 0; t < n; t++) {
        CHECK_OK(fh_get(ctx, got, t, table[t].addr, 32));
        check_bytes(got, 0, 2 + t, 0, 32, "get after faults");
    }

    fh_rma_stats st;
    CHECK_STATUS(fh_get_rma_stats(ctx, NULL), FH_ERR_NULL);
    CHECK_OK(fh_get_rma_stats(ctx, &st));
    uint64_t remote = st.one_sided_hits + st.misses;
    printf("rank %u/%u: %" PRIu64 " puts %" PRIu64 " gets (%" PRIu64 " self), one-sided %" PRIu64
           " of %" PRIu64 " (%.2f %%), moves %" PRIu64 ", puts in move %" PRIu64
           ", pins %" PRIu64 " unpins %" PRIu64 " victim hits %" PRIu64 ", pinned %" PRIu64
           " peak %" PRIu64 ", failures %" PRIu64 ", rejected %" PRIu64 "\n",
           me, n, st.puts, st.gets, st.self_ops, st.one_sided_hits, remote,
           remote ? 100.0 * (double)st.one_sided_hits / (double)remote : 100.0, st.moves,
           st.puts_in_move, st.pins, st.unpins, st.victim_hits, st.pinned_bytes, st.pinned_peak,
           st.failures, st.rejected);
    CHECK_EQ_U64(st.rejected, 0);
    /* Honest peers: nothing refused, nobody given up on. */
    CHECK_EQ_U64(st.moves_refused, 0);
    CHECK_EQ_U64(st.bad_quota_sets, 0);
    CHECK_EQ_U64(st.revoke_written_off, 0);
    CHECK_EQ_U64(st.revoke_holders_given_up, 0);
    /* Memory windows (FH_MW): FH_TEST_EXPECT_MW=1 or 0 says whether this rank's grants must be
     * windows; with them, every grant bound one and nothing failed. */
    printf("rank %u: windows on %" PRIu64 ", bound %" PRIu64 ", dropped %" PRIu64
           ", failed %" PRIu64 "\n", me, st.windows_on, st.windows_bound, st.windows_dropped,
           st.windows_failed);
    if (getenv("FH_TEST_EXPECT_MW") && n > 1) {
        uint64_t want = (uint64_t)atoi(getenv("FH_TEST_EXPECT_MW"));
        CHECK_EQ_U64(st.windows_on, want);
        if (want) CHECK(st.windows_bound > 0);
        else CHECK_EQ_U64(st.windows_bound, 0);
        CHECK_EQ_U64(st.windows_failed, 0);
        CHECK(st.windows_dropped <= st.windows_bound);
    }
    if (n == 1) CHECK_EQ_U64(st.self_ops, st.puts + st.gets);
    CHECK_OK(fh_barrier(ctx));
    CHECK_OK(fh_finalize(ctx));
    free(got);
    free(buf);
    printf("PASS: rma_random rank %u of %u\n", me, n);
    return 0;
}
