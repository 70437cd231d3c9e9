/* Helpers for the real-verbs "cases that broke real caches" tests (c-tests/verbs_case*.c): a
 * loopback RC connection (common/verbs_loopback.h), a firehose cache with the verbs backend in
 * the loopback's PD (so its keys work on those QPs), and a data-path check that proves an
 * lkey/rkey pair reaches the CURRENT pages at an address:
 *   write pattern A with the CPU, RDMA READ it through the rkey into a scratch buffer and compare
 *   every byte; RDMA WRITE pattern B from scratch through the rkey and compare every byte the CPU
 *   now sees. A stale registration (old pages) fails one of the two.
 * Exit 77 when there is no RDMA device (on the host); label `verbs` runs them in the Soft-RoCE VM. */
#ifndef FH_VERBS_CASE_UTIL_H
#define FH_VERBS_CASE_UTIL_H

#include "fh_test.h" /* first: it defines _GNU_SOURCE */

#include "verbs_loopback.h"

#define VC_ACCESS (FH_ACCESS_LOCAL_WRITE | FH_ACCESS_REMOTE_READ | FH_ACCESS_REMOTE_WRITE)
#define VC_SCRATCH ((size_t)4 << 20)
/* The RDMA WRITE pattern is seed + this, so it never equals the next call's CPU pattern (callers
 * use small seeds): stale pages left with the previous WRITE pattern cannot pass by accident. */
#define VC_WRITE_SEED 1000u

struct vc {
    struct vl_loop vl;
    fh_cache *c;
    char *scratch; /* registered directly with ibv_reg_mr, never through the cache */
    struct ibv_mr *scratch_mr;
};

/* Open the loopback and the cache (monitor bits from FH_MONITOR, default all). Exits 77 without
 * a device. */
static inline void vc_open(struct vc *v) {
    int rc = vl_open(&v->vl, NULL);
    if (rc == VL_SKIP) {
        printf("SKIP: %s\n", v->vl.err);
        exit(FH_SKIP);
    }
    if (rc) {
        fprintf(stderr, "vl_open: %s\n", v->vl.err);
        exit(1);
    }
    fh_config cfg;
    CHECK_OK(fh_config_init(&cfg));
    cfg.backend = FH_BACKEND_VERBS;
    cfg.ibv_pd = v->vl.pd;
    cfg.max_pinned = (size_t)256 << 20;
    cfg.max_regions = 64;
    CHECK_OK(fh_cache_new(&cfg, &v->c));
    v->scratch = fh_test_map(VC_SCRATCH);
    v->scratch_mr = ibv_reg_mr(v->vl.pd, v->scratch, VC_SCRATCH, IBV_ACCESS_LOCAL_WRITE);
    CHECK(v->scratch_mr != NULL);
}

static inline void vc_close(struct vc *v) {
    CHECK_OK(fh_cache_finalize(v->c));
    CHECK(ibv_dereg_mr(v->scratch_mr) == 0);
    CHECK(munmap(v->scratch, VC_SCRATCH) == 0);
    vl_close(&v->vl);
}

static inline unsigned char vc_byte(unsigned seed, size_t i) {
    return (unsigned char)(seed * 131u + i * 7u + (i >> 12));
}

static inline void vc_fill(char *p, size_t len, unsigned seed) {
    for (size_t i = 0; i < len; i++) p[i] = (char)vc_byte(seed, i);
}

/* Index of the first byte of p that differs from pattern `seed`, or -1. */
static inline long vc_mismatch(const char *p, size_t len, unsigned seed) {
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)p[i] != vc_byte(seed, i)) return (long)i;
    return -1;
}

/* The data-path check above for [addr, addr+len) through `mr` (len <= VC_SCRATCH, in chunks of
 * at most 1 MiB per work request). Returns 0, or 1 with a message naming `what`. */
static inline int vc_check(struct vc *v, const char *what, char *addr, size_t len, const fh_mr *mr,
                           unsigned seed) {
    CHECK(len <= VC_SCRATCH);
    const size_t chunk = (size_t)1 << 20;
    vc_fill(addr, len, seed);
    memset(v->scratch, 0, len);
    for (size_t off = 0; off < len; off += chunk) {
        uint32_t n = (uint32_t)(len - off < chunk ? len - off : chunk);
        CHECK(vl_post_read(&v->vl, 0, v->scratch + off, n, v->scratch_mr->lkey,
                           (uint64_t)(uintptr_t)(addr + off), mr->rkey, 1) == 0);
        if (vl_wait(&v->vl, 1, 60.0)) {
            fprintf(stderr, "%s: RDMA READ failed: %s\n", what, v->vl.err);
            return 1;
        }
    }
    long bad = vc_mismatch(v->scratch, len, seed);
    if (bad >= 0) {
        fprintf(stderr, "%s: RDMA READ through rkey %#x saw other pages: byte %ld is %#x, the "
                "memory has %#x (stale registration)\n", what, mr->rkey, bad,
                (unsigned char)v->scratch[bad], vc_byte(seed, (size_t)bad));
        return 1;
    }
    vc_fill(v->scratch, len, seed + VC_WRITE_SEED);
    for (size_t off = 0; off < len; off += chunk) {
        uint32_t n = (uint32_t)(len - off < chunk ? len - off : chunk);
        CHECK(vl_post_write(&v->vl, 0, v->scratch + off, n, v->scratch_mr->lkey,
                            (uint64_t)(uintptr_t)(addr + off), mr->rkey, 2) == 0);
        if (vl_wait(&v->vl, 1, 60.0)) {
            fprintf(stderr, "%s: RDMA WRITE failed: %s\n", what, v->vl.err);
            return 1;
        }
    }
    bad = vc_mismatch(addr, len, seed + VC_WRITE_SEED);
    if (bad >= 0) {
        fprintf(stderr, "%s: RDMA WRITE through rkey %#x did not reach the memory: byte %ld is %#x, "
                "expected %#x (stale registration)\n", what, mr->rkey, bad,
                (unsigned char)addr[bad], vc_byte(seed + VC_WRITE_SEED, (size_t)bad));
        return 1;
    }
    printf("  %-44s RDMA READ + WRITE of %zu bytes through rkey %#x: ok\n", what, len, mr->rkey);
    return 0;
}

/* Register [addr, addr+len) expecting a MISS (the memory under it is new), then check the data
 * path. Exits on failure; returns the registration (still held). */
static inline fh_mr vc_register_new(struct vc *v, const char *what, char *addr, size_t len,
                                    unsigned seed) {
    fh_stats s0 = fh_test_stats(v->c);
    fh_mr mr;
    CHECK_OK(fh_register(v->c, addr, len, VC_ACCESS, &mr));
    fh_stats s1 = fh_test_stats(v->c);
    int stale_hit = s1.hits != s0.hits;
    /* The data path is checked even on a hit: it shows what a stale hit does to RDMA. */
    int bad = vc_check(v, what, addr, len, &mr, seed);
    if (stale_hit) {
        fprintf(stderr, "STALE HIT after %s: served from the cache (rkey %#x)\n", what, mr.rkey);
        exit(1);
    }
    if (bad) exit(1);
    CHECK_EQ_U64(s1.misses, s0.misses + 1);
    return mr;
}

#endif /* FH_VERBS_CASE_UTIL_H */
