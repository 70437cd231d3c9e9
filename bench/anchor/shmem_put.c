/* The anchor of scripts/bench-fh: Open MPI's one-sided path through OpenSHMEM (oshrun, spml ucx)
 * on the same boot as fh_bench. PE 0 puts to PE 1's symmetric heap:
 *   lat: 8-byte shmem_putmem + shmem_quiet, one at a time, random 8-byte slots of --ws bytes
 *        (the same measure as fh_bench's Fig. 3: a put that returns when the data is there);
 *   bw:  64 KiB shmem_putmem_nbi, --window in flight (shmem_quiet every window);
 * and the same two for gets from PE 1's heap (scripts/bench-rma-compare):
 *   get_lat: 8-byte blocking shmem_getmem, random 8-byte slots of the same bytes;
 *   get_bw:  64 KiB shmem_getmem_nbi into one local buffer, --window in flight.
 * One JSON line on PE 0's stdout. Usage: oshrun -np 2 shmem_put [ITERS] [BW_MSGS] [WINDOW]. */
#include <shmem.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static uint64_t rng = 0x5EED1234ABCDULL;
static uint64_t next(void) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1DULL;
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 2000;
    int msgs = argc > 2 ? atoi(argv[2]) : 200;
    int window = argc > 3 ? atoi(argv[3]) : 16;
    const size_t ws = 256 << 10, big = 64 << 10;
    shmem_init();
    int me = shmem_my_pe();
    if (shmem_n_pes() < 2) {
        if (me == 0) fprintf(stderr, "shmem_put: needs 2 PEs\n");
        shmem_finalize();
        return 1;
    }
    char *dst = shmem_malloc(ws);
    char *src = malloc(big);
    if (!dst || !src) {
        fprintf(stderr, "shmem_put: out of memory\n");
        return 1;
    }
    memset(src, 0x5A, big);
    memset(dst, 0, ws);
    shmem_barrier_all();
    if (me == 0) {
        for (int i = 0; i < 200; i++) { /* warm-up: every page once, then random slots */
            shmem_putmem(dst + (i * 4096) % ws, src, 8, 1);
            shmem_quiet();
        }
        double t0 = now_us();
        for (int i = 0; i < iters; i++) {
            shmem_putmem(dst + (next() % (ws / 8)) * 8, src, 8, 1);
            shmem_quiet();
        }
        double lat = (now_us() - t0) / iters;
        for (int i = 0; i < window; i++) shmem_putmem_nbi(dst + (i % 4) * big, src, big, 1);
        shmem_quiet();
        t0 = now_us();
        for (int i = 0; i < msgs; i++) {
            shmem_putmem_nbi(dst + (next() % (ws / big)) * big, src, big, 1);
            if ((i + 1) % window == 0) shmem_quiet();
        }
        shmem_quiet();
        double secs = (now_us() - t0) / 1e6;
        for (int i = 0; i < 200; i++) shmem_getmem(src, dst + (i * 4096) % ws, 8, 1);
        t0 = now_us();
        for (int i = 0; i < iters; i++) shmem_getmem(src, dst + (next() % (ws / 8)) * 8, 8, 1);
        double get_lat = (now_us() - t0) / iters;
        for (int i = 0; i < window; i++) shmem_getmem_nbi(src, dst + (i % 4) * big, big, 1);
        shmem_quiet();
        t0 = now_us();
        for (int i = 0; i < msgs; i++) {
            shmem_getmem_nbi(src, dst + (next() % (ws / big)) * big, big, 1);
            if ((i + 1) % window == 0) shmem_quiet();
        }
        shmem_quiet();
        double get_secs = (now_us() - t0) / 1e6;
        printf("{\"tool\":\"shmem_putmem\",\"lat_8b_us\":%.3f,\"bw_64k_mb_s\":%.3f,"
               "\"get_lat_8b_us\":%.3f,\"get_bw_64k_mb_s\":%.3f,\"iters\":%d,\"msgs\":%d,\"window\":%d}\n",
               lat, (double)msgs * big / secs / 1e6, get_lat, (double)msgs * big / get_secs / 1e6, iters,
               msgs, window);
        fflush(stdout);
    }
    shmem_barrier_all();
    shmem_free(dst);
    free(src);
    shmem_finalize();
    return 0;
}
