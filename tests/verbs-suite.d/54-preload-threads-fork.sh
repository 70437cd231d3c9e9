# shellcheck shell=bash
# libfirehose_preload.so under threads and fork (c-tests/preload/preload_threads_fork.c): 4 threads
# register/deregister/free in one protection domain while the main thread forks 20 children that
# must query the shim, malloc/free and touch heap pages next to a registered buffer without
# hanging on an inherited lock; afterwards no wrapper is left and the counters add up.
set -uo pipefail
. "$FH_REPO/scripts/lib/verbs-test.sh"
. "$FH_REPO/c-tests/preload/suite-lib.sh"
preload_setup
preload_cc preload_threads_fork

FH_STATS=1 FH_STATS_FILE=$FH_TEST_DIR/stats.txt under_shim timeout 600 "$CC_OUT/preload_threads_fork"
rc=$?
cat "$FH_TEST_DIR/stats.txt" 2>/dev/null
n=$(grep -c "summary" "$FH_TEST_DIR/stats.txt" 2>/dev/null)
echo "exit $rc, $n summary(ies) (forked children must not print their parent's counters)"
[ "$rc" = 0 ] && [ "$n" = 1 ]
