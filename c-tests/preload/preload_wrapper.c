/* Wrapper semantics of libfirehose_preload.so, on a real device (run under LD_PRELOAD):
 *  - the MR handed out has addr/length exactly as requested and the caller's pd/context;
 *  - a second identical registration is a cache hit with the same keys, in a distinct wrapper;
 *  - a pass-through registration (flags the cache cannot serve) reaches libibverbs, whose internal
 *    ibv_reg_mr -> ibv_reg_mr_iova2 call is counted as ONE application call plus one nested call;
 *  - ibv_dereg_mr of an MR the shim never saw (made with the real function) passes through;
 *  - a cached read-only registration does not serve a remote-write request, and a remote-read
 *    request never gets a remote-write rkey (a refused RDMA WRITE proves it);
 *  - ibv_rereg_mr on a wrapper moves it (same pointer) and bad flags leave it valid;
 *  - ibv_alloc_pd starts the monitor (userfaultfd's reader thread runs before any registration);
 *  - ibv_dealloc_pd succeeds after the application deregistered everything (the cache's idle
 *    MRs must not keep the pd busy).
 * With FH_DISABLE=1 (argv[1] == "disabled") every call must pass straight through instead. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "../../ld-preload/include/firehose_preload.h"
#include "../common/fh_check.h"
#include "../common/verbs_loopback.h"

#define RW (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static int (*stats_fn)(struct fh_preload_stats *, size_t);

static struct fh_preload_stats snap(void)
{
    struct fh_preload_stats s;
    memset(&s, 0, sizeof(s));
    stats_fn(&s, sizeof(s));
    return s;
}

typedef struct ibv_mr *(*iova2_fn)(struct ibv_pd *, void *, size_t, uint64_t, unsigned);

/* A thread of this process named `name` (/proc/self/task/N/comm). */
static int has_thread(const char *name)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return 0;
    int found = 0;
    struct dirent *e;
    while (!found && (e = readdir(d))) {
        char path[300], comm[64] = "";
        snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        if (fgets(comm, sizeof(comm), f))
            found = strncmp(comm, name, strlen(name)) == 0;
        fclose(f);
    }
    closedir(d);
    return found;
}

/* Whether this process may open a userfaultfd (seccomp profiles and vm.unprivileged_userfaultfd
 * may refuse it). */
static int uffd_allowed(void)
{
    long fd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return 0;
    close((int)fd);
    return 1;
}

static void disabled_case(struct vl_loop *l, char *buf)
{
    EXPECT(!has_thread("fh-uffd"), "FH_DISABLE=1 started a userfaultfd reader");
    struct fh_preload_stats s0 = snap();
    EXPECT(!(s0.flags & FH_PRELOAD_ACTIVE), "flags %u", s0.flags);
    struct ibv_mr *a = ibv_reg_mr(l->pd, buf + 100, 5000, RW);
    struct ibv_mr *b = ibv_reg_mr(l->pd, buf + 100, 5000, RW);
    EXPECT(a && b && a->addr == buf + 100 && b->length == 5000, "reg");
    struct fh_preload_stats s1 = snap();
    EXPECT(s1.hits == 0 && s1.misses == 0 && s1.wrappers_live == 0, "disabled: hits %lu misses %lu",
          (unsigned long)s1.hits, (unsigned long)s1.misses);
    EXPECT(s1.passthrough_reg - s0.passthrough_reg == 2, "both passed through");
    EXPECT(a && b && a->lkey != b->lkey, "two real MRs have two lkeys");
    EXPECT(ibv_dereg_mr(a) == 0 && ibv_dereg_mr(b) == 0, "dereg");
}

int main(int argc, char **argv)
{
    stats_fn = (int (*)(struct fh_preload_stats *, size_t))dlsym(RTLD_DEFAULT, "fh_preload_stats");
    if (!stats_fn) {
        fprintf(stderr, "fh_preload_stats not found: run under LD_PRELOAD=libfirehose_preload.so\n");
        return 2;
    }
    struct vl_loop l;
    int rc = vl_open_main(&l);
    if (rc)
        return rc;
    char *buf = aligned_alloc(4096, 1 << 20);
    memset(buf, 1, 1 << 20);

    if (argc > 1 && strcmp(argv[1], "disabled") == 0) {
        disabled_case(&l, buf);
        goto out;
    }

    struct fh_preload_stats s0 = snap();
    EXPECT(s0.flags & FH_PRELOAD_ACTIVE, "shim not active (flags %u)", s0.flags);

    /* 0. ibv_alloc_pd (in vl_open_main) started the monitor before any registration: where this
     * process may open a userfaultfd, its reader thread runs already. */
    if (uffd_allowed())
        EXPECT(has_thread("fh-uffd"), "no fh-uffd thread after ibv_alloc_pd");

    /* 1. exact addr/length, pd, context; a miss. */
    struct ibv_mr *a = ibv_reg_mr(l.pd, buf + 100, 5000, RW);
    EXPECT(a != NULL, "ibv_reg_mr");
    if (!a)
        goto out;
    EXPECT(a->addr == buf + 100, "addr %p want %p", a->addr, (void *)(buf + 100));
    EXPECT(a->length == 5000, "length %zu", a->length);
    EXPECT(a->pd == l.pd && a->context == l.ctx, "pd/context");
    struct fh_preload_stats s1 = snap();
    EXPECT(s1.app_reg_calls - s0.app_reg_calls == 1, "app calls %lu",
          (unsigned long)(s1.app_reg_calls - s0.app_reg_calls));
    EXPECT(s1.misses - s0.misses == 1, "misses +%lu", (unsigned long)(s1.misses - s0.misses));
    EXPECT(s1.wrappers_live - s0.wrappers_live == 1, "wrappers");

    /* 2. the same again: a hit, same keys, another wrapper. */
    struct ibv_mr *b = ibv_reg_mr(l.pd, buf + 100, 5000, RW);
    struct fh_preload_stats s2 = snap();
    EXPECT(b && b != a, "distinct wrapper");
    EXPECT(b && b->lkey == a->lkey && b->rkey == a->rkey, "same keys");
    EXPECT(s2.hits - s1.hits == 1, "hits +%lu", (unsigned long)(s2.hits - s1.hits));
    EXPECT(s2.real_regs == s1.real_regs, "a hit makes no real registration");
    EXPECT(s2.hit_bytes - s1.hit_bytes == 5000, "hit bytes +%lu", (unsigned long)(s2.hit_bytes - s1.hit_bytes));

    /* 3. pass-through flags: one app call, one nested call inside libibverbs, a real MR. */
    struct ibv_mr *p = ibv_reg_mr(l.pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
    struct fh_preload_stats s3 = snap();
    EXPECT(p != NULL, "MW_BIND registration");
    EXPECT(s3.app_reg_calls - s2.app_reg_calls == 1, "one app call, got %lu",
          (unsigned long)(s3.app_reg_calls - s2.app_reg_calls));
    EXPECT(s3.nested_calls - s2.nested_calls == 1, "one nested call, got %lu",
          (unsigned long)(s3.nested_calls - s2.nested_calls));
    EXPECT(s3.passthrough_reg - s2.passthrough_reg == 1, "passed through");
    EXPECT(s3.wrappers_live == s2.wrappers_live, "no wrapper for a pass-through MR");
    if (p)
        EXPECT(ibv_dereg_mr(p) == 0, "dereg pass-through MR");

    /* 4. an MR made by the real function, never seen by the shim: dereg passes through. */
    void *lib = dlopen("libibverbs.so.1", RTLD_NOLOAD | RTLD_LAZY);
    iova2_fn real_iova2 = lib ? (iova2_fn)dlvsym(lib, "ibv_reg_mr_iova2", "IBVERBS_1.8") : NULL;
    EXPECT(real_iova2 != NULL && (void *)real_iova2 != dlsym(RTLD_DEFAULT, "ibv_reg_mr_iova2"),
          "real ibv_reg_mr_iova2 distinct from the hook");
    if (real_iova2) {
        struct fh_preload_stats s4 = snap();
        struct ibv_mr *r = real_iova2(l.pd, buf, 8192, (uintptr_t)buf, IBV_ACCESS_LOCAL_WRITE);
        EXPECT(r != NULL, "real registration");
        if (r) {
            EXPECT(ibv_dereg_mr(r) == 0, "dereg of a foreign MR");
            struct fh_preload_stats s5 = snap();
            EXPECT(s5.passthrough_dereg - s4.passthrough_dereg == 1, "foreign dereg passed through");
        }
    }

    /* 5. access rights: a cached local-only registration must not serve remote write. */
    char *c = buf + 65536;
    struct ibv_mr *ro = ibv_reg_mr(l.pd, c, 8192, IBV_ACCESS_LOCAL_WRITE);
    struct fh_preload_stats s6 = snap();
    struct ibv_mr *wr = ibv_reg_mr(l.pd, c, 8192, RW);
    struct fh_preload_stats s7 = snap();
    EXPECT(ro && wr, "registrations");
    EXPECT(s7.misses - s6.misses == 1, "remote write after local-only must miss (misses +%lu)",
          (unsigned long)(s7.misses - s6.misses));
    /* prove the rkey really allows remote write: RDMA WRITE into c through wr */
    if (wr) {
        memset(buf + 4096, 0x5a, 256);
        int st = vl_rdma(&l, IBV_WR_RDMA_WRITE, buf + 4096, a->lkey, (uintptr_t)c, wr->rkey, 256);
        EXPECT(st == 0, "RDMA WRITE through the remote-write registration: status %d", st);
        EXPECT(st != 0 || (c[0] == 0x5a && c[255] == 0x5a), "bytes written");
    }
    if (ro)
        EXPECT(ibv_dereg_mr(ro) == 0, "dereg ro");
    if (wr)
        EXPECT(ibv_dereg_mr(wr) == 0, "dereg wr");

    /* 6. rereg: bad flags leave the wrapper valid; a translation change keeps the pointer. */
    struct ibv_mr *m = ibv_reg_mr(l.pd, buf + 131072, 4096, RW);
    EXPECT(m != NULL, "reg for rereg");
    if (m) {
        EXPECT(ibv_rereg_mr(m, 1 << 5, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT, "bad flags");
        EXPECT(m->addr == buf + 131072, "unchanged after bad flags");
        int r = ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, buf + 262144 + 8, 1000, 0);
        EXPECT(r == 0, "rereg translation: %d", r);
        EXPECT(m->addr == buf + 262144 + 8 && m->length == 1000, "moved: %p %zu", m->addr,
              m->length);
        memset(buf + 4608, 0x33, 64);
        int st = vl_rdma(&l, IBV_WR_RDMA_WRITE, buf + 4608, a->lkey, (uintptr_t)(buf + 262144 + 8),
                           m->rkey, 64);
        EXPECT(st == 0 && buf[262144 + 8] == 0x33, "RDMA WRITE through the re-registered MR");
        EXPECT(ibv_dereg_mr(m) == 0, "dereg after rereg");
    }

    /* 7. remote rights are never widened: after a remote-write registration of a buffer, a
     * remote-read-only registration of it must get an rkey that refuses RDMA WRITE. (Last RDMA
     * of the test: the refused WRITE moves the loopback QP to the error state.) */
    char *rbuf = buf + 393216;
    struct ibv_mr *rwm = ibv_reg_mr(l.pd, rbuf, 8192, RW);
    struct ibv_mr *rrm = ibv_reg_mr(l.pd, rbuf, 8192, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
    EXPECT(rwm && rrm && rrm->rkey != rwm->rkey, "remote-read request got the remote-write rkey");
    if (rwm && rrm) {
        int st = vl_rdma(&l, IBV_WR_RDMA_WRITE, buf + 4096, a->lkey, (uintptr_t)rbuf, rrm->rkey, 64);
        EXPECT(st == IBV_WC_REM_ACCESS_ERR, "RDMA WRITE through a remote-read rkey: status %d", st);
        EXPECT(ibv_dereg_mr(rwm) == 0 && ibv_dereg_mr(rrm) == 0, "dereg rights pair");
    }

    EXPECT(ibv_dereg_mr(a) == 0, "dereg a");
    if (b)
        EXPECT(ibv_dereg_mr(b) == 0, "dereg b");
    struct fh_preload_stats s8 = snap();
    EXPECT(s8.wrappers_live == s0.wrappers_live, "every wrapper released (%lu live)",
          (unsigned long)s8.wrappers_live);
    EXPECT(s8.pinned_bytes > 0, "the cache keeps idle registrations (lazy release)");

out:
    /* The pd's deallocation must succeed although the cache kept MRs on it. */
    for (int i = 0; i < 2; i++) {
        ibv_destroy_qp(l.qp[i]);
        l.qp[i] = NULL;
    }
    ibv_destroy_cq(l.cq);
    l.cq = NULL;
    int d = ibv_dealloc_pd(l.pd);
    EXPECT(d == 0, "ibv_dealloc_pd: %d", d);
    l.pd = NULL;
    vl_close(&l);
    free(buf);
    if (check_failures) {
        fprintf(stderr, "preload_wrapper: %d check(s) failed\n", check_failures);
        return 1;
    }
    printf("preload_wrapper: all checks passed\n");
    return 0;
}
