/* fh_put / fh_get next to MPI, with the default settings (FH_PROGRESS_THREAD unset = auto), under
 * mpirun with 4+ ranks. The two programs users write first:
 *
 *   ring     each rank puts to its right neighbour, then enters MPI_Barrier at once; the
 *            neighbour is already inside MPI (no library call of ours), so only a progress
 *            thread can answer the put's move. After the barrier every rank checks what its left
 *            neighbour put. Sizes 8 B .. 256 KiB, each put to a new region (a miss: a move).
 *   compute  rank 0 computes for 2 s (no call into MPI or firehose) while every other rank puts
 *            to it and gets back from it; each must be done long before rank 0 returns (< 1.5 s),
 *            and after the next barrier rank 0 checks every byte.
 *   own      every rank puts 8 B 400 times to its right neighbour (hits, blocking): the
 *            completions are the waiting caller's to reap; its own progress thread must not be
 *            woken for them: it wakes (fh_net_stats.progress_wakeups) and handles
 *            (progress_thread_events) fewer than 1 in 20 (0-3 seen; 17-69 on some rank
 *            with the thread sleeping for every completion, as before).
 *   stream   every rank streams 64 KiB puts to its right neighbour, 16 in flight (fh_put_nb,
 *            fh_wait on the oldest): on Soft-RoCE the caller is inside the post's system call
 *            most of the time, not in a wait, and its completions are still its own to reap:
 *            the progress thread handles fewer than 1 in 10 of them.
 *
 * Exit 0: all passed; 1: a check failed or a call returned an error (with FH_PROGRESS_THREAD=0
 * the ring's put ends with FH_ERR_TIMEOUT after FH_AM_TIMEOUT_MS: the must-fail run).
 *
 *   rma_attentive [test]          the tests above
 *   rma_attentive bench [--json]  rank 0 times puts to rank 1 while rank 1 sits in MPI_Barrier
 *                                 (or, with FH_PROGRESS_THREAD=0, polls fh_progress: the idle
 *                                 baseline): 8 B hits, and 8 B misses (a move each); then every
 *                                 rank sleeps 10 s and reports the CPU time its progress thread
 *                                 used meanwhile.
 *
 * Built with mpicc by tests/verbs-suite.d/66-rma-attentive.sh (not by CMake: it needs MPI). */
#define _GNU_SOURCE
#include <dirent.h>
#include <firehose.h>
#include "mpi_check.h"
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MAX_RANKS 64
#define RING_ITERS 16
#define SLOT ((size_t)256 << 10)       /* one put's target slot, >= the largest put */
#define REGION ((size_t)128 << 10)     /* FH_MAXREGION's default: a new slot is a new region */
#define HOT_SPAN ((size_t)4 << 20)     /* rank 0's target area in `compute` */

static int n;
static fh_ctx *ctx;


static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static unsigned char pat(int rank, int it, size_t i)
{
    return (unsigned char)(rank * 29 + it * 7 + i * 13 + (i >> 12) + 1);
}

static void *big(size_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return p;
}

/* Every rank's address of a local buffer. */
static void exchange(void *mine, uint64_t *all)
{
    uint64_t a = (uint64_t)(uintptr_t)mine;
    MPI_Allgather(&a, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, MPI_COMM_WORLD);
}

static int call(fh_status s, const char *what, double t0)
{
    if (s == FH_OK)
        return 0;
    FAIL("%s: %s after %.2f s", what, fh_status_str(s), now() - t0);
    return 1;
}

static void ring(void)
{
    static const size_t sizes[] = {8, 4096, 65536, 256 << 10};
    const size_t span = RING_ITERS * (SLOT + REGION);
    unsigned char *in = big(span), *src = big(SLOT);
    uint64_t at[MAX_RANKS];
    exchange(in, at);
    int right = (me + 1) % n, left = (me + n - 1) % n;
    double worst = 0;
    for (int it = 0; it < RING_ITERS; it++) {
        size_t len = sizes[it % 4], off = (size_t)it * (SLOT + REGION);
        for (size_t i = 0; i < len; i++)
            src[i] = pat(me, it, i);
        double t0 = now();
        if (call(fh_put(ctx, (uint32_t)right, at[right] + off, src, len), "ring put", t0))
            MPI_Abort(MPI_COMM_WORLD, 1); /* the others wait in MPI_Barrier: end the job */
        if (now() - t0 > worst)
            worst = now() - t0;
        MPI_Barrier(MPI_COMM_WORLD); /* right away: the neighbour is in here too */
        for (size_t i = 0; i < len; i++)
            if (in[off + i] != pat(left, it, i)) {
                FAIL("ring %d: byte %zu from rank %d is %#x, want %#x", it, i, left, in[off + i],
                     pat(left, it, i));
                break;
            }
    }
    printf("rank %d: ring of %d puts then MPI_Barrier: %s, slowest put %.1f ms\n", me, RING_ITERS,
           failures ? "FAILED" : "ok", worst * 1e3);
    munmap(in, span);
    munmap(src, SLOT);
}

static void compute(void)
{
    unsigned char *hot = big(HOT_SPAN), *src = big(REGION), *back = big(REGION);
    uint64_t at[MAX_RANKS];
    exchange(hot, at);
    const size_t len = 32 << 10, per = HOT_SPAN / (size_t)n;
    const int ops = (int)(per / REGION);
    MPI_Barrier(MPI_COMM_WORLD);
    if (me == 0) {
        double t0 = now();
        volatile unsigned long x = 0;
        while (now() - t0 < 2.0)
            x++; /* no call into MPI or firehose */
    } else {
        double t0 = now();
        for (int k = 0; k < ops && !failures; k++) {
            uint64_t dst = at[0] + (size_t)me * per + (size_t)k * REGION;
            for (size_t i = 0; i < len; i++)
                src[i] = pat(me, k, i);
            if (call(fh_put(ctx, 0, dst, src, len), "put to the computing rank", t0) ||
                call(fh_get(ctx, back, 0, dst, len), "get from the computing rank", t0))
                break;
            if (memcmp(back, src, len) != 0)
                FAIL("get %d from the computing rank returned other bytes", k);
        }
        double dt = now() - t0;
        printf("rank %d: %d puts + gets to rank 0 while it computed for 2 s: %.2f s\n", me, ops,
               dt);
        if (!failures && dt > 1.5)
            FAIL("%d puts + gets to a computing rank took %.2f s: answered only when it came back",
                 ops, dt);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (me == 0)
        for (int r = 1; r < n; r++)
            for (int k = 0; k < ops; k++) {
                const unsigned char *p = hot + (size_t)r * per + (size_t)k * REGION;
                for (size_t i = 0; i < len; i++)
                    if (p[i] != pat(r, k, i)) {
                        FAIL("compute: rank %d's put %d, byte %zu: %#x", r, k, i, p[i]);
                        k = ops;
                        break;
                    }
            }
    munmap(hot, HOT_SPAN);
    munmap(src, REGION);
    munmap(back, REGION);
}

static void own_completions(void)
{
    enum { PUTS = 400 };
    uint64_t *slot = big(4096), at[MAX_RANKS], v = 7;
    exchange(slot, at);
    uint32_t right = (uint32_t)((me + 1) % n);
    if (call(fh_put(ctx, right, at[right], &v, 8), "warm-up put", now()))
        MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Barrier(MPI_COMM_WORLD);
    fh_net_stats s0, s1;
    if (fh_get_net_stats(ctx, &s0) != FH_OK)
        FAIL("fh_get_net_stats");
    double t0 = now();
    for (int i = 0; i < PUTS; i++) {
        v = (uint64_t)i;
        if (call(fh_put(ctx, right, at[right], &v, 8), "own put", t0))
            MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (fh_get_net_stats(ctx, &s1) != FH_OK)
        FAIL("fh_get_net_stats");
    uint64_t by_thread = s1.progress_thread_events - s0.progress_thread_events;
    uint64_t woke = s1.progress_wakeups - s0.progress_wakeups;
    printf("rank %d: %d blocking puts in %.1f us each; meanwhile the progress thread woke %llu "
           "times and handled %llu events\n",
           me, PUTS, (now() - t0) * 1e6 / PUTS, (unsigned long long)woke,
           (unsigned long long)by_thread);
    /* A thread woken for the waiter's completions wakes for most of them (it then usually finds
     * them reaped already); one that polls beside the waiter takes a share of them. */
    if (woke * 20 >= PUTS)
        FAIL("the progress thread woke %llu times during %d puts a waiting caller completes",
             (unsigned long long)woke, PUTS);
    if (by_thread * 20 >= PUTS)
        FAIL("the progress thread handled %llu of %d completions a waiting caller reaps itself",
             (unsigned long long)by_thread, PUTS);
    MPI_Barrier(MPI_COMM_WORLD);
    if (*slot != PUTS - 1)
        FAIL("own: the last put left %llu, want %d", (unsigned long long)*slot, PUTS - 1);
    munmap(slot, 4096);
}

static void stream_completions(void)
{
    enum { PUTS = 512, WINDOW = 16, SLOTS = 4 };
    const size_t len = (size_t)64 << 10;
    unsigned char *dst = big(SLOTS * len), *src = big(len);
    uint64_t at[MAX_RANKS];
    exchange(dst, at);
    uint32_t right = (uint32_t)((me + 1) % n);
    for (size_t i = 0; i < len; i++)
        src[i] = pat(me, 3, i);
    double t0 = now();
    for (int k = 0; k < SLOTS; k++) /* every slot a hit from here on */
        if (call(fh_put(ctx, right, at[right] + (uint64_t)k * len, src, len), "warm-up put", t0))
            MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Barrier(MPI_COMM_WORLD);
    fh_net_stats s0, s1;
    if (fh_get_net_stats(ctx, &s0) != FH_OK)
        FAIL("fh_get_net_stats");
    fh_op ops[WINDOW];
    t0 = now();
    for (int i = 0; i < PUTS; i++) {
        if (i >= WINDOW && call(fh_wait(ctx, ops[i % WINDOW]), "stream wait", t0))
            MPI_Abort(MPI_COMM_WORLD, 1);
        uint64_t to = at[right] + (uint64_t)(i % SLOTS) * len;
        if (call(fh_put_nb(ctx, right, to, src, len, &ops[i % WINDOW]), "stream put", t0))
            MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int i = PUTS; i < PUTS + WINDOW; i++)
        if (call(fh_wait(ctx, ops[i % WINDOW]), "stream wait", t0))
            MPI_Abort(MPI_COMM_WORLD, 1);
    double dt = now() - t0;
    if (fh_get_net_stats(ctx, &s1) != FH_OK)
        FAIL("fh_get_net_stats");
    uint64_t by_thread = s1.progress_thread_events - s0.progress_thread_events;
    printf("rank %d: %d 64 KiB puts, %d in flight, %.1f MB/s; meanwhile the progress thread woke "
           "%llu times and handled %llu events\n",
           me, PUTS, WINDOW, PUTS * (double)len / dt / 1e6,
           (unsigned long long)(s1.progress_wakeups - s0.progress_wakeups),
           (unsigned long long)by_thread);
    /* A thread that takes a caller busy posting for an idle one sleeps for the send completions
     * too and takes about one per wake-up: 90-118 of 256 on 3 of 4 ranks, against 0-12 since. */
    if (by_thread * 10 >= PUTS)
        FAIL("the progress thread handled %llu of %d completions a streaming caller reaps itself",
             (unsigned long long)by_thread, PUTS);
    MPI_Barrier(MPI_COMM_WORLD);
    for (int k = 0; k < SLOTS; k++)
        for (size_t i = 0; i < len; i += 4093)
            if (dst[(size_t)k * len + i] != pat((me + n - 1) % n, 3, i)) {
                FAIL("stream: slot %d byte %zu is %u, want %u", k, i, dst[(size_t)k * len + i],
                     pat((me + n - 1) % n, 3, i));
                break;
            }
    munmap(dst, SLOTS * len);
    munmap(src, len);
}

/* ---- bench ---------------------------------------------------------------------------------- */

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* CPU seconds the fh-progress thread of this process has used (0 if there is none). */
static double progress_cpu(void)
{
    DIR *d = opendir("/proc/self/task");
    double s = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char path[300], comm[64] = "", stat[1024];
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        if (!fgets(comm, sizeof comm, f))
            comm[0] = 0;
        fclose(f);
        if (strncmp(comm, "fh-progress", 11) != 0)
            continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/stat", e->d_name);
        f = fopen(path, "r");
        if (f && fgets(stat, sizeof stat, f)) {
            /* fields 14, 15: utime, stime in clock ticks, after the ")" of the name */
            char *p = strrchr(stat, ')');
            unsigned long ut = 0, st = 0;
            if (p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut,
                            &st) == 2)
                s += (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
        }
        if (f)
            fclose(f);
    }
    if (d)
        closedir(d);
    return s;
}

/* Rank 0 times `iters` 8-byte puts to rank 1 (`fresh`: each to a new region, a move each);
 * rank 1 waits in MPI_Barrier, or with polled progress calls fh_progress until rank 0's flag
 * put arrives. Returns rank 0's median in microseconds. */
static double timed_puts(int iters, int fresh, int polled)
{
    size_t span = fresh ? (size_t)iters * REGION + REGION : 4096;
    unsigned char *area = big(span);
    volatile uint64_t *flag = (volatile uint64_t *)big(4096);
    uint64_t at[MAX_RANKS], fl[MAX_RANKS];
    exchange(area, at);
    exchange((void *)flag, fl);
    MPI_Barrier(MPI_COMM_WORLD);
    double med = 0;
    if (me == 0) {
        double *t = malloc(sizeof(double) * (size_t)iters);
        uint64_t v = 42, one = 1;
        if (!fresh) /* warm: the region pinned at the target before timing */
            call(fh_put(ctx, 1, at[1], &v, 8), "warm-up put", now());
        for (int i = 0; i < iters; i++) {
            uint64_t dst = at[1] + (fresh ? (size_t)i * REGION : 0);
            double t0 = now();
            if (call(fh_put(ctx, 1, dst, &v, 8), "timed put", t0))
                break;
            t[i] = now() - t0;
        }
        call(fh_put(ctx, 1, fl[1], &one, 8), "flag put", now());
        qsort(t, (size_t)iters, sizeof *t, cmp_d);
        med = t[iters / 2] * 1e6;
        free(t);
    } else if (me == 1 && polled) {
        double t0 = now();
        while (*flag == 0 && now() - t0 < 120)
            fh_progress(ctx);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    munmap(area, span);
    munmap((void *)flag, 4096);
    return med;
}

static void bench(int json)
{
    const char *pt = getenv("FH_PROGRESS_THREAD");
    int polled = pt && (strcmp(pt, "0") == 0 || strcmp(pt, "off") == 0 || strcmp(pt, "no") == 0);
    double hit = timed_puts(2000, 0, polled);
    double miss = timed_puts(200, 1, polled);
    MPI_Barrier(MPI_COMM_WORLD);
    double c0 = progress_cpu(), t0 = now();
    sleep(10);
    double cpu = progress_cpu() - c0, secs = now() - t0;
    double cpus[MAX_RANKS];
    MPI_Gather(&cpu, 1, MPI_DOUBLE, cpus, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (me != 0)
        return;
    double worst = 0;
    for (int r = 0; r < n; r++)
        worst = cpus[r] > worst ? cpus[r] : worst;
    const char *mode = polled ? "polled (FH_PROGRESS_THREAD=0, target calls fh_progress)"
                              : "progress thread (target in MPI_Barrier)";
    if (json) {
        printf("{\"ranks\": %d, \"progress\": \"%s\", \"hit_put_8b_us\": %.2f, "
               "\"move_put_8b_us\": %.2f, \"idle_progress_cpu_pct\": %.3f}\n",
               n, polled ? "polled" : "thread", hit, miss, 100.0 * worst / secs);
        return;
    }
    printf("# %s, %d ranks\n", mode, n);
    printf("%-8s %-12s %-14s %s\n", "#bytes", "#iterations", "t_median[us]", "what");
    printf("%-8d %-12d %-14.2f %s\n", 8, 2000, hit, "put, hit (region pinned at the target)");
    printf("%-8d %-12d %-14.2f %s\n", 8, 200, miss, "put, miss (a move answered by the target)");
    printf("idle: the busiest rank's progress thread used %.3f s of CPU in %.1f s (%.3f %% of a "
           "core)\n", worst, secs, 100.0 * worst / secs);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (n > MAX_RANKS || fh_init(NULL, &ctx) != FH_OK) {
        fprintf(stderr, "rank %d: fh_init failed (or more than %d ranks)\n", me, MAX_RANKS);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (argc > 1 && strcmp(argv[1], "bench") == 0) {
        if (n < 2) {
            fprintf(stderr, "bench needs 2 ranks\n");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        bench(argc > 2 && strcmp(argv[2], "--json") == 0);
    } else {
        ring();
        if (!failures)
            compute();
        if (!failures)
            own_completions();
        if (!failures)
            stream_completions();
    }
    int all = 0;
    MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (all == 0 && fh_finalize(ctx) != FH_OK)
        FAIL("fh_finalize");
    MPI_Finalize();
    if (me == 0)
        printf("rma_attentive: %s\n", all ? "FAILED" : "ok");
    return all ? 1 : 0;
}
