# shellcheck shell=bash
# libfirehose_preload.so wrapper semantics (c-tests/preload/preload_wrapper.c) on the real device:
# exact addr/length, hit with the same keys, pass-through flags counted as one call plus one nested
# call, foreign dereg passes through, access rights, rereg, dealloc_pd after lazy release. Then the
# FH_STATS summary must name the hits, and FH_DISABLE=1 must turn everything into pass-through.
set -uo pipefail
. "$FH_REPO/scripts/lib/verbs-test.sh"
. "$FH_REPO/c-tests/preload/suite-lib.sh"
preload_setup
preload_cc preload_wrapper

stats=$FH_TEST_DIR/stats.txt
rm -f "$stats"
FH_STATS=1 FH_STATS_FILE=$stats under_shim timeout 300 "$CC_OUT/preload_wrapper"
rc=$?
[ "$rc" = 0 ] || { echo "preload_wrapper exited $rc"; exit 1; }
echo "--- FH_STATS summary"; cat "$stats"
grep -qE 'cache: +[1-9][0-9]* hits' "$stats" || { echo "FH_STATS summary has no hits"; exit 1; }

FH_DISABLE=1 under_shim timeout 300 "$CC_OUT/preload_wrapper" disabled
rc=$?
[ "$rc" = 0 ] || { echo "preload_wrapper disabled exited $rc"; exit 1; }
echo "FH_DISABLE=1: pure pass-through confirmed"
