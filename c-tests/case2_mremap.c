/* Case 2 (mremap): grow that has to move, shrink in place, and a move with MREMAP_FIXED onto another
 * registered mapping. After each, the old addresses (mapped again with fresh pages) and the
 * destination must be misses, and a handle taken before stays valid until released. */
#include "case_util.h"

int main(void) {
    case_watchdog(60);
    fh_cache *c = case_cache((size_t)256 << 20, 64);
    size_t page = fh_test_page();
    size_t len = 16 * page;
    fh_mr held;

    /* Grow: a mapping right behind the buffer forces the kernel to move it. */
    char *area = fh_test_map(len + page);
    CHECK(munmap(area + len, page) == 0);
    char *blocker = mmap(area + len, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
                         -1, 0);
    CHECK(blocker == area + len);
    uint64_t inv0 = case_prime(c, area, len, &held);
    char *grown = mremap(area, len, 4 * len, MREMAP_MAYMOVE);
    CHECK(grown != MAP_FAILED);
    CHECK(grown != area); /* it had to move */
    CHECK(grown[0] == 0x5a && grown[len - 1] == 0x5a); /* contents moved with it */
    case_map_at(area, len, 0x11);
    case_expect_miss(c, "mremap grow (moved)", area, len, &held, inv0);

    /* Shrink in place: the tail goes, so the region over the old length is stale. */
    char *s = fh_test_map(len);
    inv0 = case_prime(c, s, len, &held);
    CHECK(mremap(s, len, len / 4, 0) == s);
    case_map_at(s + len / 4, len - len / 4, 0x22);
    case_expect_miss(c, "mremap shrink", s, len, &held, inv0);

    /* Move onto another registered mapping: both the source and the destination are stale. */
    char *src = fh_test_map(len);
    char *dst = fh_test_map(len);
    fh_mr held_dst;
    uint64_t inv_dst = case_prime(c, dst, len, &held_dst);
    inv0 = case_prime(c, src, len, &held);
    memset(src, 0x66, len);
    char *moved = mremap(src, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, dst);
    CHECK(moved == dst);
    CHECK(dst[0] == 0x66);
    case_map_at(src, len, 0x33);
    case_expect_miss(c, "mremap move (source)", src, len, &held, inv0);
    case_expect_miss(c, "mremap move (destination)", dst, len, &held_dst, inv_dst);

    CHECK(munmap(blocker, page) == 0);
    CHECK_OK(fh_cache_finalize(c));
    puts("case2_mremap: ok");
    return 0;
}
