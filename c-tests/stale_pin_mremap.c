/* A pin whose memory went away must not keep the next mapping at its addresses partly locked
 * (mlock backend). Two caches, as two threads each with their own:
 *
 *   cache A registers the first half of a mapping and releases it (lazily cached: still locked);
 *   the application unmaps that half with libc's munmap (A only queues the invalidation: its
 *   unpin comes at A's next call), and maps new memory there with a raw mmap, which joins the
 *   untouched second half into one mapping again;
 *   cache B registers the whole mapping, releases it, and evicts it (max_regions 1, and a
 *   registration elsewhere): B's unpin.
 *
 * Then no page of the mapping may be locked, and mremap of the whole of it must succeed, as it
 * does without the library. Before the mlock count heard of unmaps, A's stale pin stayed counted,
 * so B's unpin left the first half locked and the second not: the mapping was split in two by
 * lock state and mremap failed with EFAULT (what case6_stale_threads_helper saw about once in
 * 2400 rounds, where the helper thread unpins idle regions ahead). */
#include "fh_test.h"

#include <errno.h>
#include <sys/syscall.h>

static void note_locked(void *ctx, const char *head, const char *flags) {
    (void)head;
    if (strstr(flags, " lo")) *(int *)ctx = 1;
}

/* Whether any page of [a, a + len) lies in a locked mapping ("lo" in smaps' VmFlags). */
static int any_locked(const char *a, size_t len) {
    int locked = 0;
    CHECK(fh_test_smaps_field(a, len, "VmFlags:", note_locked, &locked) >= 0);
    return locked;
}

int main(void) {
    if (FH_TEST_ASAN) {
        /* ASan's mlock interceptor locks nothing (and its munmap skips libc's patched entry). */
        printf("SKIP: AddressSanitizer build: its mlock locks nothing, so no lock state to check\n");
        return FH_SKIP;
    }
    size_t page = fh_test_page();
    size_t half = 4 * page, len = 2 * half;
    fh_cache *a = fh_test_cache(64 << 20, 16, FH_MONITOR_PATCH_LIBC);
    fh_cache *b = fh_test_cache(64 << 20, 1, FH_MONITOR_PATCH_LIBC);
    char *p = fh_test_map(len);
    char *elsewhere = fh_test_map(page);
    fh_mr mr;

    CHECK_OK(fh_register(a, p, half, FH_ACCESS_LOCAL_WRITE, &mr));
    CHECK_OK(fh_deregister(a, mr.handle));
    CHECK(any_locked(p, half));

    CHECK(munmap(p, half) == 0);
    /* Raw: no hook hears this mmap (what the stale-threads test does for its fresh mappings). */
    void *r = (void *)syscall(SYS_mmap, p, half, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    CHECK(r == p);
    memset(p, 0x6b, half);

    CHECK_OK(fh_register(b, p, len, FH_ACCESS_LOCAL_WRITE, &mr));
    CHECK_OK(fh_deregister(b, mr.handle));
    CHECK(any_locked(p, len));
    /* max_regions 1: this evicts (unpins) the region over p. */
    CHECK_OK(fh_register(b, elsewhere, page, FH_ACCESS_LOCAL_WRITE, &mr));
    CHECK_OK(fh_deregister(b, mr.handle));
    CHECK_EQ_U64(fh_test_stats(b).evictions, 1);

    if (any_locked(p, len)) {
        fprintf(stderr, "FAIL: pages of the new mapping stayed locked after its only pin went\n");
        return 1;
    }
    char *q = fh_test_map(len);
    void *moved = mremap(p, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, q);
    if (moved != q) {
        fprintf(stderr, "FAIL: mremap of the whole mapping: %s (without the library it moves)\n",
                strerror(errno));
        return 1;
    }
    CHECK(q[0] == 0x6b && q[len - 1] == 0x5a);

    /* A's late unpin of its stale region unlocks nothing it should not, and nothing breaks. */
    CHECK_OK(fh_register(a, elsewhere, page, FH_ACCESS_LOCAL_WRITE, &mr));
    CHECK_OK(fh_deregister(a, mr.handle));
    fh_cache_free(a);
    fh_cache_free(b);
    munmap(q, len);
    munmap(elsewhere, page);
    printf("stale_pin_mremap: ok\n");
    return 0;
}
