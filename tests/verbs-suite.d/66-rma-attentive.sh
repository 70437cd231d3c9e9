# shellcheck shell=bash
# fh_put / fh_get next to MPI with the default settings (c-tests/mpi/rma_attentive.c) under mpirun
# with 4 ranks: a ring of puts where each rank enters MPI_Barrier right after its own put, and a
# rank that computes for 2 s while its peers put to it and get from it; both must complete, every
# byte checked; a loop of blocking puts on every rank during which its progress thread must stay
# asleep (the waiting caller reaps its own completions); and a stream of 64 KiB puts whose
# completions the thread must leave to the caller (mostly inside its posts, not in a wait). Then
# with FH_PROGRESS_THREAD=0 (nobody answers a rank sitting in MPI): the job must FAIL, and within
# the wait bound (FH_AM_TIMEOUT_MS=5000), not hang.
set -uo pipefail
. "$FH_REPO/scripts/lib/verbs-test.sh"
. "$FH_REPO/scripts/lib/mpi-firehose.sh"
fh_require_cmd mpirun
fh_require_cmd mpicc
mpi_fh_cc rma_attentive
unset FH_PROGRESS_THREAD FH_AM_TIMEOUT_MS

fails=0
echo "--- 4 ranks, default settings"
t0=$SECONDS
mpi_fh_run 4 "$FH_TEST_DIR/rma_attentive"; rc=$?
echo "exit $rc after $((SECONDS - t0)) s"
[ "$rc" = 0 ] || { echo "FAIL: the default settings did not carry puts to ranks inside MPI"; fails=$((fails + 1)); }

echo "--- 4 ranks, FH_PROGRESS_THREAD=0, FH_AM_TIMEOUT_MS=5000: must fail, bounded"
t0=$SECONDS
FH_PROGRESS_THREAD=0 FH_AM_TIMEOUT_MS=5000 MPI_FH_PASS="FH_PROGRESS_THREAD FH_AM_TIMEOUT_MS" \
    mpi_fh_run 4 "$FH_TEST_DIR/rma_attentive" 2>&1 | tail -8
rc=${PIPESTATUS[0]}
echo "exit $rc after $((SECONDS - t0)) s"
if [ "$rc" = 0 ]; then
    echo "FAIL: without a progress thread the job passed: the test cannot see the deadlock"
    fails=$((fails + 1))
elif [ "$rc" = 124 ]; then
    echo "FAIL: without a progress thread the job hung until the 300 s timeout (waits must be bounded)"
    fails=$((fails + 1))
fi
echo "rma-attentive: $fails failure(s)"
[ "$fails" = 0 ]
