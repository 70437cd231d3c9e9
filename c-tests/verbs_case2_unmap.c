/* Case 2 on real verbs: munmap + mmap at the same address, mremap (a grow that has to move, then
 * fresh pages at the old address), and madvise(MADV_DONTNEED) (with ibv_reg_mr the pages really
 * go: the MR keeps the old ones, the CPU gets new zero pages). After each, the registration must
 * miss and RDMA READ/WRITE through the new keys must see the current pages. */
#include "verbs_case_util.h"

#define LEN ((size_t)1 << 20)

static void map_at(void *addr, size_t len) {
    void *p = mmap(addr, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    CHECK(p == addr);
}

int main(void) {
    struct vc v;
    vc_open(&v);
    size_t pg = fh_test_page();

    /* munmap + mmap at the same address. */
    char *a = fh_test_map(LEN);
    fh_mr m = vc_register_new(&v, "munmap: first registration", a, LEN, 1);
    CHECK_OK(fh_deregister(v.c, m.handle));
    CHECK(munmap(a, LEN) == 0);
    map_at(a, LEN);
    m = vc_register_new(&v, "munmap + mmap same address", a, LEN, 2);
    CHECK_OK(fh_deregister(v.c, m.handle));

    /* mremap: a page mapped right behind forces the grow to move. */
    char *b = fh_test_map(LEN + pg);
    CHECK(munmap(b + LEN, pg) == 0);
    char *blocker = mmap(b + LEN, pg, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
                         -1, 0);
    CHECK(blocker == b + LEN);
    m = vc_register_new(&v, "mremap: first registration", b, LEN, 3);
    CHECK_OK(fh_deregister(v.c, m.handle));
    char *moved = mremap(b, LEN, 2 * LEN, MREMAP_MAYMOVE);
    CHECK(moved != MAP_FAILED && moved != b);
    map_at(b, LEN);
    m = vc_register_new(&v, "mremap grow (moved) + mmap old address", b, LEN, 4);
    CHECK_OK(fh_deregister(v.c, m.handle));
    /* The moved pages at their new address: a new registration works there too. */
    m = vc_register_new(&v, "mremap: the moved range", moved, 2 * LEN, 5);
    CHECK_OK(fh_deregister(v.c, m.handle));

    /* madvise(MADV_DONTNEED) of the middle: same addresses, new pages. */
    char *d = fh_test_map(LEN);
    m = vc_register_new(&v, "madvise: first registration", d, LEN, 6);
    CHECK_OK(fh_deregister(v.c, m.handle));
    CHECK(madvise(d + LEN / 4, LEN / 2, MADV_DONTNEED) == 0);
    m = vc_register_new(&v, "madvise DONTNEED", d, LEN, 7);
    CHECK_OK(fh_deregister(v.c, m.handle));

    CHECK(munmap(a, LEN) == 0);
    CHECK(munmap(moved, 2 * LEN) == 0);
    CHECK(munmap(blocker, pg) == 0);
    CHECK(munmap(b, LEN) == 0);
    CHECK(munmap(d, LEN) == 0);
    vc_close(&v);
    puts("verbs_case2_unmap: ok");
    return 0;
}
