# shellcheck shell=bash
# Rights per operation and the exposure policy under mpirun with 2 ranks
# (c-tests/mpi/rma_expose.c): fh_get from a peer's PROT_READ mapping and from a read-only file
# mapping, fh_put from a read-only buffer (8 B .. 4 MiB); a put or get aimed at the peer's own
# link buffers (its AM receive ring) is FH_ERR_REMOTE_DENIED in both modes; with
# FH_EXPOSE=declared, what the target did not expose (or exposed without the access) is denied and
# unchanged, and fh_unexpose revokes what the initiator held; ranks that disagree on FH_EXPOSE fail
# at fh_init.
set -uo pipefail
. "$FH_REPO/scripts/lib/verbs-test.sh"
. "$FH_REPO/scripts/lib/mpi-firehose.sh"
fh_require_cmd mpirun
fh_require_cmd mpicc
mpi_fh_cc rma_expose
unset FH_EXPOSE

fails=0
echo "--- FH_EXPOSE unset (all): rights, the library's buffers"
mpi_fh_run 2 "$FH_TEST_DIR/rma_expose" all || { echo "FAIL: all"; fails=$((fails + 1)); }

echo "--- FH_EXPOSE=declared"
FH_EXPOSE=declared MPI_FH_PASS="FH_EXPOSE" mpi_fh_run 2 "$FH_TEST_DIR/rma_expose" declared ||
    { echo "FAIL: declared"; fails=$((fails + 1)); }

echo "--- FH_EXPOSE=declared on rank 0 only: fh_init must fail on both"
# shellcheck disable=SC2016
mpi_fh_run 2 sh -c '[ "${OMPI_COMM_WORLD_RANK:-0}" = 0 ] && export FH_EXPOSE=declared; exec "$0" agree' \
    "$FH_TEST_DIR/rma_expose" || { echo "FAIL: agree"; fails=$((fails + 1)); }

# Known gaps, run and shown but not counted (docs/guarantees.md, "Rights and exposure"): on rxe a get from a
# read-only MAP_SHARED file mapping fails with "not mapped (or not pinnable)", and so does a 1 MiB
# get of a whole read-only 1 MiB mapping (in declared mode: denied), which the simulated link
# passes. Their output says whether they still fail.
echo "--- known gaps (not counted)"
FH_TEST_KNOWN_GAPS=1 MPI_FH_PASS="FH_TEST_KNOWN_GAPS" mpi_fh_run 2 "$FH_TEST_DIR/rma_expose" all 2>&1 |
    grep -E "FAIL|rma_expose" | head -12
echo "rma-expose: $fails failure(s)"
[ "$fails" = 0 ]
