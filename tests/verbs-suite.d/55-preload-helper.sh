# shellcheck shell=bash
# The helper thread under libfirehose_preload.so (FH_HELPER=1, forced onto core 0, every
# registration of 4 KiB or more tracked): the stale cases of c-tests/preload/preload_stale.c
# (replace the memory under a registered address, register again, RDMA READ and WRITE through
# the new keys must use the new pages) must still pass with a helper per cache, and the FH_STATS
# summary must show the helper running.
set -uo pipefail
. "$FH_REPO/scripts/lib/verbs-test.sh"
. "$FH_REPO/c-tests/preload/suite-lib.sh"
preload_setup
preload_cc preload_stale

export FH_HELPER=1 FH_HELPER_CPU=0 FH_HELPER_MIN=4k
fails=0
for c in free-malloc munmap-mmap mremap madvise-dontneed mmap-fixed; do
    stats=$FH_TEST_DIR/stats-$c.txt
    rm -f "$stats"
    FH_STATS=1 FH_STATS_FILE=$stats under_shim timeout 120 "$CC_OUT/preload_stale" "$c"; rc=$?
    echo "case $c with FH_HELPER=1: exit $rc"
    [ "$rc" = 0 ] || { echo "  FAIL: stale registration used under the shim with a helper"; fails=$((fails + 1)); }
    grep -E 'helper: ' "$stats" || true
    grep -qE 'helper: +[1-9][0-9]* thread' "$stats" ||
        { echo "  FAIL: FH_STATS shows no running helper"; fails=$((fails + 1)); }
done
echo "preload-helper: $fails failure(s)"
[ "$fails" = 0 ]
