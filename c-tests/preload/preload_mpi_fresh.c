/* Two MPI ranks: rank 0 sends from a freshly malloc'd buffer every iteration (freed right after,
 * so the next malloc usually gets the same address back with new pages), rank 1 receives into a
 * fresh buffer and checks every byte (three messages per buffer, so repeats can hit). Sizes are above UCX's rendezvous threshold, so with
 * UCX_IB_REG_METHODS=direct UCX registers the user buffers with ibv_reg_mr per message: under
 * libfirehose_preload.so those registrations are cached and must be invalidated by each free. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned char pattern(int iter, size_t i)
{
    return (unsigned char)(iter * 131 + i * 7 + (i >> 12));
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2) {
        if (rank == 0)
            fprintf(stderr, "needs exactly 2 ranks\n");
        MPI_Finalize();
        return 2;
    }
    /* FH_TEST_SIZES (comma list of bytes, at most 8) replaces the two sizes, e.g. to cross the
     * rendezvous threshold; the first is the one the second half repeats. */
    size_t sizes[8] = {256 * 1024, 1 << 20};
    int nsizes = 2;
    const char *list = getenv("FH_TEST_SIZES");
    if (list && *list) {
        nsizes = 0;
        for (const char *p = list; *p && nsizes < 8;) {
            char *end;
            unsigned long long v = strtoull(p, &end, 10);
            if (end == p || v == 0 || v > (1ull << 30)) {
                if (rank == 0)
                    fprintf(stderr, "bad FH_TEST_SIZES=%s\n", list);
                MPI_Finalize();
                return 2;
            }
            sizes[nsizes++] = (size_t)v;
            p = *end == ',' ? end + 1 : end;
        }
    }
    int iters = argc > 1 ? atoi(argv[1]) : 20;
    long bad = 0, reused = 0;
    void *prev = NULL;
    for (int it = 0; it < iters; it++) {
        size_t n = sizes[it % nsizes];
        if (it >= iters / 2)
            n = sizes[0]; /* second half: one size, so the address comes back each time */
        unsigned char *b = malloc(n);
        if (b == prev)
            reused++;
        prev = b;
        /* three messages per buffer (the 2nd and 3rd can hit the cache), then free it */
        for (int rep = 0; rep < 3; rep++) {
            int tag = it * 3 + rep;
            if (rank == 0) {
                for (size_t i = 0; i < n; i++)
                    b[i] = pattern(tag, i);
                MPI_Send(b, (int)n, MPI_BYTE, 1, tag, MPI_COMM_WORLD);
            } else {
                memset(b, 0, n);
                MPI_Recv(b, (int)n, MPI_BYTE, 0, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                for (size_t i = 0; i < n; i++)
                    if (b[i] != pattern(tag, i)) {
                        if (bad < 5)
                            fprintf(stderr, "iter %d size %zu: byte %zu is %u, want %u\n", tag,
                                    n, i, b[i], pattern(tag, i));
                        bad++;
                    }
            }
        }
        free(b);
    }
    long total_bad = 0;
    MPI_Reduce(&bad, &total_bad, 1, MPI_LONG, MPI_SUM, 1, MPI_COMM_WORLD);
    if (rank == 1)
        printf("mpi-fresh: %d iterations, %ld bad bytes, %ld address reuses on rank 1\n", iters,
               total_bad, reused);
    MPI_Finalize();
    return rank == 1 && total_bad ? 1 : 0;
}
