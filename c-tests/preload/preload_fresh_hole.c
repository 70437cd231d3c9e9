/* A raw munmap on one thread, new memory mapped into its hole by another, under
 * libfirehose_preload.so: the second thread's registration must be of its own pages.
 *
 * Thread X maps a buffer, registers and deregisters it (the shim keeps the registration cached),
 * then unmaps it with a raw munmap system call, which no libc hook sees: only userfaultfd tells
 * the cache, and the kernel frees the addresses before it queues that event. The main thread
 * waits until the addresses are free, maps new memory exactly there (MAP_FIXED_NOREPLACE),
 * writes a new pattern, registers it and reads it back by RDMA through the new rkey. Run with
 * FH_TEST_UFFD_DELAY_US (the reader sleeps before each read) so that all of this happens while
 * X's event is still unread ("in the window": X is still inside its munmap).
 *
 * The shim's mmap reports the new range when it returns, so the registration misses and the READ
 * sees the new pattern. With that report off (FH_TEST_DISABLE_HOOKS=fresh) the registration is a
 * hit on X's registration of the gone pages and the READ sees X's old data: the test fails.
 *
 * Prints "preload_fresh_hole: R rounds, W in the window, S stale". Exit 0: no stale READ (and,
 * with PFH_EXPECT_WINDOW=1, at least one round in the window); 1: a stale READ or a failed call;
 * 3: no round landed in the window although PFH_EXPECT_WINDOW=1; 77: no device. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../common/verbs_loopback.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

#define LEN (64 * 1024)
#define RW (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static struct vl_loop lp;
static char *volatile shared_p;
static atomic_int registered, returned;

static void *unmapper(void *arg)
{
    (void)arg;
    char *p = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        atomic_store(&registered, -1);
        return NULL;
    }
    memset(p, 0xa1, LEN);
    struct ibv_mr *m = ibv_reg_mr(lp.pd, p, LEN, RW);
    if (!m || ibv_dereg_mr(m)) {
        atomic_store(&registered, -1);
        return NULL;
    }
    shared_p = p;
    atomic_store(&registered, 1);
    syscall(SYS_munmap, p, LEN); /* held in the kernel until the reader reads its event */
    atomic_store(&returned, 1);
    return NULL;
}

static int mapped(const char *p)
{
    return msync((void *)p, LEN, MS_ASYNC) == 0;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* One round: 0 fine (in the window or not: *in_window says), 1 stale, 2 a call failed,
 * 4 the hole was taken (not counted). */
static int round_(char *scratch, struct ibv_mr *scratch_mr, int *in_window)
{
    atomic_store(&registered, 0);
    atomic_store(&returned, 0);
    pthread_t t;
    if (pthread_create(&t, NULL, unmapper, NULL))
        return 2;
    double t0 = now();
    while (atomic_load(&registered) == 0 && now() - t0 < 30)
        usleep(100);
    if (atomic_load(&registered) != 1) {
        pthread_join(t, NULL);
        return 2;
    }
    char *p = shared_p;
    while (mapped(p) && now() - t0 < 30)
        ;
    char *q = mmap(p, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
                   -1, 0);
    if (q != p) {
        if (q != MAP_FAILED)
            munmap(q, LEN);
        pthread_join(t, NULL);
        return 4;
    }
    memset(q, 0x5c, LEN);
    struct ibv_mr *m = ibv_reg_mr(lp.pd, q, LEN, RW);
    if (!m) {
        pthread_join(t, NULL);
        munmap(q, LEN);
        return 2;
    }
    memset(scratch, 0, LEN);
    int st = vl_rdma(&lp, IBV_WR_RDMA_READ, scratch, scratch_mr->lkey, (uintptr_t)q, m->rkey, LEN);
    *in_window = !atomic_load(&returned);
    int bad = st != 0;
    for (size_t i = 0; !bad && i < LEN; i++)
        bad = (unsigned char)scratch[i] != 0x5c;
    if (bad)
        fprintf(stderr, "STALE: READ of the new mapping at %p through rkey %#x: status %d, "
                "byte 0 is %#x (new 0x5c, old 0xa1)%s\n", (void *)q, m->rkey, st,
                (unsigned char)scratch[0], *in_window ? ", in the window" : "");
    ibv_dereg_mr(m);
    pthread_join(t, NULL);
    munmap(q, LEN);
    return bad ? 1 : 0;
}

int main(void)
{
    const char *r = getenv("PFH_ROUNDS");
    int rounds = r && atoi(r) > 0 ? atoi(r) : 5;
    int expect_window = getenv("PFH_EXPECT_WINDOW") && atoi(getenv("PFH_EXPECT_WINDOW")) == 1;
    int rc = vl_open_main(&lp);
    if (rc)
        return rc;
    char *scratch = aligned_alloc(4096, LEN);
    struct ibv_mr *scratch_mr = scratch ? ibv_reg_mr(lp.pd, scratch, LEN, RW) : NULL;
    if (!scratch_mr) {
        fprintf(stderr, "scratch registration failed\n");
        return 1;
    }
    int done = 0, window = 0, stale = 0, failed = 0;
    for (int i = 0; i < rounds; i++) {
        int w = 0;
        switch (round_(scratch, scratch_mr, &w)) {
        case 0:
            done++;
            window += w;
            break;
        case 1:
            done++;
            window += w;
            stale++;
            break;
        case 2:
            failed++;
            break;
        default:
            break;
        }
        if (failed)
            break;
    }
    ibv_dereg_mr(scratch_mr);
    vl_close(&lp);
    printf("preload_fresh_hole: %d rounds, %d in the window, %d stale, %d failed\n", done, window,
           stale, failed);
    if (stale || failed)
        return 1;
    return expect_window && window == 0 ? 3 : 0;
}
