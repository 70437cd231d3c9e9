# shellcheck shell=bash
# The shim under a second MPI: MPICH 4 (Debian's `mpich`, ch4:ucx, hydra), 2 ranks on the device,
# launched by MPICH's own `mpiexec.mpich` (Open MPI stays the `mpirun` of every other test),
# UCX's registration cache off (UCX_IB_REG_METHODS=direct: every rendezvous message registers its
# user buffer with ibv_reg_mr, which the shim serves). c-tests/preload/preload_mpi_fresh.c built
# with mpicc.mpich sends from fresh malloc buffers (freed and reallocated, mostly at the same
# address) of 4 KiB (eager) to 1 MiB (rendezvous), every byte checked at the receiver. Without
# the shim, then with it: same result, and the FH_STATS summaries show cache hits, invalidations,
# and libucm's unmap events as a live source (MPICH's UCX patches libc; the shim subscribes).
# Then with UCX's cache and memory hooks on, with the shim: two caches stacked, still correct.
set -uo pipefail
. "$FH_REPO/scripts/lib/verbs-test.sh"
. "$FH_REPO/c-tests/preload/suite-lib.sh"
MPIEXEC=/usr/bin/mpiexec.mpich
MPICC=/usr/bin/mpicc.mpich
[ -x "$MPIEXEC" ] && [ -x "$MPICC" ] || fh_skip_or_fail "MPICH not installed ($MPIEXEC, $MPICC; scripts/install-deps --vm)"
preload_setup
"$MPICC" -O1 -o "$CC_OUT/preload_mpi_fresh_mpich" "$FH_REPO/c-tests/preload/preload_mpi_fresh.c" ||
    { echo "cannot compile preload_mpi_fresh.c with $MPICC"; exit 1; }
bin=$CC_OUT/preload_mpi_fresh_mpich

ITERS=${FH_MPI_ITERS:-24}
export FH_TEST_SIZES=262144,4096,1048576,65536
mpi=(timeout 300 "$MPIEXEC" -n 2 -genv UCX_NET_DEVICES "$FH_RDMA_DEV:$FH_IB_PORT"
     -genv UCX_TLS "rc_verbs,ud_verbs,self" -genv UCX_IB_GID_INDEX 0 -genv FH_TEST_SIZES "$FH_TEST_SIZES")
rcache_off=(-genv UCX_IB_REG_METHODS direct)
shim=(-genv LD_PRELOAD "$SHIM" -genv FH_STATS 1 -genv FH_MAX_PINNED 256M)

echo "--- MPICH: $(/usr/bin/mpichversion 2>/dev/null | grep -E 'Version|Device' | tr -s ' \t' ' ' | paste -sd';')"
echo "--- without the shim (UCX rcache off)"
"${mpi[@]}" "${rcache_off[@]}" "$bin" "$ITERS"
plain=$?
echo "--- with the shim (UCX rcache off)"
stats=$FH_TEST_DIR/stats-mpich.txt
rm -f "$stats"
"${mpi[@]}" "${rcache_off[@]}" "${shim[@]}" -genv FH_STATS_FILE "$stats" "$bin" "$ITERS" 2>&1 |
    tee "$FH_TEST_DIR/mpich-shim.log"
withshim=${PIPESTATUS[0]}
cat "$stats" 2>/dev/null
echo "--- with the shim, UCX rcache and memory hooks on (two caches stacked)"
stats2=$FH_TEST_DIR/stats-mpich-rcache.txt
rm -f "$stats2"
"${mpi[@]}" "${shim[@]}" -genv FH_STATS_FILE "$stats2" "$bin" "$ITERS" 2>&1 | tail -3
stacked=${PIPESTATUS[0]}
cat "$stats2" 2>/dev/null
echo "MPICH: without shim exit $plain, with shim exit $withshim, stacked exit $stacked"
[ "$plain" = 0 ] || { echo "FAIL: the MPICH program fails even without the shim"; exit 1; }
[ "$withshim" = 0 ] || { echo "FAIL: wrong bytes or a crash under the shim (MPICH)"; exit 1; }
[ "$stacked" = 0 ] || { echo "FAIL: wrong bytes or a crash under the shim with UCX's cache on (MPICH)"; exit 1; }
grep -q "mpi-fresh: $ITERS iterations, 0 bad bytes" "$FH_TEST_DIR/mpich-shim.log" ||
    { echo "FAIL: the receiver did not report a clean run under the shim"; exit 1; }
grep -qE 'cache: +[1-9][0-9]* hits' "$stats" || { echo "FAIL: no rank reported cache hits under MPICH"; exit 1; }
grep -qE '[1-9][0-9]* invalidations' "$stats" || { echo "FAIL: no rank reported invalidations under MPICH"; exit 1; }
echo "ok: MPICH + UCX under the shim: every byte right, cache hits, invalidations"
