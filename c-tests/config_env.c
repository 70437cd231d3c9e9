/* fh_config_init / fh_cache_new(NULL) read the FH_* environment; bad values are refused with
 * FH_ERR_BAD_CONFIG and no output is written; backend selection without a device. */
#include "fh_test.h"

static int have_rdma_device(void) {
    FILE *f = popen("ls -A /sys/class/infiniband 2>/dev/null", "r");
    if (!f) return 0;
    char line[64];
    int any = fgets(line, sizeof line, f) != NULL;
    pclose(f);
    return any;
}

int main(void) {
    fh_config cfg;
    setenv("FH_BACKEND", "mlock", 1);
    setenv("FH_MAX_REGIONS", "7", 1);
    setenv("FH_MAX_PINNED", "1048576", 1);
    CHECK_OK(fh_config_init(&cfg));
    CHECK_EQ_U64(cfg.struct_size, sizeof(fh_config));
    CHECK_EQ_U64(cfg.backend, FH_BACKEND_MLOCK);
    CHECK_EQ_U64(cfg.max_regions, 7);
    CHECK_EQ_U64(cfg.max_pinned, 1048576);
    CHECK(cfg.ibv_pd == NULL);
    CHECK_EQ_U64(cfg.reserved, 0);

    /* NULL config = the same defaults + environment. */
    fh_cache *c = NULL;
    CHECK_OK(fh_cache_new(NULL, &c));
    size_t mp = 0, mr = 0;
    CHECK_OK(fh_get_limits(c, &mp, &mr));
    CHECK_EQ_U64(mp, 1048576);
    CHECK_EQ_U64(mr, 7);
    fh_cache_free(c);

    /* Invalid values: refused, outputs untouched. */
    const char *bad[][2] = {
        {"FH_MAX_PINNED", "lots"},
        {"FH_MAX_PINNED", "-5"},
        {"FH_MAX_REGIONS", "many"},
        {"FH_BACKEND", "carrier-pigeon"},
        {"FH_FORK_MODE", "sometimes"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv(bad[i][0], bad[i][1], 1);
        fh_config before = cfg;
        CHECK_STATUS(fh_config_init(&cfg), FH_ERR_BAD_CONFIG);
        CHECK(memcmp(&before, &cfg, sizeof cfg) == 0);
        fh_cache *c2 = (fh_cache *)&before;
        CHECK_STATUS(fh_cache_new(NULL, &c2), FH_ERR_BAD_CONFIG);
        CHECK(c2 == (fh_cache *)&before);
        unsetenv(bad[i][0]);
    }

    /* Backend selection on a host without an RDMA device. */
    if (!have_rdma_device()) {
        setenv("FH_BACKEND", "verbs", 1);
        CHECK_STATUS(fh_cache_new(NULL, &c), FH_ERR_NO_DEVICE);
        setenv("FH_BACKEND", "auto", 1);
        CHECK_OK(fh_cache_new(NULL, &c));
        char info[2048];
        CHECK_OK(fh_info(c, info, sizeof info, NULL));
        CHECK(strstr(info, "mlock") != NULL);
        fh_cache_free(c);
    }

    /* fh_info truncates like snprintf and reports the full length. */
    setenv("FH_BACKEND", "mlock", 1);
    CHECK_OK(fh_cache_new(NULL, &c));
    size_t needed = 0;
    CHECK_OK(fh_info(c, NULL, 0, &needed));
    CHECK(needed > 40);
    char small[16];
    memset(small, 'x', sizeof small);
    size_t needed2 = 0;
    CHECK_OK(fh_info(c, small, sizeof small, &needed2));
    CHECK_EQ_U64(needed2, needed);
    CHECK_EQ_U64(strlen(small), sizeof small - 1);

    /* Status strings and version. */
    CHECK(strcmp(fh_status_str(FH_OK), "success") == 0);
    CHECK(strcmp(fh_status_str(12345), "unknown status") == 0);
    /* Every status up to the last has its own string; the next number is unknown (so a status
     * added to the header without extending this loop fails here). */
    for (int s = FH_ERR_NULL; s <= FH_ERR_REMOTE_DENIED; s++) {
        CHECK(strlen(fh_status_str(s)) > 0);
        CHECK(strcmp(fh_status_str(s), "unknown status") != 0);
    }
    CHECK(strcmp(fh_status_str(FH_ERR_REMOTE_DENIED + 1), "unknown status") == 0);
    CHECK(strlen(fh_version()) >= 5);
    CHECK_OK(fh_print_info(c, 1));
    fh_cache_free(c);

    /* FH_FORK_MODE: keep for mlock by default; followed by a cache made from an explicit config
     * too (fh_config has no field for it); a bad value refuses that cache as well. */
    char info[4096];
    CHECK_OK(fh_cache_new(NULL, &c));
    CHECK_OK(fh_info(c, info, sizeof info, NULL));
    CHECK(strstr(info, "fork:          keep") != NULL);
    fh_cache_free(c);
    setenv("FH_FORK_MODE", "retire", 1);
    CHECK_OK(fh_config_init(&cfg));
    CHECK_OK(fh_cache_new(&cfg, &c));
    CHECK_OK(fh_info(c, info, sizeof info, NULL));
    CHECK(strstr(info, "fork:          retire") != NULL);
    fh_cache_free(c);
    setenv("FH_FORK_MODE", "never", 1);
    fh_cache *c3 = NULL;
    CHECK_STATUS(fh_cache_new(&cfg, &c3), FH_ERR_BAD_CONFIG);
    CHECK(c3 == NULL);
    unsetenv("FH_FORK_MODE");
    puts("config_env: ok");
    return 0;
}
