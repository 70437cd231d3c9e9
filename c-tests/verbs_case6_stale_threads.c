/* Case 6 on real verbs (Soft-RoCE VM): the same rounds as case6_stale_threads.c (see
 * stale_threads.h) with the verbs backend, each thread with its own loopback connection and PD
 * (common/verbs_loopback.h) and its own cache in that PD; after every re-registration an RDMA READ
 * through the returned rkey must bring back the NEW pages' pattern (a stale MR still maps the old
 * pages and returns the old pattern). Sized for TCG: 8 threads x 12 rounds a path, at most 5 s a
 * path (FH_STALE_THREADS / FH_STALE_ROUNDS / FH_STALE_PATH_SECONDS override).
 *
 *   c_verbs_case6_stale_threads [all|PATH[,PATH...]] [--expect-stale]
 *
 * Exit 77 without an RDMA device. */
#define STALE_VERBS 1
#include "stale_threads.h"

int main(int argc, char **argv) {
    return st_main(argc, argv, "verbs_case6_stale_threads", 8, 12, 3);
}
