/* The library's messages reach a host runtime's callback (fh_set_log_callback) instead of
 * stderr, filtered by level (fh_set_log_level, FH_LOG): a bad setting refused by fh_config_init
 * is reported once at FH_LOG_ERROR with the variable's name; at FH_LOG_OFF nothing is reported;
 * a level outside the enum is refused and changes nothing; NULL restores stderr. */
#include "fh_test.h"

#include <string.h>

static int calls;
static int last_level;
static char last_msg[512];

static void on_log(void *user, int level, const char *msg, size_t len)
{
    CHECK(user == (void *)&calls);
    CHECK(msg != NULL);
    CHECK(strlen(msg) == len);
    calls++;
    last_level = level;
    snprintf(last_msg, sizeof last_msg, "%s", msg);
}

int main(void)
{
    fh_config cfg;
    CHECK_OK(fh_set_log_callback(on_log, &calls));
    CHECK_OK(fh_set_log_level(FH_LOG_WARN));

    setenv("FH_MAX_REGIONS", "many", 1);
    CHECK_STATUS(fh_config_init(&cfg), FH_ERR_BAD_CONFIG);
    CHECK(calls == 1);
    CHECK(last_level == FH_LOG_ERROR);
    CHECK(strstr(last_msg, "FH_MAX_REGIONS") != NULL);

    /* Off: refused all the same, nothing reported. */
    CHECK_OK(fh_set_log_level(FH_LOG_OFF));
    CHECK_STATUS(fh_config_init(&cfg), FH_ERR_BAD_CONFIG);
    CHECK(calls == 1);

    /* A level outside the enum: refused, the level stays off. */
    CHECK_STATUS(fh_set_log_level(5), FH_ERR_BAD_CONFIG);
    CHECK_STATUS(fh_set_log_level(-1), FH_ERR_BAD_CONFIG);
    CHECK_STATUS(fh_config_init(&cfg), FH_ERR_BAD_CONFIG);
    CHECK(calls == 1);

    /* Error level passes errors; NULL callback gives stderr back (no more calls here). */
    CHECK_OK(fh_set_log_level(FH_LOG_ERROR));
    CHECK_STATUS(fh_config_init(&cfg), FH_ERR_BAD_CONFIG);
    CHECK(calls == 2);
    CHECK_OK(fh_set_log_callback(NULL, NULL));
    CHECK_STATUS(fh_config_init(&cfg), FH_ERR_BAD_CONFIG);
    CHECK(calls == 2);

    unsetenv("FH_MAX_REGIONS");
    CHECK_OK(fh_config_init(&cfg));
    printf("PASS: log_callback (%d messages taken)\n", calls);
    return 0;
}
