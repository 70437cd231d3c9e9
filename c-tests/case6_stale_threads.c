/* Case 6, stale re-registration under threads (the acceptance test): 16 threads, a cache
 * each, every way memory can go away (libc and raw munmap, madvise, mremap, mmap(MAP_FIXED), free,
 * shmdt); after its own unmap + re-map, a thread's next registration of the address must be a miss,
 * and no memory call may behave unlike without the library. The whole description, the paths and
 * the settings are in stale_threads.h; the verbs twin with RDMA data checks is
 * verbs_case6_stale_threads.c. mlock backend (FH_CASE_BACKEND=verbs: verbs backend, private PD,
 * stats checks only, 4 threads x 8 rounds, at most 2 s a phase -- the Soft-RoCE VM re-runs case*
 * tests that way, tests/verbs-suite.d/31-ctest-native-on-verbs.sh).
 *
 * Measured (2-core host, mlock, `all`, 19 phases): 12-17 s alone, 14-18 s under ctest -j2 next to
 * the other entries; ASan build 13-31 s.
 *
 *   c_case6_stale_threads [all|PATH[,PATH...]] [--expect-stale]
 *
 * The must-fail entries in CMakeLists.txt run it with one protection off and --expect-stale. */
#include "stale_threads.h"

int main(int argc, char **argv) {
    /* 16 threads x 150 rounds = 2400 rounds a path: a 1 % per-round race is missed with
     * probability e^-24. */
    return st_main(argc, argv, "case6_stale_threads", 16, 150, 5);
}
