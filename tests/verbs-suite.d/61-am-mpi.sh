# shellcheck shell=bash
# Active messages between processes under mpirun (PMIx bootstrap, verbs RC link, the AM layer;
# tests/verbs/src/bin/am-mpi.rs): request/reply storms with every payload checked and one-way
# floods, at 2 and 4 ranks (with and without a progress thread); a rank sending garbage through
# the raw link (every rank it sent to counts exactly those rejections and keeps working); a rank
# leaving early without a goodbye (4 ranks) and with one (2 ranks): the others get
# FH_ERR_PEER_LOST, not a hang. Then FH_TEST_BREAK=1 (rank 0 corrupts one reply) must fail.
set -uo pipefail
. "$FH_REPO/scripts/lib/verbs-test.sh"
fh_require_cmd mpirun
bin=$(fh_require_bin am-mpi) || { rc=$?; echo "$bin"; exit "$rc"; }

mpi() {
    local n=$1
    shift
    timeout 300 mpirun --allow-run-as-root --oversubscribe -np "$n" \
        -x FH_DEVICE="$FH_RDMA_DEV" -x FH_GID_INDEX -x FH_IB_PORT -x FH_TEST_REQS -x FH_TEST_THREADS \
        -x FH_PROGRESS_THREAD -x FH_TEST_BREAK -x FH_AM_RECV_DEPTH -x FH_TEST_FAIL_LOG "$@"
}
export FH_TEST_REQS=${FH_TEST_REQS:-150} FH_TEST_THREADS=${FH_TEST_THREADS:-2}
export FH_PROGRESS_THREAD=0 FH_TEST_BREAK= FH_AM_RECV_DEPTH=32 FH_TEST_FAIL_LOG=
fails=0
run() {
    local what=$1
    shift
    echo "--- $what"
    if "$@"; then echo "ok: $what"; else echo "FAILED: $what (exit $?)"; fails=$((fails + 1)); fi
}
run "storm, 2 ranks" mpi 2 "$bin" storm
run "storm, 4 ranks" mpi 4 "$bin" storm
FH_PROGRESS_THREAD=1 run "storm, 4 ranks, progress threads" mpi 4 "$bin" storm
FH_AM_RECV_DEPTH=6 run "storm, 4 ranks, 6 receive slots (credits run out)" mpi 4 "$bin" storm
run "garbage from rank 1, 4 ranks" mpi 4 "$bin" garbage
run "garbage from rank 1, 2 ranks" mpi 2 "$bin" garbage
run "rank 3 leaves without goodbye, 4 ranks" mpi 4 "$bin" exit-silent
run "rank 1 leaves with goodbye, 2 ranks" mpi 2 "$bin" exit-bye

echo "--- FH_TEST_BREAK=1: must fail"
# The failing rank also writes its FAIL line to a file: mpirun can kill the job before it has
# forwarded that rank's stderr.
faillog=$(mktemp)
out=$(FH_TEST_BREAK=1 FH_TEST_FAIL_LOG=$faillog mpi 2 "$bin" storm 2>&1)
brc=$?
echo "$out" | tail -5
echo "failure log:"
cat "$faillog"
if [ "$brc" = 0 ] || ! grep -q "FAIL: .*reply from 0 .* differs" "$faillog"; then
    echo "FH_TEST_BREAK=1 exited $brc without a reply mismatch: the check cannot fail"
    echo "$out"
    fails=$((fails + 1))
fi
rm -f "$faillog"
[ "$fails" = 0 ] || { echo "$fails am-mpi runs failed"; exit 1; }
