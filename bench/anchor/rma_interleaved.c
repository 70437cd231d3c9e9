/* fh_put / fh_get and one anchor's one-sided calls in the same process, in alternating blocks:
 * the closest side by side there is. Separate programs run tens of seconds apart, and under TCG
 * a boot has slow stretches of that length (one program's 8 B put at twice another's in the same
 * boot, the next run back to normal); here each block of Firehose ops sits next to a block of
 * the anchor's, in the order F A A F F A ... (so neither side always goes first), and a
 * measure's ratio is the median over blocks of the ratio within each block pair.
 *
 * Built twice by scripts/bench-rma-compare:
 *   mpicc            the anchor is MPI one-sided (MPI_Win_allocate, MPI_Win_lock_all; MPI_Put /
 *                    MPI_Get + MPI_Win_flush; `--mca osc ucx` is the launcher's choice), as
 *                    mpi_put.c
 *   oshcc -DWITH_SHMEM  the anchor is OpenSHMEM (shmem_putmem + shmem_quiet, shmem_getmem,
 *                    *_nbi + shmem_quiet per window), as shmem_put.c
 * Firehose: fh_init with the library's defaults (whatever FH_* the launcher passes), the target
 * a 256 KiB buffer of rank 1's own (not the anchor's memory), every page of it warmed first so
 * the timed ops are hits. Per measure and side:
 *   8 B put + completion   fh_put                  | MPI_Put + MPI_Win_flush | putmem + quiet
 *   8 B get                fh_get                  | MPI_Get + MPI_Win_flush | getmem
 *   64 KiB put bandwidth   fh_put_nb, fh_quiet per window of WINDOW | MPI_Put, flush per window
 *                          | putmem_nbi, quiet per window
 *   64 KiB get bandwidth   the same with gets
 * at random 8-byte (latency) or 64 KiB (bandwidth) offsets of the 256 KiB, the same pattern for
 * both sides. Rank 1 waits in the anchor's barrier meanwhile (its progress thread, the library's
 * default, is there for the warm-up's misses).
 *
 * Usage: mpirun -np 2 rma_interleaved [BLOCKS [OPS [BW_MSGS [WINDOW]]]] [--align A] [--json]
 *        mpirun -np 2 rma_interleaved --count N   (rank 0 under valgrind --tool=callgrind
 *        --collect-atstart=no: scripts/profile-verbs)
 *   BLOCKS (default 10) block pairs per measure; OPS (200) 8 B ops per block; BW_MSGS (64)
 *   64 KiB messages per bandwidth block; WINDOW (16); A (4096): rank 1's target starts A bytes
 *   past a 2 MiB boundary (a page: where an mmap'd buffer may start).
 * Rank 0 prints a perftest-style table, or with --json one JSON line. Exit 0, or 1 when a call
 * failed (its status printed). Below the table: Firehose's RDMA work requests per 64 KiB op
 * (fh_rma_stats.rdma_posted over the bandwidth blocks): an op that crosses a region boundary of
 * the target (FH_MAXREGION, 128 KiB aligned by default) takes one per region, where the anchor's
 * window is one registration and takes one.
 * --count N: instead of timing, after the same warm-up, N 8 B ops of each kind in turn (fh_get,
 * the anchor's get, fh_put, the anchor's put), each run between callgrind's client requests that
 * start and stop collecting and dump the counts under the run's name (`fh_get`, `shmem_get`, ...):
 * user-space instructions per op of the calling thread, counted, not timed (the client requests
 * do nothing outside valgrind). Twice over; the second pass is the one to read. */
#define _GNU_SOURCE
#include <firehose.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__has_include)
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define HAVE_CALLGRIND 1
#endif
#endif
#ifdef WITH_SHMEM
#include <shmem.h>
#define ANCHOR "shmem"
#else
#include <mpi.h>
#define ANCHOR "mpi"
#endif

#define WS ((size_t)256 << 10)
#define BIG ((size_t)64 << 10)
#define MAX_BLOCKS 1000

static int me, np;
static fh_ctx *ctx;
static uint64_t target;    /* rank 1's Firehose buffer (its address) */
static unsigned char *src; /* BIG bytes: every put's source, every get's destination */
#ifdef WITH_SHMEM
static unsigned char *sym; /* the symmetric WS bytes */
#else
static MPI_Win win;
#endif

static void die(const char *what, int st)
{
    fprintf(stderr, "rma_interleaved rank %d: %s: %s (%d)\n", me, what, fh_status_str(st), st);
    exit(1);
}

static void ok(int st, const char *what)
{
    if (st != FH_OK)
        die(what, st);
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* One xorshift stream per side, seeded alike: both sides see the same offsets. */
static uint64_t next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

static void barrier(void)
{
#ifdef WITH_SHMEM
    shmem_barrier_all();
#else
    MPI_Barrier(MPI_COMM_WORLD);
#endif
}

/* ---- the anchor's side */
static void a_put8(size_t off)
{
#ifdef WITH_SHMEM
    shmem_putmem(sym + off, src, 8, 1);
    shmem_quiet();
#else
    MPI_Put(src, 8, MPI_BYTE, 1, (MPI_Aint)off, 8, MPI_BYTE, win);
    MPI_Win_flush(1, win);
#endif
}

static void a_get8(size_t off)
{
#ifdef WITH_SHMEM
    shmem_getmem(src, sym + off, 8, 1);
#else
    MPI_Get(src, 8, MPI_BYTE, 1, (MPI_Aint)off, 8, MPI_BYTE, win);
    MPI_Win_flush(1, win);
#endif
}

static void a_big(int get, size_t off)
{
#ifdef WITH_SHMEM
    if (get)
        shmem_getmem_nbi(src, sym + off, BIG, 1);
    else
        shmem_putmem_nbi(sym + off, src, BIG, 1);
#else
    if (get)
        MPI_Get(src, BIG, MPI_BYTE, 1, (MPI_Aint)off, BIG, MPI_BYTE, win);
    else
        MPI_Put(src, BIG, MPI_BYTE, 1, (MPI_Aint)off, BIG, MPI_BYTE, win);
#endif
}

static void a_flush(void)
{
#ifdef WITH_SHMEM
    shmem_quiet();
#else
    MPI_Win_flush(1, win);
#endif
}

/* ---- Firehose's side */
static void f_put8(size_t off)
{
    ok(fh_put(ctx, 1, target + off, src, 8), "fh_put");
}

static void f_get8(size_t off)
{
    ok(fh_get(ctx, src, 1, target + off, 8), "fh_get");
}

static void f_big(int get, size_t off)
{
    if (get)
        ok(fh_get_nb(ctx, src, 1, target + off, BIG, NULL), "fh_get_nb");
    else
        ok(fh_put_nb(ctx, 1, target + off, src, BIG, NULL), "fh_put_nb");
}

static void f_flush(void)
{
    ok(fh_quiet(ctx), "fh_quiet");
}

/* ---- a block (measure 0 put / 1 get latency, 2 put / 3 get bandwidth): `ops` 8 B ops, or
 * `ops` 64 KiB ops flushed every `window`; its seconds */
struct side {
    void (*op8)(size_t off); /* the put or the get: set per measure */
    void (*big)(int get, size_t off);
    void (*flush)(void);
    uint64_t rng;
};

static double block(struct side *s, int measure, int ops, int window)
{
    double t0 = now();
    if (measure < 2) {
        for (int i = 0; i < ops; i++)
            s->op8((size_t)(next(&s->rng) % (WS / 8)) * 8);
    } else {
        for (int i = 0; i < ops; i++) {
            s->big(measure == 3, (size_t)(next(&s->rng) % (WS / BIG)) * BIG);
            if ((i + 1) % window == 0)
                s->flush();
        }
        s->flush();
    }
    return now() - t0;
}

/* Firehose's RDMA work requests posted so far (its stats). */
static uint64_t fh_posted(void)
{
    struct fh_rma_stats st;
    ok(fh_get_rma_stats(ctx, &st), "fh_get_rma_stats");
    return st.rdma_posted;
}

/* A Firehose block, with the work requests it posted added to *posted. */
static double f_block(struct side *f, int measure, int ops, int window, uint64_t *posted)
{
    uint64_t p0 = fh_posted();
    double t = block(f, measure, ops, window);
    *posted += fh_posted() - p0;
    return t;
}

/* --count: N ops of each 8 B kind, each run dumped by callgrind under its own name. */
static int count_runs(int n)
{
#ifdef HAVE_CALLGRIND
    static const char *names[4] = {"fh_get", ANCHOR "_get", "fh_put", ANCHOR "_put"};
    void (*const ops[4])(size_t) = {f_get8, a_get8, f_put8, a_put8};
    for (int pass = 1; pass <= 2; pass++)
        for (int k = 0; k < 4; k++) {
            uint64_t rng = 0x5EED1234ABCDULL;
            char dump[64];
            snprintf(dump, sizeof dump, "%s pass %d", names[k], pass);
            CALLGRIND_ZERO_STATS;
            CALLGRIND_TOGGLE_COLLECT;
            for (int i = 0; i < n; i++)
                ops[k]((size_t)(next(&rng) % (WS / 8)) * 8);
            CALLGRIND_TOGGLE_COLLECT;
            CALLGRIND_DUMP_STATS_AT(dump);
        }
    printf("# rma_interleaved --count %d: %s (callgrind dumps, %s)\n", n, ANCHOR,
           RUNNING_ON_VALGRIND ? "under valgrind" : "not under valgrind: nothing counted");
    return 0;
#else
    (void)n;
    fprintf(stderr, "rma_interleaved: --count needs valgrind/callgrind.h at build time\n");
    return 1;
#endif
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv)
{
    int json = 0, nums[4] = {10, 200, 64, 16}, k = 0, count = 0;
    size_t align = 4096;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = 1;
        else if (strcmp(argv[i], "--count") == 0 && i + 1 < argc)
            count = atoi(argv[++i]);
        else if (strcmp(argv[i], "--align") == 0 && i + 1 < argc)
            align = (size_t)strtoull(argv[++i], NULL, 0);
        else if (k < 4)
            nums[k++] = atoi(argv[i]);
    }
    int blocks = nums[0], ops = nums[1], bw_msgs = nums[2], window = nums[3];
#ifdef WITH_SHMEM
    shmem_init();
    me = shmem_my_pe();
    np = shmem_n_pes();
#else
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
#endif
    if (np < 2 || blocks < 1 || blocks > MAX_BLOCKS || ops < 1 || bw_msgs < 1 || window < 1) {
        if (me == 0)
            fprintf(stderr, "rma_interleaved: 2 ranks, 1 <= BLOCKS <= %d, OPS, BW_MSGS, WINDOW > 0\n",
                    MAX_BLOCKS);
        return 1;
    }
    ok(fh_init(NULL, &ctx), "fh_init");
    /* Rank 1's target: `align` bytes past a 2 MiB boundary (a page by default: where an mmap'd
     * buffer may start). */
    if (align % 8 || align >= ((size_t)2 << 20)) {
        if (me == 0)
            fprintf(stderr, "rma_interleaved: --align wants a multiple of 8 below 2 MiB\n");
        return 1;
    }
    unsigned char *arena = aligned_alloc((size_t)2 << 20, ((size_t)2 << 20) + WS);
    unsigned char *mine = arena ? arena + align : NULL;
    src = aligned_alloc(4096, BIG);
    if (!mine || !src) {
        fprintf(stderr, "rma_interleaved: out of memory\n");
        return 1;
    }
    memset(mine, 0, WS);
    memset(src, 0x5A, BIG);
#ifdef WITH_SHMEM
    sym = shmem_malloc(WS);
    /* The exchange word on the symmetric heap, not a static: a static's address differs
     * between PEs whose binaries are not laid out alike (rank 0 under valgrind, for --count). */
    uint64_t *exchanged = shmem_malloc(sizeof *exchanged);
    if (!sym || !exchanged) {
        fprintf(stderr, "rma_interleaved: shmem_malloc failed\n");
        return 1;
    }
    if (me == 1)
        *exchanged = (uint64_t)(uintptr_t)mine;
    shmem_barrier_all();
    if (me == 0)
        shmem_getmem(&target, exchanged, sizeof target, 1);
    shmem_barrier_all();
#else
    unsigned char *base;
    MPI_Win_allocate((MPI_Aint)WS, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
    MPI_Win_lock_all(0, win);
    uint64_t addr = (uint64_t)(uintptr_t)mine;
    MPI_Bcast(&addr, 1, MPI_UINT64_T, 1, MPI_COMM_WORLD);
    target = addr;
#endif
    barrier();
    if (me == 0) {
        struct side f = {f_put8, f_big, f_flush, 0x5EED1234ABCDULL};
        struct side a = {a_put8, a_big, a_flush, 0x5EED1234ABCDULL};
        /* Warm-up: every page of both targets written and read (Firehose's misses pin them
         * here), and a window of each big op. */
        for (size_t off = 0; off < WS; off += 4096) {
            f_put8(off);
            f_get8(off);
            a_put8(off);
            a_get8(off);
        }
        for (int g = 0; g < 2; g++) {
            for (size_t off = 0; off < WS; off += BIG) {
                f_big(g, off);
                a_big(g, off);
            }
            f_flush();
            a_flush();
        }
        if (count > 0) {
            if (count_runs(count) != 0)
                exit(1);
            goto done;
        }
        static const char *names[4] = {"put_lat", "get_lat", "put_bw", "get_bw"};
        static const char *what[4] = {"8 B put + completion", "8 B get", "64 KiB put bandwidth",
                                      "64 KiB get bandwidth"};
        double fv[4], av[4], ratio[4], wr[4]; /* wr: fh's RDMA work requests per op */
        int ahead[4];
        for (int m = 0; m < 4; m++) {
            static double tf[MAX_BLOCKS], ta[MAX_BLOCKS], r[MAX_BLOCKS];
            int n_ops = m < 2 ? ops : bw_msgs;
            f.op8 = m == 1 ? f_get8 : f_put8;
            a.op8 = m == 1 ? a_get8 : a_put8;
            double sf = 0, sa = 0;
            uint64_t posted = 0;
            ahead[m] = 0;
            for (int b = 0; b < blocks; b++) {
                /* F A, A F, F A, ...: neither side always first. */
                if (b % 2 == 0) {
                    tf[b] = f_block(&f, m, n_ops, window, &posted);
                    ta[b] = block(&a, m, n_ops, window);
                } else {
                    ta[b] = block(&a, m, n_ops, window);
                    tf[b] = f_block(&f, m, n_ops, window, &posted);
                }
                sf += tf[b];
                sa += ta[b];
                /* Latency: fh / anchor (lower is better); bandwidth: fh's rate / the anchor's. */
                r[b] = m < 2 ? tf[b] / ta[b] : ta[b] / tf[b];
                ahead[m] += tf[b] < ta[b]; /* the same bytes in less time */
            }
            double total = (double)blocks * n_ops;
            fv[m] = m < 2 ? sf * 1e6 / total : total * BIG / sf / 1e6;
            av[m] = m < 2 ? sa * 1e6 / total : total * BIG / sa / 1e6;
            ratio[m] = median(r, blocks);
            wr[m] = (double)posted / total;
        }
        if (json) {
            printf("{\"tool\":\"rma_interleaved\",\"anchor\":\"%s\",\"blocks\":%d,\"ops\":%d,"
                   "\"bw_msgs\":%d,\"window\":%d",
                   ANCHOR, blocks, ops, bw_msgs, window);
            for (int m = 0; m < 4; m++)
                printf(",\"%s_fh\":%.3f,\"%s_anchor\":%.3f,\"%s_ratio\":%.4f,\"%s_fh_ahead\":%d"
                       ",\"%s_fh_wr_per_op\":%.3f",
                       names[m], fv[m], names[m], av[m], names[m], ratio[m], names[m], ahead[m],
                       names[m], wr[m]);
            printf("}\n");
        } else {
            printf("# rma_interleaved: Firehose beside %s in one process, %d block pairs per "
                   "measure (F A A F ...)\n",
                   ANCHOR, blocks);
            printf("%-8s %-12s %-22s %-14s %-14s %-22s %s\n", "#bytes", "#iterations", "measure",
                   "fh", ANCHOR, "fh/" ANCHOR " (median)", "blocks fh ahead");
            for (int m = 0; m < 4; m++)
                printf("%-8zu %-12d %-22s %-14.2f %-14.2f %-22.4f %d of %d\n", m < 2 ? (size_t)8 : BIG,
                       blocks * (m < 2 ? ops : bw_msgs), what[m], fv[m], av[m], ratio[m], ahead[m],
                       blocks);
            printf("# latency in usec (mean per op), bandwidth in MB/sec (10^6 bytes); a ratio "
                   "above 1 is fh ahead for bandwidth, below 1 for latency\n");
            printf("# fh RDMA work requests per 64 KiB op: put %.2f, get %.2f (one per target "
                   "region the op covers)\n",
                   wr[2], wr[3]);
        }
    done:
        fflush(stdout);
    }
    barrier();
    ok(fh_finalize(ctx), "fh_finalize");
#ifdef WITH_SHMEM
    shmem_free(exchanged);
    shmem_free(sym);
    shmem_finalize();
#else
    MPI_Win_unlock_all(win);
    MPI_Win_free(&win);
    MPI_Finalize();
#endif
    free(arena);
    free(src);
    return 0;
}
