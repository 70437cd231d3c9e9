/* Case 3 on real verbs: a partial unmap of a merged region invalidates only what overlaps it, and
 * an in-use handle stays valid until released.
 *
 * Pages [0,8) (A) and [8,16) (B) of one mapping are registered, then [4,12) (AB), which overlaps
 * both: the cache pins the union [0,16) under AB's keys. [40,48) (OTHER) is registered too. Then
 * pages [14,16) are unmapped and mapped again with new contents:
 *   - the held union's rkey still reads the OLD pages at [14,16) (shows what a stale hit would do),
 *     and still reaches the CURRENT pages on the part that was not unmapped, [0,14);
 *   - registering B (which covers the unmapped pages) misses, and RDMA READ/WRITE through its keys
 *     see the new pages; so does A (it was part of the stale union);
 *   - OTHER stays a hit with its old keys, which still work;
 *   - releasing AB unpins the stale union (16 pages), once.
 * Every byte of every range is compared (verbs_case_util.h: vc_check). The RDMA checks come before
 * the counter checks, so FH_MONITOR=none fails on the data path (stale pages), not on a counter. */
#include "verbs_case_util.h"

/* Map `len` bytes exactly at `addr` (free now), filled with pattern `seed`. */
static void map_at(char *addr, size_t len, unsigned seed) {
    void *p = mmap(addr, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    CHECK(p == addr);
    vc_fill(addr, len, seed);
}

/* RDMA READ [addr, addr+len) through `rkey` into scratch; returns the scratch copy. */
static const char *rdma_read(struct vc *v, const char *addr, size_t len, uint32_t rkey) {
    CHECK(len <= ((size_t)1 << 20));
    memset(v->scratch, 0, len);
    CHECK(vl_post_read(&v->vl, 0, v->scratch, (uint32_t)len, v->scratch_mr->lkey,
                       (uint64_t)(uintptr_t)addr, rkey, 3) == 0);
    if (vl_wait(&v->vl, 1, 60.0)) {
        fprintf(stderr, "RDMA READ through rkey %#x failed: %s\n", rkey, v->vl.err);
        exit(1);
    }
    return v->scratch;
}

int main(void) {
    struct vc v;
    vc_open(&v);
    size_t pg = fh_test_page();
    char *m = fh_test_map(64 * pg);

    fh_mr a = vc_register_new(&v, "A = pages [0,8)", m, 8 * pg, 1);
    fh_mr b = vc_register_new(&v, "B = pages [8,16)", m + 8 * pg, 8 * pg, 2);
    /* AB overlaps both: a miss that pins the union [0,16). */
    fh_mr ab = vc_register_new(&v, "AB = pages [4,12) (union [0,16))", m + 4 * pg, 8 * pg, 3);
    CHECK_OK(fh_deregister(v.c, a.handle));
    CHECK_OK(fh_deregister(v.c, b.handle));
    fh_mr other = vc_register_new(&v, "OTHER = pages [40,48)", m + 40 * pg, 8 * pg, 4);
    CHECK_OK(fh_deregister(v.c, other.handle));
    fh_stats s = fh_test_stats(v.c);
    CHECK_EQ_U64(s.regions, 2); /* the union (A and B were replaced by it) and OTHER */
    CHECK_EQ_U64(s.pinned_bytes, 24 * pg);
    CHECK_EQ_U64(s.in_use, 1); /* AB is held */

    /* The union serves A alone (a hit with AB's keys) and AB's keys cover all 16 pages. */
    fh_mr a2;
    CHECK_OK(fh_register(v.c, m, 8 * pg, VC_ACCESS, &a2));
    CHECK_EQ_U64(fh_test_stats(v.c).hits, s.hits + 1);
    CHECK_EQ_U64(a2.rkey, ab.rkey);
    CHECK_OK(fh_deregister(v.c, a2.handle));
    if (vc_check(&v, "union [0,16) through AB's keys", m, 16 * pg, &ab, 5)) return 1;
    /* Now the memory holds the RDMA WRITE pattern of that check. */
    const unsigned before = 5 + VC_WRITE_SEED;

    /* Unmap pages [14,16) (under the union's B half only) and map new pages there. */
    uint64_t inv0 = fh_test_stats(v.c).invalidations;
    CHECK(munmap(m + 14 * pg, 2 * pg) == 0);
    map_at(m + 14 * pg, 2 * pg, 6);

    /* The held union MR still has the old pages at [14,16): what a stale hit would hand out. */
    const char *seen = rdma_read(&v, m + 14 * pg, 2 * pg, ab.rkey);
    for (size_t i = 0; i < 2 * pg; i++) {
        if ((unsigned char)seen[i] != vc_byte(before, 14 * pg + i)) {
            fprintf(stderr, "held union rkey at the unmapped pages: byte %zu is %#x, expected the "
                    "old page contents %#x\n", i, (unsigned char)seen[i],
                    vc_byte(before, 14 * pg + i));
            return 1;
        }
    }
    CHECK(vc_mismatch(m + 14 * pg, 2 * pg, 6) == -1); /* the CPU sees the new pages */
    printf("  %-44s RDMA READ through rkey %#x sees the old pages: ok\n",
           "held union at the unmapped pages [14,16)", ab.rkey);

    /* B covers the unmapped pages: miss, new keys on the new pages. A: miss too (stale union). */
    fh_mr b3 = vc_register_new(&v, "B after munmap + mmap of [14,16)", m + 8 * pg, 8 * pg, 7);
    CHECK(b3.rkey != ab.rkey);
    fh_mr a3 = vc_register_new(&v, "A after munmap + mmap of [14,16)", m, 8 * pg, 8);
    CHECK(a3.rkey != ab.rkey);

    /* OTHER stays a hit with its old keys, and they still reach its pages. */
    s = fh_test_stats(v.c);
    fh_mr o2;
    CHECK_OK(fh_register(v.c, m + 40 * pg, 8 * pg, VC_ACCESS, &o2));
    CHECK_EQ_U64(fh_test_stats(v.c).hits, s.hits + 1);
    CHECK_EQ_U64(o2.rkey, other.rkey);
    CHECK_EQ_U64(o2.lkey, other.lkey);
    if (vc_check(&v, "OTHER: hit, old keys", m + 40 * pg, 8 * pg, &o2, 9)) return 1;
    CHECK_OK(fh_deregister(v.c, o2.handle));

    /* The held AB handle is still valid: its keys reach the part that was not unmapped. */
    if (vc_check(&v, "held AB on the untouched pages [0,14)", m, 14 * pg, &ab, 10)) return 1;

    s = fh_test_stats(v.c);
    CHECK_EQ_U64(s.invalidations, inv0 + 1); /* exactly one region: the union */
    CHECK_EQ_U64(s.in_use, 3);                /* AB, A3, B3 */

    /* Releasing AB unpins the stale union's 16 pages, once. */
    CHECK_OK(fh_deregister(v.c, ab.handle));
    fh_stats s2 = fh_test_stats(v.c);
    CHECK_EQ_U64(s2.pinned_bytes, s.pinned_bytes - 16 * pg);
    CHECK_EQ_U64(s2.regions, s.regions - 1);
    CHECK_EQ_U64(s2.in_use, 2);
    CHECK_STATUS(fh_deregister(v.c, ab.handle), FH_ERR_UNKNOWN_HANDLE);

    /* The new registrations are unaffected by that release. */
    if (vc_check(&v, "A after AB's release", m, 8 * pg, &a3, 11)) return 1;
    if (vc_check(&v, "B after AB's release", m + 8 * pg, 8 * pg, &b3, 12)) return 1;
    CHECK_OK(fh_deregister(v.c, a3.handle));
    CHECK_OK(fh_deregister(v.c, b3.handle));
    CHECK(munmap(m, 64 * pg) == 0);
    vc_close(&v);
    puts("verbs_case3_partial: ok");
    return 0;
}
