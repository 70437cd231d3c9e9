/* Case 1 (brk heap): a chunk from the brk heap, registered, freed, the heap trimmed with
 * malloc_trim (brk shrinks / pages are dropped), then malloc again at the same address: the
 * second registration must miss. */
#include <malloc.h>

#include "fh_test.h"

int main(void) {
    /* Keep 4 MiB allocations on the brk heap instead of mmap (glibc malloc only: ASan's
     * allocator has no brk heap and refuses mallopt). */
    if (FH_TEST_ASAN || mallopt(M_MMAP_THRESHOLD, 64 << 20) != 1) {
        printf("SKIP: not glibc's malloc (no brk heap to test)\n");
        return FH_SKIP;
    }
    CHECK(mallopt(M_TRIM_THRESHOLD, 128 << 10) == 1);
    fh_cache *c = fh_test_cache((size_t)1 << 30, 64, FH_MONITOR_PATCH_LIBC | FH_MONITOR_USERFAULTFD);
    size_t len = (size_t)4 << 20;

    char *a = malloc(len);
    CHECK(a != NULL);
    CHECK((char *)sbrk(0) > a); /* really on the brk heap */
    memset(a, 1, len);
    fh_mr m1, m2;
    CHECK_OK(fh_register(c, a, len, FH_ACCESS_LOCAL_WRITE, &m1));
    CHECK_OK(fh_deregister(c, m1.handle));

    char *top_before = sbrk(0);
    uintptr_t freed = (uintptr_t)a; /* only the number is used after free */
    free(a);
    malloc_trim(0);
    char *top_after = sbrk(0);
    /* Nothing may allocate between free and malloc (printf's buffer would split the chunk). */
    char *b = malloc(len);
    CHECK(b != NULL);
    printf("brk %p -> %p after free + malloc_trim\n", (void *)top_before, (void *)top_after);
    if ((uintptr_t)b != freed) {
        printf("SKIP: malloc returned %p, not the freed %#lx\n", (void *)b, (unsigned long)freed);
        free(b);
        fh_cache_free(c);
        return FH_SKIP;
    }
    memset(b, 2, len);
    CHECK_OK(fh_register(c, b, len, FH_ACCESS_LOCAL_WRITE, &m2));
    fh_stats s = fh_test_stats(c);
    if (s.hits != 0) {
        fprintf(stderr, "STALE HIT: free+trim+malloc at %p was served from the cache\n", (void *)b);
        return 1;
    }
    CHECK_EQ_U64(s.misses, 2);
    CHECK(s.invalidations >= 1);
    CHECK_OK(fh_deregister(c, m2.handle));
    free(b);
    fh_cache_free(c);
    puts("free_malloc_brk: ok");
    return 0;
}
