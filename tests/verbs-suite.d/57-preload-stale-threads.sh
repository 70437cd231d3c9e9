# shellcheck shell=bash
# Stale registrations under libfirehose_preload.so from 16 threads in one protection domain
# (c-tests/preload/preload_stale_threads.c): every thread replaces the memory under registered
# addresses (munmap, raw munmap, madvise, mremap, mmap MAP_FIXED, free -> malloc), each round a
# different way next to the others, and reads the new pages by RDMA through its new rkey. Must pass
# without the shim (the test is sound) and with it; with FH_TEST_NO_INVALIDATE=1 it must fail (the
# test sees a stale registration when there is one).
set -uo pipefail
. "$FH_REPO/scripts/lib/verbs-test.sh"
. "$FH_REPO/c-tests/preload/suite-lib.sh"
preload_setup
preload_cc preload_stale_threads

fails=0
timeout 600 "$CC_OUT/preload_stale_threads"; plain=$?
FH_STATS=1 under_shim timeout 600 "$CC_OUT/preload_stale_threads"; shim=$?
FH_TEST_NO_INVALIDATE=1 under_shim timeout 600 "$CC_OUT/preload_stale_threads" 2>&1 | tail -12
noinv=${PIPESTATUS[0]}
echo "without shim exit $plain, with shim exit $shim, FH_TEST_NO_INVALIDATE=1 exit $noinv (must be 1)"
[ "$plain" = 0 ] || { echo "  FAIL: the test does not pass even without the shim"; fails=$((fails + 1)); }
[ "$shim" = 0 ] || { echo "  FAIL: a stale registration was used under the shim"; fails=$((fails + 1)); }
[ "$noinv" = 1 ] || { echo "  FAIL: without invalidation nothing went stale: the test cannot see it"; fails=$((fails + 1)); }
echo "preload-stale-threads: $fails failure(s)"
[ "$fails" = 0 ]
