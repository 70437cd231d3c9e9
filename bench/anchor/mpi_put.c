/* The anchor of scripts/bench-fh, second form: MPI_Put (passive target, MPI_Win_lock_all, one
 * MPI_Win_flush per put or per window) from rank 0 to rank 1's window, the same two measures as
 * shmem_put.c, and the same two for MPI_Get (+ MPI_Win_flush per get, or per window of 64 KiB
 * gets into one local buffer) from rank 1's window. The osc component is the launcher's choice (--mca osc ucx or rdma).
 * Usage: mpirun -np 2 mpi_put [ITERS] [BW_MSGS] [WINDOW]. One JSON line on rank 0's stdout. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x5EED1234ABCDULL;
static uint64_t next(void) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1DULL;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int iters = argc > 1 ? atoi(argv[1]) : 2000;
    int msgs = argc > 2 ? atoi(argv[2]) : 200;
    int window = argc > 3 ? atoi(argv[3]) : 16;
    const MPI_Aint ws = 256 << 10, big = 64 << 10;
    int me, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (n < 2) {
        if (me == 0) fprintf(stderr, "mpi_put: needs 2 ranks\n");
        MPI_Finalize();
        return 1;
    }
    char *base, *src = malloc(big);
    MPI_Win win;
    MPI_Win_allocate(ws, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
    memset(src, 0x5A, big);
    MPI_Win_lock_all(0, win);
    MPI_Barrier(MPI_COMM_WORLD);
    if (me == 0) {
        for (int i = 0; i < 200; i++) {
            MPI_Put(src, 8, MPI_BYTE, 1, (i * 4096) % ws, 8, MPI_BYTE, win);
            MPI_Win_flush(1, win);
        }
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++) {
            MPI_Put(src, 8, MPI_BYTE, 1, (MPI_Aint)(next() % (ws / 8)) * 8, 8, MPI_BYTE, win);
            MPI_Win_flush(1, win);
        }
        double lat = (MPI_Wtime() - t0) * 1e6 / iters;
        t0 = MPI_Wtime();
        for (int i = 0; i < msgs; i++) {
            MPI_Put(src, big, MPI_BYTE, 1, (MPI_Aint)(next() % (ws / big)) * big, big, MPI_BYTE, win);
            if ((i + 1) % window == 0) MPI_Win_flush(1, win);
        }
        MPI_Win_flush(1, win);
        double secs = MPI_Wtime() - t0;
        for (int i = 0; i < 200; i++) {
            MPI_Get(src, 8, MPI_BYTE, 1, (i * 4096) % ws, 8, MPI_BYTE, win);
            MPI_Win_flush(1, win);
        }
        t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++) {
            MPI_Get(src, 8, MPI_BYTE, 1, (MPI_Aint)(next() % (ws / 8)) * 8, 8, MPI_BYTE, win);
            MPI_Win_flush(1, win);
        }
        double get_lat = (MPI_Wtime() - t0) * 1e6 / iters;
        t0 = MPI_Wtime();
        for (int i = 0; i < msgs; i++) {
            MPI_Get(src, big, MPI_BYTE, 1, (MPI_Aint)(next() % (ws / big)) * big, big, MPI_BYTE, win);
            if ((i + 1) % window == 0) MPI_Win_flush(1, win);
        }
        MPI_Win_flush(1, win);
        double get_secs = MPI_Wtime() - t0;
        printf("{\"tool\":\"mpi_put\",\"lat_8b_us\":%.3f,\"bw_64k_mb_s\":%.3f,"
               "\"get_lat_8b_us\":%.3f,\"get_bw_64k_mb_s\":%.3f,\"iters\":%d,\"msgs\":%d,\"window\":%d}\n",
               lat, (double)msgs * big / secs / 1e6, get_lat, (double)msgs * big / get_secs / 1e6, iters,
               msgs, window);
        fflush(stdout);
    }
    MPI_Win_unlock_all(win);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Win_free(&win);
    free(src);
    MPI_Finalize();
    return 0;
}
