/* The stale-registration cases (memory freed or unmapped, then reused at the same address; docs/guarantees.md,
 * "The invalidation guarantee"), through unmodified verbs calls under libfirehose_preload.so:
 *
 *   register buf (pattern A), deregister (the cache keeps it), change the memory under the same
 *   virtual address, write pattern B, register the same range again, then
 *     - RDMA READ through the new rkey must return B (not the old pages' A), and
 *     - RDMA WRITE of pattern C through the new rkey must be visible to the CPU at buf.
 *
 * Cases (argv[1]): free-malloc, munmap-mmap, mremap, madvise-dontneed, mmap-fixed.
 * Exit 0 pass, 1 fail (stale pages used), 3 the case could not be set up (address not reused),
 * 77 no device. Under FH_TEST_NO_INVALIDATE=1 the shim keeps the stale registration: exit 1. */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "../common/fh_check.h"
#include "../common/verbs_loopback.h"

#define LEN (256 * 1024)
#define RW (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static void *map_at(void *hint)
{
    void *p = mmap(hint, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* Replace the memory under buf by new pages at the same address; returns the (same) address or
 * NULL if the address could not be reused. */
static char *change_memory(const char *how, char *buf)
{
    if (strcmp(how, "free-malloc") == 0) {
        free(buf);
        char *n = malloc(LEN); /* mmap threshold pinned below: a fresh mmap, same spot */
        return n == buf ? n : NULL;
    }
    if (strcmp(how, "munmap-mmap") == 0) {
        munmap(buf, LEN);
        char *n = map_at(buf);
        return n == buf ? n : NULL;
    }
    if (strcmp(how, "mremap") == 0) {
        /* shrink to one page (the tail goes), grow back in place: new pages for the tail, and
         * also move the whole thing away and back to replace the first page too */
        if (mremap(buf, LEN, 4096, 0) != buf)
            return NULL;
        if (mremap(buf, 4096, LEN, 0) != buf)
            return NULL;
        char *tmp = map_at(NULL);
        if (!tmp)
            return NULL;
        char *moved = mremap(buf, LEN, LEN, MREMAP_MAYMOVE | MREMAP_FIXED, tmp);
        if (moved != tmp)
            return NULL;
        munmap(moved, LEN);
        char *n = map_at(buf);
        return n == buf ? n : NULL;
    }
    if (strcmp(how, "madvise-dontneed") == 0)
        return madvise(buf, LEN, MADV_DONTNEED) == 0 ? buf : NULL;
    if (strcmp(how, "mmap-fixed") == 0) {
        char *n = mmap(buf, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                       -1, 0);
        return n == buf ? n : NULL;
    }
    fprintf(stderr, "unknown case %s\n", how);
    return NULL;
}

static char *alloc_for(const char *how)
{
    if (strcmp(how, "free-malloc") == 0)
        return malloc(LEN);
    return map_at(NULL);
}

/* first offset where p differs from byte v, or -1 */
static long first_diff(const char *p, int v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != (char)v)
            return (long)i;
    return -1;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s free-malloc|munmap-mmap|mremap|madvise-dontneed|mmap-fixed\n",
                argv[0]);
        return 2;
    }
    const char *how = argv[1];
    /* A fixed mmap threshold (no dynamic raise after a free) so malloc(LEN) is an mmapped chunk
     * and its free is a munmap inside glibc (not visible to an LD_PRELOAD munmap). */
    mallopt(M_MMAP_THRESHOLD, 64 * 1024);

    struct vl_loop l;
    int rc = vl_open_main(&l);
    if (rc)
        return rc;
    /* the local side of every transfer: a separate buffer, registered once */
    char *local = aligned_alloc(4096, LEN);
    memset(local, 0, LEN);
    struct ibv_mr *lmr = ibv_reg_mr(l.pd, local, LEN, RW);
    if (!lmr) {
        fprintf(stderr, "setup failed\n");
        return 1;
    }

    /* A background thread the shim or its monitor starts may map memory (its stack, its malloc
     * arena) at any moment and take the address we free; then the address is not reused and
     * nothing can be stale. Try a few times: each attempt is a complete, genuine instance. */
    char *buf = NULL, *same = NULL;
    for (int attempt = 0; attempt < 5 && !same; attempt++) {
        buf = alloc_for(how);
        if (!buf) {
            fprintf(stderr, "allocation failed\n");
            return 1;
        }
        memset(buf, 'A', LEN);
        struct ibv_mr *m1 = ibv_reg_mr(l.pd, buf, LEN, RW);
        EXPECT(m1 != NULL, "first registration");
        if (!m1)
            return 1;
        /* sanity: the first registration works at all */
        int st0 = vl_rdma(&l, IBV_WR_RDMA_READ, local, lmr->lkey, (uintptr_t)buf, m1->rkey, LEN);
        EXPECT(st0 == 0 && first_diff(local, 'A', LEN) < 0, "baseline READ (status %d)", st0);
        ibv_dereg_mr(m1);
        same = change_memory(how, buf);
        if (!same)
            fprintf(stderr, "%s: attempt %d: address %p not reused, retrying\n", how, attempt,
                    (void *)buf);
    }
    if (!same) {
        fprintf(stderr, "%s: could not reuse the address; case not exercised\n", how);
        return 3;
    }
    int st;
    memset(buf, 'B', LEN);
    struct ibv_mr *m2 = ibv_reg_mr(l.pd, buf, LEN, RW);
    EXPECT(m2 != NULL, "second registration");
    if (!m2)
        return 1;

    memset(local, 0, LEN);
    st = vl_rdma(&l, IBV_WR_RDMA_READ, local, lmr->lkey, (uintptr_t)buf, m2->rkey, LEN);
    long bad = first_diff(local, 'B', LEN);
    EXPECT(st == 0, "RDMA READ status %d", st);
    EXPECT(bad < 0, "%s: RDMA READ saw stale data at offset %ld ('%c' instead of 'B')", how, bad,
          bad >= 0 ? local[bad] : '?');

    memset(local, 'C', LEN);
    st = vl_rdma(&l, IBV_WR_RDMA_WRITE, local, lmr->lkey, (uintptr_t)buf, m2->rkey, LEN);
    bad = first_diff(buf, 'C', LEN);
    EXPECT(st == 0, "RDMA WRITE status %d", st);
    EXPECT(bad < 0, "%s: RDMA WRITE went to stale pages: CPU sees '%c' at offset %ld", how,
          bad >= 0 ? buf[bad] : '?', bad);

    ibv_dereg_mr(m2);
    ibv_dereg_mr(lmr);
    if (check_failures) {
        fprintf(stderr, "preload_stale %s: %d check(s) failed\n", how, check_failures);
        return 1;
    }
    printf("preload_stale %s: new pages used by RDMA READ and WRITE\n", how);
    return 0;
}
