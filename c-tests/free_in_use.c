/* fh_cache_free with registrations still in use unpins everything (documented behaviour), and
 * fh_cache_finalize refuses (FH_ERR_BUSY) without changing anything until they are released. */
#include "fh_test.h"

int main(void) {
    long lck0 = FH_TEST_ASAN ? -1 : fh_test_vmlck_kib();
    size_t page = fh_test_page();
    char *buf = fh_test_map(64 * page);

    fh_cache *c = fh_test_cache(64 << 20, 64, 0);
    fh_mr held[4];
    for (int i = 0; i < 4; i++)
        CHECK_OK(fh_register(c, buf + (size_t)i * 16 * page, 16 * page, FH_ACCESS_LOCAL_WRITE, &held[i]));
    fh_stats before = fh_test_stats(c);
    CHECK_EQ_U64(before.in_use, 4);
    CHECK_STATUS(fh_cache_finalize(c), FH_ERR_BUSY);
    fh_stats after = fh_test_stats(c);
    CHECK(memcmp(&before, &after, sizeof before) == 0);
    /* Still fully usable after the refusal. */
    CHECK_OK(fh_deregister(c, held[0].handle));
    CHECK_STATUS(fh_cache_finalize(c), FH_ERR_BUSY);
    if (lck0 >= 0) CHECK(fh_test_vmlck_kib() - lck0 >= (long)(64 * page / 1024));

    /* Free with three still held: everything is unpinned. */
    fh_cache_free(c);
    if (lck0 >= 0) CHECK_EQ_U64(fh_test_vmlck_kib(), lck0);
    puts("free_in_use: ok");
    return 0;
}
