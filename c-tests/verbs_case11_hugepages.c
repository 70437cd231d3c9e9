/* Case 11 on real verbs: huge pages. A 4 MiB, 2 MiB-aligned anonymous mapping backed by THP
 * (MADV_HUGEPAGE; AnonHugePages checked in /proc/self/smaps) is registered through firehose on the
 * verbs backend. Its second 2 MiB half is unmapped and mapped again with new contents:
 *   - the held registration's rkey still reads the OLD pages there (what a stale hit would hand
 *     out) and the current pages of the first half, whose contents the unmap left alone;
 *   - registering the 4 MiB again misses, and RDMA READ/WRITE through the new keys see the new
 *     pages (every byte, verbs_case_util.h: vc_check);
 *   - a 4 KiB hole punched into the first huge page (the kernel splits it) invalidates too;
 *   - a registration of another mapping stays a hit throughout.
 * Skips (77) without a device, or if the kernel gives no transparent huge page here. The RDMA
 * checks come before the counter checks, so FH_MONITOR=none fails on the data path. */
#include "verbs_case_util.h"

#define HUGE ((size_t)2 << 20)
#define LEN (2 * HUGE)

/* LEN bytes aligned to HUGE, carved from an over-sized anonymous mapping. */
static char *map_aligned(void) {
    size_t len = LEN + HUGE;
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    char *a = (char *)(((uintptr_t)p + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
    if (a > p) CHECK(munmap(p, (size_t)(a - p)) == 0);
    char *end = a + LEN;
    if (end < p + len) CHECK(munmap(end, (size_t)(p + len - end)) == 0);
    return a;
}

/* Sum of AnonHugePages (KiB) over the VMAs that overlap [a, a+len) (the range may be one VMA
 * or several after splits); -1 if smaps cannot be read. */
static long anon_huge_kib(const char *a, size_t len) {
    return fh_test_smaps_kib(a, len, "AnonHugePages:");
}

/* RDMA READ `len` (<= 1 MiB) bytes at `addr` through `rkey` and require pattern `seed` at offsets
 * base_off.. of that pattern; `what` names the check. Exits on failure. */
static void expect_read(struct vc *v, const char *what, const char *addr, size_t len,
                        uint32_t rkey, unsigned seed, size_t base_off) {
    CHECK(len <= ((size_t)1 << 20));
    memset(v->scratch, 0, len);
    CHECK(vl_post_read(&v->vl, 0, v->scratch, (uint32_t)len, v->scratch_mr->lkey,
                       (uint64_t)(uintptr_t)addr, rkey, 3) == 0);
    if (vl_wait(&v->vl, 1, 60.0)) {
        fprintf(stderr, "%s: RDMA READ through rkey %#x failed: %s\n", what, rkey, v->vl.err);
        exit(1);
    }
    for (size_t i = 0; i < len; i++) {
        if ((unsigned char)v->scratch[i] != vc_byte(seed, base_off + i)) {
            fprintf(stderr, "%s: byte %zu is %#x, expected %#x\n", what, i,
                    (unsigned char)v->scratch[i], vc_byte(seed, base_off + i));
            exit(1);
        }
    }
}

int main(void) {
    struct vc v;
    vc_open(&v);
    if (fh_test_thp_never()) {
        printf("SKIP: transparent huge pages are disabled (or not built) in this kernel\n");
        return FH_SKIP;
    }
    size_t pg = fh_test_page();

    /* Another mapping, whose registration must stay a hit through everything below. */
    char *other = fh_test_map(16 * pg);
    fh_mr o = vc_register_new(&v, "other mapping", other, 16 * pg, 1);
    CHECK_OK(fh_deregister(v.c, o.handle));

    char *a = map_aligned();
    CHECK(madvise(a, LEN, MADV_HUGEPAGE) == 0);
    vc_fill(a, LEN, 2);
    long huge = anon_huge_kib(a, LEN);
    printf("  THP mapping %p: AnonHugePages %ld kB\n", (void *)a, huge);
    if (huge <= 0) {
        printf("SKIP: the kernel gave no transparent huge page to a 2 MiB-aligned MADV_HUGEPAGE "
               "mapping (THP unavailable here)\n");
        return FH_SKIP;
    }

    /* Cached, then a hit that is held across the unmap. */
    fh_mr first = vc_register_new(&v, "THP 4 MiB: first registration", a, LEN, 3);
    CHECK_OK(fh_deregister(v.c, first.handle));
    fh_stats s0 = fh_test_stats(v.c);
    fh_mr held;
    CHECK_OK(fh_register(v.c, a, LEN, VC_ACCESS, &held));
    CHECK_EQ_U64(fh_test_stats(v.c).hits, s0.hits + 1);
    CHECK_EQ_U64(held.rkey, first.rkey);
    if (vc_check(&v, "THP 4 MiB: hit (held)", a, LEN, &held, 4)) return 1;
    const unsigned before = 4 + VC_WRITE_SEED; /* what the memory holds now */
    CHECK(anon_huge_kib(a, LEN) > 0);          /* registration kept the huge pages */

    /* Unmap the second 2 MiB and map new (THP) pages there with new contents. */
    uint64_t inv0 = s0.invalidations;
    CHECK(munmap(a + HUGE, HUGE) == 0);
    char *p = mmap(a + HUGE, HUGE, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    CHECK(p == a + HUGE);
    CHECK(madvise(p, HUGE, MADV_HUGEPAGE) == 0);
    vc_fill(p, HUGE, 5);
    printf("  after munmap + mmap of the second half: AnonHugePages %ld kB\n",
           anon_huge_kib(a, LEN));

    /* The first half is untouched, for the CPU and through the held keys. */
    long bad = vc_mismatch(a, HUGE, before);
    if (bad >= 0) {
        fprintf(stderr, "first half changed by the unmap of the second: byte %ld\n", bad);
        return 1;
    }
    for (size_t off = 0; off < HUGE; off += (size_t)1 << 20)
        expect_read(&v, "held rkey on the first half", a + off, (size_t)1 << 20, held.rkey, before,
                    off);
    /* The held MR still has the OLD pages of the second half: a stale hit would serve those. */
    for (size_t off = 0; off < HUGE; off += (size_t)1 << 20)
        expect_read(&v, "held rkey on the unmapped half (old pages)", a + HUGE + off,
                    (size_t)1 << 20, held.rkey, before, HUGE + off);
    printf("  %-44s first half current, second half the old pages: ok\n", "held rkey after the unmap");

    /* Register the 4 MiB again: miss, the new keys reach the new pages. */
    fh_mr now = vc_register_new(&v, "THP: munmap + mmap of 2 MiB of 4 MiB", a, LEN, 6);
    CHECK(now.rkey != held.rkey);
    /* The first half alone is served by that new registration. */
    fh_stats s1 = fh_test_stats(v.c);
    fh_mr half;
    CHECK_OK(fh_register(v.c, a, HUGE, VC_ACCESS, &half));
    CHECK_EQ_U64(fh_test_stats(v.c).hits, s1.hits + 1);
    CHECK_EQ_U64(half.rkey, now.rkey);
    if (vc_check(&v, "first half: hit on the new registration", a, HUGE, &half, 7)) return 1;
    CHECK_OK(fh_deregister(v.c, half.handle));

    s1 = fh_test_stats(v.c);
    CHECK(s1.invalidations > inv0);
    /* Releasing the held handle unpins the stale 4 MiB, once. */
    CHECK_OK(fh_deregister(v.c, held.handle));
    fh_stats s2 = fh_test_stats(v.c);
    CHECK_EQ_U64(s2.pinned_bytes, s1.pinned_bytes - LEN);
    CHECK_EQ_U64(s2.regions, s1.regions - 1);
    CHECK_STATUS(fh_deregister(v.c, held.handle), FH_ERR_UNKNOWN_HANDLE);
    CHECK_OK(fh_deregister(v.c, now.handle));

    /* A 4 KiB hole inside the first huge page: the kernel splits it; that must invalidate too. */
    uint64_t inv1 = fh_test_stats(v.c).invalidations;
    CHECK(munmap(a + 100 * pg, pg) == 0);
    p = mmap(a + 100 * pg, pg, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    CHECK(p == a + 100 * pg);
    now = vc_register_new(&v, "THP: munmap + mmap of 4 KiB inside", a, LEN, 8);
    CHECK(fh_test_stats(v.c).invalidations > inv1);
    CHECK_OK(fh_deregister(v.c, now.handle));

    /* The other mapping is still a hit, and its keys still work. */
    s1 = fh_test_stats(v.c);
    CHECK_OK(fh_register(v.c, other, 16 * pg, VC_ACCESS, &o));
    CHECK_EQ_U64(fh_test_stats(v.c).hits, s1.hits + 1);
    if (vc_check(&v, "other mapping: still a hit", other, 16 * pg, &o, 9)) return 1;
    CHECK_OK(fh_deregister(v.c, o.handle));

    CHECK(munmap(a, LEN) == 0);
    CHECK(munmap(other, 16 * pg) == 0);
    vc_close(&v);
    puts("verbs_case11_hugepages: ok");
    return 0;
}
