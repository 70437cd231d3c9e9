# shellcheck shell=bash
# Stale registrations under libfirehose_preload.so from 16 threads in one protection domain
# (c-tests/preload/preload_stale_threads.c): every thread replaces the memory under registered
# addresses (munmap, raw munmap, madvise, mremap, mmap MAP_FIXED, free -> malloc), each round a
# different way next to the others, and reads the new pages by RDMA through its new rkey. Must pass
# without the shim (the test is sound) and with it; with FH_TEST_NO_INVALIDATE=1 it must fail (the
# test sees a stale registration when there is one). Then the hole of a raw munmap, mapped again
# by another thread before the unmap's event is read, with and without the fresh-mapping report.
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
# Another thread maps the hole of a raw munmap while its userfaultfd event is unread (the reader
# slowed down on purpose): c-tests/preload/preload_fresh_hole.c. The shim's mmap reports the new
# range, so its registration misses; with that report off it is a hit on the gone pages.
preload_cc preload_fresh_hole
FH_TEST_UFFD_DELAY_US=500000 PFH_EXPECT_WINDOW=1 under_shim timeout 300 "$CC_OUT/preload_fresh_hole"
hole=$?
FH_TEST_UFFD_DELAY_US=500000 PFH_EXPECT_WINDOW=1 FH_TEST_DISABLE_HOOKS=fresh under_shim timeout 300 "$CC_OUT/preload_fresh_hole" 2>&1 | tail -3
nofresh=${PIPESTATUS[0]}
echo "without shim exit $plain, with shim exit $shim, FH_TEST_NO_INVALIDATE=1 exit $noinv (must be 1)"
echo "fresh hole: exit $hole, and with FH_TEST_DISABLE_HOOKS=fresh exit $nofresh (must be 1)"
[ "$hole" = 0 ] || { echo "  FAIL: new memory in a raw munmap's hole got the old registration"; fails=$((fails + 1)); }
[ "$nofresh" = 1 ] || { echo "  FAIL: without the fresh-mapping report nothing went stale: the test cannot see it"; fails=$((fails + 1)); }
echo "preload-stale-threads: $fails failure(s)"
[ "$fails" = 0 ]
