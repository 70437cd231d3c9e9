/* Case 2 (munmap family): munmap of a whole registered mapping, munmap of part of it, and
 * mmap(MAP_FIXED) over it. After each, the same addresses are mapped again (fresh pages) and
 * registering them must be a miss with a new key, while a handle taken before the unmap stays
 * valid until released.
 *
 * Proof that the libc hooks matter: FH_MONITOR=patch FH_TEST_DISABLE_HOOKS=munmap,mmap makes this
 * fail with a STALE HIT (the userfaultfd path alone is asynchronous; see case2_brk_shm.c for it). */
#include "case_util.h"

int main(void) {
    case_watchdog(60);
    fh_cache *c = case_cache((size_t)256 << 20, 64);
    size_t page = fh_test_page();
    size_t len = 16 * page;
    fh_mr held;

    /* munmap of the whole mapping. */
    char *a = fh_test_map(len);
    uint64_t inv0 = case_prime(c, a, len, &held);
    CHECK(munmap(a, len) == 0);
    case_map_at(a, len, 0x11);
    case_expect_miss(c, "munmap whole", a, len, &held, inv0);

    /* munmap of the last quarter only: the region over the whole range is stale. */
    char *b = fh_test_map(len);
    inv0 = case_prime(c, b, len, &held);
    CHECK(munmap(b + 12 * page, 4 * page) == 0);
    case_map_at(b + 12 * page, 4 * page, 0x22);
    case_expect_miss(c, "munmap partial (tail)", b, len, &held, inv0);

    /* munmap of a page in the middle (splits the mapping in two). */
    char *d = fh_test_map(len);
    inv0 = case_prime(c, d, len, &held);
    CHECK(munmap(d + 5 * page, page) == 0);
    case_map_at(d + 5 * page, page, 0x33);
    case_expect_miss(c, "munmap partial (middle page)", d, len, &held, inv0);

    /* mmap(MAP_FIXED) straight over the registered range: no munmap call at all. */
    char *e = fh_test_map(len);
    inv0 = case_prime(c, e, len, &held);
    void *p = mmap(e + 4 * page, 8 * page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    CHECK(p == e + 4 * page);
    memset(p, 0x44, 8 * page);
    case_expect_miss(c, "mmap(MAP_FIXED) over", e, len, &held, inv0);

    /* A registration elsewhere was never touched by any of this: still a hit. */
    char *f = fh_test_map(len);
    inv0 = case_prime(c, f, len, &held);
    CHECK_OK(fh_deregister(c, held.handle));
    fh_stats s = fh_test_stats(c);
    CHECK_EQ_U64(s.invalidations, inv0);

    CHECK_OK(fh_cache_finalize(c));
    puts("case2_munmap: ok");
    return 0;
}
