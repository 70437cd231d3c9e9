/* The helper thread (FH_HELPER; Li et al., "Scalable Memory Registration for High Performance
 * Networks Using Helper Threads" (CF 2011)) through the C API: forced on with an explicit core
 * (the machines this runs on seldom have an idle one), a buffer registered from two call sites
 * every 5 ms, then the counters: every registration tracked, predictions made, the helper's
 * unpins and pins ahead seen in fh_helper_stats and in fh_info. A config without it reports
 * state 0 and says why in fh_info. Bad input still gets its status with the helper on. */
#include "fh_test.h"

#include <sched.h>
#include <string.h>
#include <time.h>

static void sleep_ms(int ms) {
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

static fh_status reg_a(fh_cache *c, void *b, size_t n, fh_mr *mr) {
    return fh_register(c, b, n, FH_ACCESS_LOCAL_WRITE, mr);
}
static fh_status reg_b(fh_cache *c, void *b, size_t n, fh_mr *mr) {
    return fh_register(c, b, n, FH_ACCESS_LOCAL_WRITE, mr);
}

int main(void) {
    cpu_set_t set;
    CHECK(sched_getaffinity(0, sizeof set, &set) == 0);
    unsigned cpu = 0;
    while (!CPU_ISSET(cpu, &set)) cpu++;

    fh_config cfg;
    CHECK_OK(fh_config_init(&cfg));
    cfg.backend = FH_BACKEND_MLOCK;
    cfg.monitor = FH_MONITOR_PATCH_LIBC;
    cfg.max_pinned = 64 << 20;
    cfg.helper = FH_HELPER_ON;
    cfg.helper_cpu = cpu;
    cfg.helper_min_bytes = 64 << 10;
    fh_cache *c;
    CHECK_OK(fh_cache_new(&cfg, &c));

    /* The helper unpins only when a gap buys at least 16 planned pins unpinned (PlannerConfig::
     * min_unpinned_pins): 10 ms gaps and 256 KiB pins leave room for a pin 30x slower than on an
     * idle host (with 1 MiB and 5 ms, a loaded CI host once measured pins too slow to unpin). */
    size_t len = 256 << 10;
    char *buf = fh_test_map(len);
    memset(buf, 1, len);
    for (int i = 0; i < 40; i++) {
        fh_mr mr;
        CHECK_OK((i % 2 ? reg_b : reg_a)(c, buf, len, &mr));
        CHECK(mr.addr == buf);
        CHECK_OK(fh_deregister(c, mr.handle));
        sleep_ms(10);
    }
    /* Below the threshold: cached as usual, not tracked. */
    fh_mr small;
    CHECK_OK(fh_register(c, buf, 4096, FH_ACCESS_LOCAL_WRITE, &small));
    CHECK_OK(fh_deregister(c, small.handle));
    /* Bad input with the helper on: the documented statuses. */
    fh_mr bad;
    CHECK_STATUS(fh_register(c, NULL, len, 0, &bad), FH_ERR_NULL);
    CHECK_STATUS(fh_register(c, buf, 0, 0, &bad), FH_ERR_ZERO_LENGTH);
    CHECK_STATUS(fh_deregister(c, 12345), FH_ERR_UNKNOWN_HANDLE);

    fh_helper_stats hs;
    memset(&hs, 0, sizeof hs);
    for (int i = 0; i < 200; i++) { /* the helper publishes on every loop */
        CHECK_OK(fh_get_helper_stats(c, &hs));
        if (hs.tracked_registrations == 40) break;
        sleep_ms(1);
    }
    CHECK_EQ_U64(hs.state, 1);
    CHECK_EQ_U64(hs.cpu, cpu);
    CHECK_EQ_U64(hs.tracked_registrations, 40);
    CHECK(hs.predictions > 0);
    CHECK(hs.helper_unpins > 0);
    CHECK(hs.early_registrations + hs.late_registrations + hs.unpredicted_registrations > 0);
    CHECK(hs.elapsed_ns > 0);
    CHECK_STATUS(fh_get_helper_stats(c, NULL), FH_ERR_NULL);
    CHECK_STATUS(fh_get_helper_stats(NULL, &hs), FH_ERR_NULL);
    char info[8192];
    fh_helper_stats on = hs;
    CHECK_OK(fh_info(c, info, sizeof info, NULL));
    CHECK(strstr(info, "helper:        on (core") != NULL);
    CHECK(strstr(info, "predictions:") != NULL);
    fh_cache_free(c);

    cfg.helper = FH_HELPER_OFF;
    CHECK_OK(fh_cache_new(&cfg, &c));
    CHECK_OK(fh_get_helper_stats(c, &hs));
    CHECK_EQ_U64(hs.state, 0);
    CHECK_EQ_U64(hs.tracked_registrations, 0);
    CHECK_OK(fh_info(c, info, sizeof info, NULL));
    CHECK(strstr(info, "helper:        off: not asked for") != NULL);
    fh_cache_free(c);
    munmap(buf, len);
    printf("helper_api: ok (%llu early, %llu late, %llu unpredicted of %llu tracked; %llu unpins)\n",
           (unsigned long long)on.early_registrations, (unsigned long long)on.late_registrations,
           (unsigned long long)on.unpredicted_registrations,
           (unsigned long long)on.tracked_registrations, (unsigned long long)on.helper_unpins);
    return 0;
}
