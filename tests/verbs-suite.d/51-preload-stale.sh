# shellcheck shell=bash
# Stale registrations under libfirehose_preload.so (c-tests/preload/preload_stale.c): register,
# deregister, replace the memory under the same address (free+malloc, munmap+mmap, mremap,
# madvise DONTNEED, mmap MAP_FIXED), register again; RDMA READ and WRITE through the new keys on a
# loopback RC QP must use the new pages. Each case must pass without the shim (the test is sound)
# and with it; with FH_TEST_NO_INVALIDATE=1 every case must FAIL (the test can fail).
set -uo pipefail
. "$FH_REPO/scripts/lib/verbs-test.sh"
. "$FH_REPO/c-tests/preload/suite-lib.sh"
preload_setup
preload_cc preload_stale

cases="free-malloc munmap-mmap mremap madvise-dontneed mmap-fixed"
fails=0
for c in $cases; do
    timeout 120 "$CC_OUT/preload_stale" "$c"; plain=$?
    under_shim timeout 120 "$CC_OUT/preload_stale" "$c"; shim=$?
    FH_TEST_NO_INVALIDATE=1 under_shim timeout 120 "$CC_OUT/preload_stale" "$c" 2>&1 | tail -3
    noinv=${PIPESTATUS[0]}
    echo "case $c: without shim exit $plain, with shim exit $shim, FH_TEST_NO_INVALIDATE=1 exit $noinv (must be 1)"
    [ "$plain" = 0 ] || { echo "  FAIL: the case does not pass even without the shim"; fails=$((fails + 1)); }
    [ "$shim" = 0 ] || { echo "  FAIL: stale registration used under the shim"; fails=$((fails + 1)); }
    [ "$noinv" = 1 ] || { echo "  FAIL: without invalidation the case did not fail: the test cannot see staleness"; fails=$((fails + 1)); }
done
# The shim's own exported munmap/mremap/madvise/mmap alone (monitor off): every case the
# application triggers by a direct call must still be caught. (free+malloc unmaps inside glibc,
# which only the monitor sees.)
for c in munmap-mmap mremap madvise-dontneed mmap-fixed; do
    FH_MONITOR=none under_shim timeout 120 "$CC_OUT/preload_stale" "$c"; rc=$?
    echo "case $c with FH_MONITOR=none (exported hooks only): exit $rc"
    [ "$rc" = 0 ] || { echo "  FAIL: the exported unmap hooks missed it"; fails=$((fails + 1)); }
done
echo "preload-stale: $fails failure(s)"
[ "$fails" = 0 ]
