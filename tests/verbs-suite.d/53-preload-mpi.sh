# shellcheck shell=bash
# Open MPI over UCX, 2 ranks on the device, UCX's own registration cache off
# (UCX_IB_REG_METHODS=direct): c-tests/preload/preload_mpi_fresh.c sends from fresh malloc buffers
# (freed and reallocated at the same address) and checks every byte, without and with
# libfirehose_preload.so. Under mpirun UCX loads libibverbs with RTLD_LOCAL: the shim must still
# resolve the real functions (a shim trusting dlsym(RTLD_NEXT) crashes here). With the shim, rank
# FH_STATS summaries must show cache hits (each buffer carries three messages) and invalidations
# (each buffer is freed). FH_MAX_PINNED is raised: the default (75 % of RLIMIT_MEMLOCK, 8 MiB in
# the guest) is mostly taken by UCX's own long-lived registrations, leaving no room to keep any.
# Coexistence: Open MPI must not warn "UCX is unable to handle VM_UNMAP event" (its own memory
# hooks stop seeing unmaps if our monitor overwrites libc's entries; ld-preload/src/coexist.rs).
set -uo pipefail
. "$FH_REPO/scripts/lib/verbs-test.sh"
. "$FH_REPO/c-tests/preload/suite-lib.sh"
fh_require_cmd mpirun
fh_require_cmd mpicc
preload_setup
mpicc -O1 -o "$CC_OUT/preload_mpi_fresh" "$FH_REPO/c-tests/preload/preload_mpi_fresh.c" ||
    { echo "cannot compile preload_mpi_fresh.c"; exit 1; }

ITERS=${FH_MPI_ITERS:-20}
mpi=(mpirun --allow-run-as-root --oversubscribe -np 2 --mca pml ucx --mca osc ^ucx --mca btl "^openib,ofi"
     -x UCX_NET_DEVICES="$FH_RDMA_DEV:$FH_IB_PORT" -x "UCX_TLS=rc_verbs,ud_verbs,self" -x UCX_IB_GID_INDEX=0
     -x UCX_IB_REG_METHODS=direct)

now() { date +%s.%N; }
echo "--- without the shim"
t0=$(now)
timeout 300 "${mpi[@]}" "$CC_OUT/preload_mpi_fresh" "$ITERS"
plain=$?
t1=$(now)
echo "--- with the shim"
stats=$FH_TEST_DIR/stats.txt
rm -f "$stats"
timeout 300 "${mpi[@]}" -x LD_PRELOAD="$SHIM" -x FH_STATS=1 -x FH_STATS_FILE="$stats" \
    -x FH_MAX_PINNED=256M "$CC_OUT/preload_mpi_fresh" "$ITERS" 2>&1 | tee "$FH_TEST_DIR/shim.log"
shim=${PIPESTATUS[0]}
t2=$(now)
# Informational (TCG: only the ratio within one boot means anything; includes MPI start-up).
awk -v a="$t0" -v b="$t1" -v c="$t2" 'BEGIN { printf "wall time: %.1f s without the shim, %.1f s with it\n", b - a, c - b }'
cat "$stats" 2>/dev/null
if grep -q "unable to handle VM_UNMAP" "$FH_TEST_DIR/shim.log"; then
    echo "FAIL: Open MPI/UCX memory hooks disturbed under the shim"
    exit 1
fi
echo "without shim exit $plain, with shim exit $shim"
[ "$plain" = 0 ] || { echo "FAIL: the MPI program fails even without the shim"; exit 1; }
[ "$shim" = 0 ] || { echo "FAIL: wrong bytes or a crash under the shim"; exit 1; }
grep -qE 'cache: +[1-9][0-9]* hits' "$stats" || { echo "FAIL: no rank reported cache hits"; exit 1; }
grep -qE '[1-9][0-9]* invalidations' "$stats" || { echo "FAIL: no rank reported invalidations"; exit 1; }
