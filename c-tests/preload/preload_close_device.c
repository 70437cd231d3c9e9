/* ibv_close_device without ibv_dealloc_pd, under libfirehose_preload.so. libibverbs frees the
 * context at the close; an MR the shim's cache still kept on one of its domains would later be
 * deregistered through the freed context (at the next unmap of its range: a use after free).
 * With the shim:
 *  - after reg + dereg the cache keeps the MR (pinned_bytes > 0, one live cache);
 *  - after ibv_close_device (the pd never deallocated): nothing is kept, no cache is live, every
 *    real registration was deregistered;
 *  - a munmap of the buffer afterwards makes no real ibv_dereg_mr call;
 *  - a new context on the same device registers and caches again, and closes cleanly.
 * With argv[1] == "plain" (no shim) it only runs the same sequence. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "../../ld-preload/include/firehose_preload.h"
#include "../common/fh_check.h"
#include "../common/verbs_loopback.h"

#define LEN (64 << 10)

static int (*stats_fn)(struct fh_preload_stats *, size_t);

static struct fh_preload_stats snap(void)
{
    struct fh_preload_stats s;
    memset(&s, 0, sizeof(s));
    if (stats_fn)
        stats_fn(&s, sizeof(s));
    return s;
}

/* A context and a pd on the suite's device, with the loop's QP and CQ gone (only the pd is left
 * on the context, as in an application that forgets to deallocate it). */
static int open_pd(struct vl_loop *l)
{
    int rc = vl_open_main(l);
    if (rc)
        return rc;
    for (int i = 0; i < 2; i++) {
        ibv_destroy_qp(l->qp[i]);
        l->qp[i] = NULL;
    }
    ibv_destroy_cq(l->cq);
    l->cq = NULL;
    return 0;
}

/* reg + dereg of `buf`: lazily released, so the shim's cache keeps it. */
static void reg_dereg(struct ibv_pd *pd, void *buf)
{
    struct ibv_mr *mr = ibv_reg_mr(pd, buf, LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
    EXPECT(mr != NULL, "ibv_reg_mr failed");
    if (mr)
        EXPECT(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
}

int main(int argc, char **argv)
{
    int plain = argc > 1 && strcmp(argv[1], "plain") == 0;
    stats_fn = (int (*)(struct fh_preload_stats *, size_t))dlsym(RTLD_DEFAULT, "fh_preload_stats");
    if (!plain && !stats_fn) {
        fprintf(stderr, "preload_close_device: the shim is not loaded\n");
        return 1;
    }
    struct vl_loop l;
    int rc = open_pd(&l);
    if (rc)
        return rc;
    void *buf = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED)
        return 1;
    memset(buf, 1, LEN);

    reg_dereg(l.pd, buf);
    struct fh_preload_stats s1 = snap();
    if (!plain) {
        EXPECT(s1.pinned_bytes > 0, "the cache keeps the released MR (lazy release)");
        EXPECT(s1.caches == 1, "caches %llu", (unsigned long long)s1.caches);
    }

    /* The application's mistake: the pd stays allocated. */
    EXPECT(ibv_close_device(l.ctx) == 0, "ibv_close_device");
    l.ctx = NULL;
    l.pd = NULL;
    struct fh_preload_stats s2 = snap();
    if (!plain) {
        EXPECT(s2.pinned_bytes == 0, "still registered after the close: %llu bytes",
              (unsigned long long)s2.pinned_bytes);
        EXPECT(s2.caches == 0, "caches left after the close: %llu", (unsigned long long)s2.caches);
        EXPECT(s2.real_deregs == s2.real_regs, "real regs %llu, real deregs %llu",
              (unsigned long long)s2.real_regs, (unsigned long long)s2.real_deregs);
    }

    /* An unmap of the range must not reach the closed context. */
    EXPECT(munmap(buf, LEN) == 0, "munmap");
    struct fh_preload_stats s3 = snap();
    if (!plain)
        EXPECT(s3.real_deregs == s2.real_deregs, "real ibv_dereg_mr after the close: %llu -> %llu",
              (unsigned long long)s2.real_deregs, (unsigned long long)s3.real_deregs);

    /* The device is usable again through a new context. */
    buf = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED)
        return 1;
    memset(buf, 2, LEN);
    rc = open_pd(&l);
    EXPECT(rc == 0, "reopen: %d", rc);
    if (rc == 0) {
        reg_dereg(l.pd, buf);
        reg_dereg(l.pd, buf);
        struct fh_preload_stats s4 = snap();
        if (!plain)
            EXPECT(s4.hits > s3.hits && s4.caches == 1, "no hit on the new context (hits %llu -> "
                  "%llu, caches %llu)", (unsigned long long)s3.hits,
                  (unsigned long long)s4.hits, (unsigned long long)s4.caches);
        vl_close(&l);
    }
    munmap(buf, LEN);
    if (check_failures) {
        fprintf(stderr, "preload_close_device: %d check(s) failed\n", check_failures);
        return 1;
    }
    printf("preload_close_device%s: all checks passed\n", plain ? " (plain)" : "");
    return 0;
}
