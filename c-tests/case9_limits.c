/* Case 9: small `ulimit -l`. In a forked child that drops CAP_IPC_LOCK (root bypasses
 * RLIMIT_MEMLOCK with it) and sets RLIMIT_MEMLOCK to 1 MiB, with the cache's own limit far above:
 *   - mlock fails with ENOMEM once 1 MiB is locked; the cache must evict idle registrations and
 *     retry (pin_retries, evictions grow) and succeed;
 *   - with everything pinned in use, a further registration must fail with FH_ERR_NO_MEMORY at
 *     once (pin_failures grows), not hang, and nothing changes; after a release it works again;
 *   - a request above max_pinned is FH_ERR_TOO_LARGE.
 * The parent only waits for the child (with a watchdog of its own). */
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>

#include "case_util.h"

#define LIMIT (1u << 20)
#define CHUNK (256u << 10)

static void drop_ipc_lock(void) {
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2];
    CHECK(syscall(SYS_capget, &h, d) == 0);
    d[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
    d[CAP_IPC_LOCK / 32].permitted &= ~(1u << (CAP_IPC_LOCK % 32));
    CHECK(syscall(SYS_capset, &h, d) == 0);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int child(void) {
    case_watchdog(60);
    drop_ipc_lock();
    struct rlimit rl = {LIMIT, LIMIT};
    CHECK(setrlimit(RLIMIT_MEMLOCK, &rl) == 0);
    /* Is the limit enforced now? (It is not if some other capability path still bypasses it.) */
    char *probe = fh_test_map(2 * LIMIT);
    if (mlock(probe, 2 * LIMIT) == 0) {
        printf("SKIP: mlock beyond RLIMIT_MEMLOCK still succeeds after dropping CAP_IPC_LOCK\n");
        return FH_SKIP;
    }
    CHECK(munmap(probe, 2 * LIMIT) == 0);

    fh_cache *c = case_cache((size_t)64 << 20, 1024); /* the cache's own bound is no help here */
    enum { N = 12 };
    char *bufs[N];
    for (int i = 0; i < N; i++) bufs[i] = fh_test_map(CHUNK);

    /* 12 x 256 KiB registered and released one after the other: only 4 fit under the rlimit, so
     * the cache has to evict idle ones when mlock says ENOMEM. */
    for (int i = 0; i < N; i++) {
        fh_mr mr;
        CHECK_OK(fh_register(c, bufs[i], CHUNK, FH_ACCESS_LOCAL_WRITE, &mr));
        CHECK_OK(fh_deregister(c, mr.handle));
    }
    fh_stats s = fh_test_stats(c);
    printf("  12 x 256 KiB under a 1 MiB rlimit: %llu evictions, %llu pin retries, %llu pinned\n",
           (unsigned long long)s.evictions, (unsigned long long)s.pin_retries,
           (unsigned long long)s.pinned_bytes);
    CHECK(s.pin_retries >= N - 4);
    CHECK(s.evictions >= N - 4);
    CHECK(s.pinned_bytes <= LIMIT);
    CHECK_EQ_U64(s.pin_failures, 0);

    /* Hold as many as fit, then one more: a clear error, quickly. */
    fh_mr held[N];
    int nheld = 0;
    fh_status st = FH_OK;
    double t0 = now_s();
    while (nheld < N) {
        st = fh_register(c, bufs[nheld], CHUNK, FH_ACCESS_LOCAL_WRITE, &held[nheld]);
        if (st != FH_OK) break;
        nheld++;
    }
    double dt = now_s() - t0;
    printf("  held %d x 256 KiB, then %s after %.3f s\n", nheld, fh_status_str((int)st), dt);
    CHECK_STATUS(st, FH_ERR_NO_MEMORY);
    CHECK(nheld >= 2 && nheld <= 4); /* 1 MiB minus whatever the process had locked already */
    CHECK(dt < 5.0);
    fh_stats f = fh_test_stats(c);
    CHECK(f.pin_failures >= 1);
    CHECK_EQ_U64(f.in_use, (uint64_t)nheld);
    /* The same request again fails the same way (no state was damaged). */
    fh_mr extra;
    CHECK_STATUS(fh_register(c, bufs[nheld], CHUNK, FH_ACCESS_LOCAL_WRITE, &extra), FH_ERR_NO_MEMORY);
    /* Release one: now it fits (evicting the idle released one, or reusing its room). */
    CHECK_OK(fh_deregister(c, held[0].handle));
    CHECK_OK(fh_register(c, bufs[nheld], CHUNK, FH_ACCESS_LOCAL_WRITE, &extra));
    CHECK_OK(fh_deregister(c, extra.handle));
    for (int i = 1; i < nheld; i++) CHECK_OK(fh_deregister(c, held[i].handle));

    /* Above the cache's own bound: FH_ERR_TOO_LARGE, nothing pinned. */
    CHECK_OK(fh_set_limits(c, CHUNK, 1024));
    CHECK_STATUS(fh_register(c, bufs[0], 2 * CHUNK, FH_ACCESS_LOCAL_WRITE, &extra), FH_ERR_TOO_LARGE);
    CHECK_OK(fh_register(c, bufs[0], CHUNK, FH_ACCESS_LOCAL_WRITE, &extra));
    CHECK_OK(fh_deregister(c, extra.handle));
    CHECK_OK(fh_cache_finalize(c));
    puts("case9_limits: ok");
    return 0;
}

int main(void) {
    case_watchdog(90);
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int rc = child();
        fflush(stdout);
        _exit(rc);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    if (!WIFEXITED(status)) {
        fprintf(stderr, "child died (status %#x)\n", status);
        return 1;
    }
    return WEXITSTATUS(status);
}
