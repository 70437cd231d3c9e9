/* Bad input at the C boundary: every case returns its documented status, writes no output and
 * leaves the cache's counters exactly as they were. */
#include "fh_test.h"

static void same_stats(const fh_stats *a, const fh_stats *b, int line) {
    if (memcmp(a, b, sizeof *a) != 0) {
        fprintf(stderr, "bad_input.c:%d: stats changed by a failed call\n", line);
        exit(1);
    }
}
#define SAME(a, b) same_stats(&(a), &(b), __LINE__)

int main(void) {
    fh_cache *c = fh_test_cache(64 << 20, 64, 0);
    size_t page = fh_test_page();
    char *buf = fh_test_map(4 * page);

    /* One good registration so the counters are not all zero. */
    fh_mr good;
    CHECK_OK(fh_register(c, buf, page, FH_ACCESS_LOCAL_WRITE, &good));
    fh_stats before = fh_test_stats(c);

    /* A sentinel output: any write to it by a failing call is caught. */
    fh_mr out, sentinel;
    memset(&sentinel, 0xA5, sizeof sentinel);
    out = sentinel;

    CHECK_STATUS(fh_register(NULL, buf, page, 0, &out), FH_ERR_NULL);
    CHECK_STATUS(fh_register(c, NULL, page, 0, &out), FH_ERR_NULL);
    CHECK_STATUS(fh_register(c, buf, page, 0, NULL), FH_ERR_NULL);
    CHECK_STATUS(fh_register(c, buf, 0, 0, &out), FH_ERR_ZERO_LENGTH);
    CHECK_STATUS(fh_register(c, buf, SIZE_MAX, 0, &out), FH_ERR_OVERFLOW);
    CHECK_STATUS(fh_register(c, (void *)(UINTPTR_MAX - 10), 100, 0, &out), FH_ERR_OVERFLOW);
    CHECK_STATUS(fh_register(c, buf, page, 16, &out), FH_ERR_BAD_ACCESS);
    CHECK_STATUS(fh_register(c, buf, page, 0x80000000u, &out), FH_ERR_BAD_ACCESS);
    /* Larger than max_pinned can never be cached. */
    CHECK_STATUS(fh_register(c, buf, (size_t)128 << 20, 0, &out), FH_ERR_TOO_LARGE);
    CHECK(memcmp(&out, &sentinel, sizeof out) == 0);
    fh_stats after = fh_test_stats(c);
    SAME(before, after);

    /* Unknown handles: made up, zero, and the good one released twice. */
    CHECK_STATUS(fh_deregister(NULL, good.handle), FH_ERR_NULL);
    CHECK_STATUS(fh_deregister(c, 0), FH_ERR_UNKNOWN_HANDLE);
    CHECK_STATUS(fh_deregister(c, 0xdeadbeefcafef00dull), FH_ERR_UNKNOWN_HANDLE);
    CHECK_STATUS(fh_deregister(c, good.handle + 1), FH_ERR_UNKNOWN_HANDLE);
    after = fh_test_stats(c);
    SAME(before, after);
    CHECK_OK(fh_deregister(c, good.handle));
    before = fh_test_stats(c);
    CHECK_EQ_U64(before.in_use, 0);
    CHECK_STATUS(fh_deregister(c, good.handle), FH_ERR_UNKNOWN_HANDLE);
    after = fh_test_stats(c);
    SAME(before, after);

    /* Introspection with NULLs. */
    fh_stats st;
    memset(&st, 0xA5, sizeof st);
    fh_stats st_sentinel = st;
    CHECK_STATUS(fh_get_stats(NULL, &st), FH_ERR_NULL);
    CHECK_STATUS(fh_get_stats(c, NULL), FH_ERR_NULL);
    CHECK(memcmp(&st, &st_sentinel, sizeof st) == 0);
    CHECK_STATUS(fh_info(NULL, NULL, 0, NULL), FH_ERR_NULL);
    CHECK_STATUS(fh_info(c, NULL, 10, NULL), FH_ERR_NULL);
    CHECK_STATUS(fh_print_info(NULL, 1), FH_ERR_NULL);
    CHECK_STATUS(fh_print_info(c, -1), FH_ERR_BAD_CONFIG);
    CHECK_STATUS(fh_flush(NULL, NULL), FH_ERR_NULL);
    CHECK_STATUS(fh_set_limits(NULL, 1, 1), FH_ERR_NULL);
    CHECK_STATUS(fh_set_limits(c, 0, 1), FH_ERR_BAD_CONFIG);
    CHECK_STATUS(fh_get_limits(NULL, NULL, NULL), FH_ERR_NULL);
    size_t mp = 0, mr = 0;
    CHECK_OK(fh_get_limits(c, &mp, &mr));
    CHECK_EQ_U64(mp, 64 << 20);
    CHECK_EQ_U64(mr, 64);

    /* fh_notify_unmapped validates too, and invalidates nothing when it refuses. */
    CHECK_STATUS(fh_notify_unmapped(NULL, page), FH_ERR_NULL);
    CHECK_STATUS(fh_notify_unmapped(buf, 0), FH_ERR_ZERO_LENGTH);
    CHECK_STATUS(fh_notify_unmapped((void *)(UINTPTR_MAX - 10), 100), FH_ERR_OVERFLOW);
    after = fh_test_stats(c);
    SAME(before, after);

    /* Config and lifecycle NULLs. */
    fh_cache *c2 = (fh_cache *)&sentinel; /* must not be overwritten on failure */
    CHECK_STATUS(fh_config_init(NULL), FH_ERR_NULL);
    CHECK_STATUS(fh_cache_new(NULL, NULL), FH_ERR_NULL);
    fh_config cfg;
    CHECK_OK(fh_config_init(&cfg));
    cfg.backend = FH_BACKEND_MLOCK;
    fh_config bad = cfg;
    bad.struct_size = 8;
    CHECK_STATUS(fh_cache_new(&bad, &c2), FH_ERR_BAD_CONFIG);
    bad = cfg;
    bad.struct_size = sizeof(fh_config) + 8;
    CHECK_STATUS(fh_cache_new(&bad, &c2), FH_ERR_BAD_CONFIG);
    bad = cfg;
    bad.backend = 42;
    CHECK_STATUS(fh_cache_new(&bad, &c2), FH_ERR_BAD_CONFIG);
    bad = cfg;
    bad.max_pinned = 0;
    CHECK_STATUS(fh_cache_new(&bad, &c2), FH_ERR_BAD_CONFIG);
    bad = cfg;
    bad.monitor = 0x100;
    CHECK_STATUS(fh_cache_new(&bad, &c2), FH_ERR_BAD_CONFIG);
    bad = cfg;
    bad.reserved = 1;
    CHECK_STATUS(fh_cache_new(&bad, &c2), FH_ERR_BAD_CONFIG);
    bad = cfg;
    bad.ibv_pd = buf; /* a PD makes no sense with mlock */
    CHECK_STATUS(fh_cache_new(&bad, &c2), FH_ERR_BAD_CONFIG);
    CHECK(c2 == (fh_cache *)&sentinel);

    fh_cache_free(NULL);
    CHECK_OK(fh_cache_finalize(NULL));
    CHECK_OK(fh_cache_finalize(c));
    puts("bad_input: ok");
    return 0;
}
