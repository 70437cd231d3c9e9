/* Case 1 on real verbs: free then malloc at the same address, for an mmapped chunk (glibc's internal
 * munmap) and for a brk-heap chunk after malloc_trim. The second registration must miss, and RDMA
 * READ/WRITE through its keys must see the NEW pages (every byte compared). */
#include <malloc.h>

#include "verbs_case_util.h"

/* Register a, release it, free it, malloc again; returns 77 if malloc moved, else 0. */
static int run(struct vc *v, const char *what, size_t len, int trim) {
    char *a = malloc(len);
    CHECK(a != NULL);
    fh_mr m1 = vc_register_new(v, what, a, len, 1);
    CHECK_OK(fh_deregister(v->c, m1.handle)); /* idle, cached */
    uintptr_t freed = (uintptr_t)a; /* only the number is used after free */
    free(a);
    if (trim) malloc_trim(0);
    char *b = malloc(len);
    CHECK(b != NULL);
    if ((uintptr_t)b != freed) {
        printf("  %s: malloc returned %p, not the freed %#lx: case not exercised\n", what,
               (void *)b, (unsigned long)freed);
        free(b);
        return FH_SKIP;
    }
    fh_mr m2 = vc_register_new(v, "... after free + malloc, same address", b, len, 7);
    CHECK_OK(fh_deregister(v->c, m2.handle));
    free(b);
    return 0;
}

int main(void) {
    struct vc v;
    vc_open(&v);
    /* mmapped chunk: a fixed threshold (glibc would otherwise raise it to the size of the freed
     * chunk, and the next malloc would come from the heap at another address). */
    CHECK(mallopt(M_MMAP_THRESHOLD, 1 << 20) == 1);
    int r1 = run(&v, "malloc 4 MiB (mmapped chunk)", (size_t)4 << 20, 0);
    /* brk heap: raise the mmap threshold so 2 MiB comes from the heap; trim it after free. */
    CHECK(mallopt(M_MMAP_THRESHOLD, 64 << 20) == 1);
    CHECK(mallopt(M_TRIM_THRESHOLD, 128 << 10) == 1);
    int r2 = run(&v, "malloc 2 MiB (brk heap) + malloc_trim", (size_t)2 << 20, 1);
    vc_close(&v);
    if (r1 == FH_SKIP && r2 == FH_SKIP) return FH_SKIP;
    puts("verbs_case1_free_malloc: ok");
    return 0;
}
