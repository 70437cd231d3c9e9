# shellcheck shell=bash
# The shim interplay (c-tests/preload/preload_rma.c): one program uses fh_put / fh_get
# (linked against libfirehose.so, PMIx bootstrap under mpirun, 2 ranks) and plain verbs (its own
# context, PD and loopback QP: registrations of fresh malloc'd buffers, RDMA WRITE and READ, every
# byte checked) in interleaved rounds. It must pass without the shim and with
# libfirehose_preload.so preloaded (the shim then serves the plain-verbs registrations from its
# cache: hits counted, every reused address invalidated). With FH_TEST_NO_INVALIDATE=1 under the
# shim, the plain-verbs half must FAIL (the reused buffers' stale registrations are caught).
# `setarch -R`: the program's static window has the same address in every rank.
set -uo pipefail
. "$FH_REPO/scripts/lib/verbs-test.sh"
. "$FH_REPO/c-tests/preload/suite-lib.sh"
fh_require_cmd mpirun
fh_require_cmd setarch
preload_setup
lib=$FH_BIN_DIR/libfirehose.so
[ -r "$lib" ] || fh_skip_or_fail "$lib not built (cargo build --release)"
src=$FH_REPO/c-tests/preload
cc -O1 -g -Wall -I"$FH_REPO/include" -I"$FH_REPO/ld-preload/include" -o "$CC_OUT/preload_rma" \
    "$src/preload_rma.c" "$src/../common/verbs_loopback.c" -L"$FH_BIN_DIR" -lfirehose -Wl,-rpath,"$FH_BIN_DIR" \
    -libverbs -ldl || { echo "cannot compile preload_rma.c"; exit 1; }

ROUNDS=${FH_TEST_ROUNDS:-6}
mpi() {
    timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 \
        -x FH_DEVICE="$FH_RDMA_DEV" -x FH_RDMA_DEV -x FH_GID_INDEX -x FH_IB_PORT "$@"
}
fails=0
echo "--- without the shim"
mpi setarch "$(uname -m)" -R "$CC_OUT/preload_rma" "$ROUNDS"
plain=$?
echo "--- with libfirehose_preload.so"
mpi -x LD_PRELOAD="$SHIM" -x FH_TEST_EXPECT_SHIM=1 setarch "$(uname -m)" -R "$CC_OUT/preload_rma" "$ROUNDS"
shim=$?
echo "--- with the shim and FH_TEST_NO_INVALIDATE=1: must fail"
# The failing rank writes its stale-pages line to a file (mpirun can drop its stderr).
faillog=$FH_TEST_DIR/noinv-fail.txt
rm -f "$faillog"
mpi -x LD_PRELOAD="$SHIM" -x FH_TEST_EXPECT_SHIM=1 -x FH_TEST_NO_INVALIDATE=1 -x FH_TEST_FAIL_LOG="$faillog" \
    setarch "$(uname -m)" -R "$CC_OUT/preload_rma" "$ROUNDS" > "$FH_TEST_DIR/noinv.log" 2>&1
noinv=$?
grep -E "FAILED|rank" "$FH_TEST_DIR/noinv.log" | head -5
cat "$faillog" 2>/dev/null
echo "without shim exit $plain, with shim exit $shim, FH_TEST_NO_INVALIDATE=1 exit $noinv (must not be 0)"
[ "$plain" = 0 ] || { echo "FAIL: the program fails even without the shim"; fails=$((fails + 1)); }
[ "$shim" = 0 ] || { echo "FAIL: fh_put/fh_get and plain verbs do not work together under the shim"; fails=$((fails + 1)); }
if [ "$noinv" = 0 ] || ! grep -q "^stale: " "$faillog" 2>/dev/null; then
    echo "FAIL: without invalidation the program did not fail: it cannot see stale registrations"
    fails=$((fails + 1))
fi
[ "$fails" = 0 ]
