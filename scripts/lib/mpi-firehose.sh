# shellcheck shell=bash
# Build and launch MPI programs that link libfirehose (c-tests/mpi/*.c), for the verbs suite and
# scripts/bench-attentive. Sourced after scripts/lib/verbs-test.sh (FH_REPO, FH_BIN_DIR,
# FH_TEST_DIR, FH_RDMA_DEV).

# mpi_fh_cc NAME: build c-tests/mpi/NAME.c with mpicc into $FH_TEST_DIR/NAME. cargo writes only
# libfirehose.so, while a linked program asks for its SONAME (libfirehose.so.0): the link points
# there from a private directory, so nothing in the source tree is touched.
mpi_fh_cc() {
    local lib=$FH_TEST_DIR/fh-lib
    mkdir -p "$lib"
    ln -sf "$FH_BIN_DIR/libfirehose.so" "$lib/libfirehose.so.0"
    ln -sf "$FH_BIN_DIR/libfirehose.so" "$lib/libfirehose.so"
    mpicc -O2 -g -Wall -o "$FH_TEST_DIR/$1" "$FH_REPO/c-tests/mpi/$1.c" -I"$FH_REPO/include" \
        -L"$lib" -lfirehose -Wl,-rpath,"$lib" || { echo "cannot compile c-tests/mpi/$1.c"; exit 1; }
}

# mpi_fh_run NP CMD...: Open MPI's mpirun, under `timeout ${MPI_FH_TIMEOUT:-300}`, with the device
# settings passed on and nothing else of ours: the job runs with the library's defaults unless the
# caller exported FH_* it names in MPI_FH_PASS (space-separated).
mpi_fh_run() {
    local np=$1
    shift
    local pass=(-x FH_DEVICE="$FH_RDMA_DEV" -x FH_GID_INDEX -x FH_IB_PORT)
    local v
    for v in ${MPI_FH_PASS:-}; do pass+=(-x "$v"); done
    timeout "${MPI_FH_TIMEOUT:-300}" mpirun --allow-run-as-root --oversubscribe -np "$np" \
        "${pass[@]}" "$@"
}
