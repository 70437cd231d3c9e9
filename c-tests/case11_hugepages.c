/* Case 11: huge pages. A 4 MiB, 2 MiB-aligned anonymous mapping with MADV_HUGEPAGE (THP) is
 * registered; unmapping its second 2 MiB half must invalidate the registration (a miss after
 * mapping the half again), while a registration of another mapping stays a hit; then a 4 KiB hole
 * punched into a huge page (the kernel splits it) must invalidate too. The same with hugetlbfs
 * (MAP_HUGETLB) if the system has free huge pages, else that part is reported as not run.
 * Skips (77) if THP is disabled ("never"). */
#include "case_util.h"

#define HUGE (2u << 20)

/* A 2*HUGE region aligned to HUGE, from an over-sized anonymous mapping. */
static char *map_aligned(void) {
    size_t len = 3 * (size_t)HUGE;
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    char *a = (char *)(((uintptr_t)p + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
    if (a > p) CHECK(munmap(p, (size_t)(a - p)) == 0);
    char *end = a + 2 * (size_t)HUGE;
    if (end < p + len) CHECK(munmap(end, (size_t)(p + len - end)) == 0);
    return a;
}

/* AnonHugePages (KiB) of the mapping at `a` (the test maps it there); -1 if not found. */
static long anon_huge_kib(const char *a) { return fh_test_smaps_kib(a, 1, "AnonHugePages:"); }

int main(void) {
    case_watchdog(60);
    if (fh_test_thp_never()) {
        printf("SKIP: transparent huge pages are disabled\n");
        return FH_SKIP;
    }
    fh_cache *c = case_cache((size_t)256 << 20, 64);
    size_t pg = fh_test_page();

    /* Unrelated registration that must survive everything below. */
    char *other = fh_test_map(16 * pg);
    fh_mr o;
    CHECK_OK(fh_register(c, other, 16 * pg, FH_ACCESS_LOCAL_WRITE, &o));
    CHECK_OK(fh_deregister(c, o.handle));

    /* THP: unmap the second 2 MiB. */
    char *a = map_aligned();
    CHECK(madvise(a, 2 * (size_t)HUGE, MADV_HUGEPAGE) == 0);
    memset(a, 0x5a, 2 * (size_t)HUGE);
    long huge = anon_huge_kib(a);
    printf("  THP mapping %p: AnonHugePages %ld kB%s\n", (void *)a, huge,
           huge > 0 ? "" : " (no huge page was given; the invalidation is still checked)");
    fh_mr held;
    uint64_t inv0 = case_prime(c, a, 2 * (size_t)HUGE, &held);
    CHECK(munmap(a + HUGE, HUGE) == 0);
    case_map_at(a + HUGE, HUGE, 0x11);
    case_expect_miss(c, "THP: munmap of 2 MiB of 4 MiB", a, 2 * (size_t)HUGE, &held, inv0);

    /* THP: a 4 KiB hole in the first huge page (split). */
    inv0 = case_prime(c, a, 2 * (size_t)HUGE, &held);
    CHECK(munmap(a + 100 * pg, pg) == 0);
    case_map_at(a + 100 * pg, pg, 0x22);
    case_expect_miss(c, "THP: munmap of 4 KiB inside", a, 2 * (size_t)HUGE, &held, inv0);
    CHECK(munmap(a, 2 * (size_t)HUGE) == 0);

    /* The unrelated registration is still a hit. */
    fh_stats s0 = fh_test_stats(c);
    CHECK_OK(fh_register(c, other, 16 * pg, FH_ACCESS_LOCAL_WRITE, &o));
    CHECK_EQ_U64(fh_test_stats(c).hits, s0.hits + 1);
    CHECK_OK(fh_deregister(c, o.handle));

    /* hugetlbfs, if huge pages are reserved on this system. */
    char *h = mmap(NULL, 2 * (size_t)HUGE, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
    if (h == MAP_FAILED) {
        printf("  hugetlbfs: not run (MAP_HUGETLB failed: no huge pages reserved, "
               "see /proc/sys/vm/nr_hugepages)\n");
    } else {
        memset(h, 0x5a, 2 * (size_t)HUGE);
        inv0 = case_prime(c, h, 2 * (size_t)HUGE, &held);
        CHECK(munmap(h + HUGE, HUGE) == 0);
        void *p = mmap(h + HUGE, HUGE, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | MAP_FIXED_NOREPLACE, -1, 0);
        CHECK(p == h + HUGE);
        memset(p, 0x33, HUGE);
        case_expect_miss(c, "hugetlbfs: munmap of 2 MiB of 4 MiB", h, 2 * (size_t)HUGE, &held, inv0);
        CHECK(munmap(h, 2 * (size_t)HUGE) == 0);
    }

    CHECK_OK(fh_cache_finalize(c));
    puts("case11_hugepages: ok");
    return 0;
}
