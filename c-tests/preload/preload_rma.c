/* The shim interplay: one program that uses fh_put / fh_get (linked against
 * libfirehose.so) and plain verbs (its own device context, protection domain and loopback QP)
 * while libfirehose_preload.so is preloaded, under mpirun (2 ranks, `setarch -R` so the static
 * window below has the same address in every rank).
 *
 * Rounds interleave the two worlds:
 *   - Firehose: every rank puts its pattern into its stripe of every rank's static window, then
 *     gets every other rank's whole window back and checks every byte; the windows change pattern
 *     each round;
 *   - plain verbs: register a fresh malloc'd buffer (the shim caches it), RDMA WRITE into it
 *     through the loopback QP, check, deregister, free; the next round's malloc usually returns
 *     the same address with new pages, so a stale registration would show as wrong bytes; an
 *     RDMA READ through the new registration must see what the CPU just wrote.
 * At the end: the shim counted hits for the plain-verbs buffers (it served them) and saw only this
 * program's registrations (the library's own go to libibverbs directly), the library counted
 * one-sided hits (Firehose kept its pins), nothing was rejected from a peer.
 * Exit 0 pass, 1 fail, 77 no device. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <firehose.h>
#include <firehose_preload.h>

#include "../common/fh_check.h"
#include "../common/verbs_loopback.h"

#define WIN (64 * 1024)
#define VBUF (256 * 1024)
#define RW (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

/* Same address in every rank (no ASLR): the target of every rank's puts and gets. */
static uint8_t window[WIN] __attribute__((aligned(4096)));

static uint8_t pat(uint32_t writer, uint32_t round, uint64_t off)
{
    uint64_t x = (off + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)writer << 40) ^ ((uint64_t)round << 52);
    x ^= x >> 31;
    return (uint8_t)(x * 0xBF58476D1CE4E5B9ull >> 56);
}

/* A failure line also goes to $FH_TEST_FAIL_LOG when set: mpirun can kill the job before it has
 * forwarded the failing rank's stderr, and the suite must see which check failed. */
static void note_fail(const char *fmt, unsigned round)
{
    const char *path = getenv("FH_TEST_FAIL_LOG");
    FILE *f = path && *path ? fopen(path, "a") : NULL;
    if (f) {
        fprintf(f, fmt, round);
        fputc('\n', f);
        fclose(f);
    }
}

#define FH_OK_OR_DIE(call)                                                                         \
    do {                                                                                           \
        fh_status s_ = (call);                                                                     \
        if (s_ != FH_OK) {                                                                         \
            fprintf(stderr, "FAILED %s:%d: %s: %s\n", __FILE__, __LINE__, #call, fh_status_str(s_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* One Firehose round: stripes of every window written by their writer, then read back whole. */
static void firehose_round(fh_ctx *ctx, uint32_t me, uint32_t n, uint32_t round, uint8_t *scratch)
{
    uint64_t stripe = WIN / n;
    for (uint32_t t = 0; t < n; t++) {
        uint64_t lo = me * stripe;
        for (uint64_t i = 0; i < stripe; i++)
            scratch[i] = pat(me, round, lo + i);
        /* Uneven pieces, so puts of several sizes (and buckets) happen. */
        for (uint64_t a = 0; a < stripe;) {
            uint64_t len = 1 + (a * 7919 + round * 104729 + t) % 6000;
            if (a + len > stripe)
                len = stripe - a;
            FH_OK_OR_DIE(fh_put(ctx, t, (uint64_t)(uintptr_t)window + lo + a, scratch + a, len));
            a += len;
        }
    }
    FH_OK_OR_DIE(fh_quiet(ctx));
    FH_OK_OR_DIE(fh_barrier(ctx));
    for (uint32_t t = 0; t < n; t++) {
        memset(scratch, 0, WIN);
        FH_OK_OR_DIE(fh_get(ctx, scratch, t, (uint64_t)(uintptr_t)window, WIN));
        for (uint64_t i = 0; i < WIN; i++) {
            uint32_t w = (uint32_t)(i / stripe);
            if (w >= n)
                w = n - 1;
            uint8_t want = pat(w, round, i);
            if (scratch[i] != want) {
                fprintf(stderr, "FAILED: round %u: rank %u's window byte %" PRIu64 " got %#x want %#x\n", round,
                        t, i, scratch[i], want);
                exit(1);
            }
        }
    }
    FH_OK_OR_DIE(fh_barrier(ctx));
}

/* One plain-verbs round on a fresh malloc'd buffer. Returns the buffer's address (for reuse
 * counting); exits on a setup failure. */
static void *verbs_round(struct vl_loop *l, uint32_t round, uint8_t *src, struct ibv_mr *src_mr)
{
    uint8_t *buf = malloc(VBUF);
    EXPECT(buf != NULL, "malloc");
    if (!buf)
        exit(1);
    memset(buf, 0, VBUF);
    struct ibv_mr *mr = ibv_reg_mr(l->pd, buf, VBUF, RW);
    EXPECT(mr != NULL, "ibv_reg_mr of a fresh buffer (round %u)", round);
    if (!mr)
        exit(1);
    /* Twice, so the shim sees a repeat it can serve from its cache. */
    struct ibv_mr *mr2 = ibv_reg_mr(l->pd, buf, VBUF, RW);
    EXPECT(mr2 != NULL, "second ibv_reg_mr (round %u)", round);
    for (size_t i = 0; i < VBUF; i++)
        src[i] = (uint8_t)(round * 37 + i * 13 + (i >> 9));
    int st = vl_rdma(l, IBV_WR_RDMA_WRITE, src, src_mr->lkey, (uint64_t)(uintptr_t)buf, mr2->rkey, VBUF);
    EXPECT(st == 0, "RDMA WRITE status %d (round %u)", st, round);
    if (memcmp(buf, src, VBUF) != 0) {
        EXPECT(0, "RDMA WRITE did not land in the buffer's pages (round %u)", round);
        note_fail("stale: RDMA WRITE did not land in the buffer's pages (round %u)", round);
    }
    /* CPU writes, RDMA READ through the registration must see them. */
    for (size_t i = 0; i < VBUF; i++)
        buf[i] = (uint8_t)(round * 91 + i * 3);
    memset(src, 0, VBUF);
    st = vl_rdma(l, IBV_WR_RDMA_READ, src, src_mr->lkey, (uint64_t)(uintptr_t)buf, mr->rkey, VBUF);
    EXPECT(st == 0, "RDMA READ status %d (round %u)", st, round);
    if (memcmp(buf, src, VBUF) != 0) {
        EXPECT(0, "RDMA READ returned other pages than the buffer's (round %u)", round);
        note_fail("stale: RDMA READ returned other pages than the buffer's (round %u)", round);
    }
    EXPECT(ibv_dereg_mr(mr2) == 0, "ibv_dereg_mr");
    EXPECT(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
    free(buf);
    if (check_failures)
        exit(1);
    return buf;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 8;
    /* A fresh mmap per malloc of VBUF, so free really gives the pages back (and the next malloc
     * of the same size usually gets the same address with new pages). */
    mallopt(M_MMAP_THRESHOLD, 64 * 1024);
    int (*shim_stats)(struct fh_preload_stats *, size_t) = (int (*)(struct fh_preload_stats *, size_t))dlsym(RTLD_DEFAULT, "fh_preload_stats");
    int want_shim = getenv("FH_TEST_EXPECT_SHIM") && atoi(getenv("FH_TEST_EXPECT_SHIM")) == 1;
    EXPECT(!want_shim || shim_stats != NULL, "the shim is not loaded");

    fh_ctx *ctx = NULL;
    FH_OK_OR_DIE(fh_init(NULL, &ctx));
    uint32_t me = fh_rank(ctx), n = fh_size(ctx);

    struct vl_loop l;
    int rc = vl_open_main(&l);
    if (rc != 0) {
        fh_finalize(ctx);
        return rc;
    }
    uint8_t *src = malloc(VBUF);
    uint8_t *scratch = malloc(WIN);
    if (!src || !scratch)
        return 1;
    struct ibv_mr *src_mr = ibv_reg_mr(l.pd, src, VBUF, RW);
    EXPECT(src_mr != NULL, "ibv_reg_mr of the source");
    if (!src_mr)
        return 1;

    int reused = 0;
    void *prev = NULL;
    for (int r = 0; r < rounds; r++) {
        firehose_round(ctx, me, n, (uint32_t)r, scratch);
        void *b = verbs_round(&l, (uint32_t)r, src, src_mr);
        reused += b == prev;
        prev = b;
    }

    fh_rma_stats rs;
    memset(&rs, 0, sizeof rs);
    FH_OK_OR_DIE(fh_get_rma_stats(ctx, &rs));
    printf("rank %u/%u: %d rounds, fresh buffer at the same address %d times; firehose: %" PRIu64
           " one-sided hits, %" PRIu64 " misses, %" PRIu64 " moves, %" PRIu64 " rejected\n",
           me, n, rounds, reused, rs.one_sided_hits, rs.misses, rs.moves, rs.rejected);
    EXPECT(rs.one_sided_hits > 0, "no one-sided hit: Firehose did not keep its remote pins");
    EXPECT(rs.rejected == 0, "a peer's message was rejected");
    if (shim_stats) {
        struct fh_preload_stats ps;
        memset(&ps, 0, sizeof ps);
        EXPECT(shim_stats(&ps, sizeof ps) == 0, "fh_preload_stats");
        printf("rank %u/%u: shim: %" PRIu64 " registrations, %" PRIu64 " hits, %" PRIu64 " misses, %" PRIu64
               " invalidations, %" PRIu64 " caches\n",
               me, n, ps.app_reg_calls, ps.hits, ps.misses, ps.invalidations, ps.caches);
        EXPECT(ps.hits >= (uint64_t)rounds, "the shim served fewer hits (%" PRIu64 ") than rounds", ps.hits);
        /* Only this program's registrations reach the shim (two a round and the source): the
         * library registers through libibverbs directly (src/pin/verbs/direct.rs), so Firehose's
         * remote pins and buffers are not cached a second time (their pages would stay pinned
         * after Firehose unpins them). */
        EXPECT(ps.app_reg_calls == 2 * (uint64_t)rounds + 1,
              "the shim saw %" PRIu64 " registrations, this program made %d", ps.app_reg_calls, 2 * rounds + 1);
        EXPECT(ps.caches == 1, "the shim made %" PRIu64 " caches (this program uses one PD, one rights class)",
              ps.caches);
        EXPECT(reused == 0 || ps.invalidations > 0, "buffers came back at the same address but nothing was invalidated");
    }
    EXPECT(ibv_dereg_mr(src_mr) == 0, "ibv_dereg_mr of the source");
    vl_close(&l);
    free(src);
    free(scratch);
    FH_OK_OR_DIE(fh_finalize(ctx));
    return check_failures ? 1 : 0;
}
