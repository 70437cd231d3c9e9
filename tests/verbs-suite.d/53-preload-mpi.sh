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
# Then the same program with UCX's registration cache and memory hooks left ON (no
# UCX_IB_REG_METHODS=direct), without and with the shim: every byte must still be right and the
# warning must stay away. Wall times and with/without ratios are printed for both configurations
# (informational: TCG, one boot, includes MPI start-up).
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
     -x UCX_NET_DEVICES="$FH_RDMA_DEV:$FH_IB_PORT" -x "UCX_TLS=rc_verbs,ud_verbs,self" -x UCX_IB_GID_INDEX=0)
# UCX's rcache off: every rendezvous message registers its user buffer (what the shim serves).
rcache_off=(-x UCX_IB_REG_METHODS=direct)

now() { date +%s.%N; }
echo "--- without the shim"
t0=$(now)
timeout 300 "${mpi[@]}" "${rcache_off[@]}" "$CC_OUT/preload_mpi_fresh" "$ITERS"
plain=$?
t1=$(now)
echo "--- with the shim"
stats=$FH_TEST_DIR/stats.txt
rm -f "$stats"
timeout 300 "${mpi[@]}" "${rcache_off[@]}" -x LD_PRELOAD="$SHIM" -x FH_STATS=1 -x FH_STATS_FILE="$stats" \
    -x FH_MAX_PINNED=256M "$CC_OUT/preload_mpi_fresh" "$ITERS" 2>&1 | tee "$FH_TEST_DIR/shim.log"
shim=${PIPESTATUS[0]}
t2=$(now)
# Informational (TCG: only the ratio within one boot means anything; includes MPI start-up).
walls() {
    awk -v a="$1" -v b="$2" -v c="$3" -v what="$4" 'BEGIN {
        printf "wall time (%s): %.1f s without the shim, %.1f s with it, ratio with/without %.2f\n",
            what, b - a, c - b, (c - b) / (b - a) }'
}
walls "$t0" "$t1" "$t2" "UCX rcache off" | tee "$FH_TEST_DIR/ratio.txt"
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
echo "--- UCX rcache and memory hooks ON, without the shim"
t3=$(now)
timeout 300 "${mpi[@]}" "$CC_OUT/preload_mpi_fresh" "$ITERS"
rc_plain=$?
t4=$(now)
echo "--- UCX rcache and memory hooks ON, with the shim"
rc_stats=$FH_TEST_DIR/stats-rcache.txt
rm -f "$rc_stats"
timeout 300 "${mpi[@]}" -x LD_PRELOAD="$SHIM" -x FH_STATS=1 -x FH_STATS_FILE="$rc_stats" \
    -x FH_MAX_PINNED=256M "$CC_OUT/preload_mpi_fresh" "$ITERS" 2>&1 | tee "$FH_TEST_DIR/shim-rcache.log"
rc_shim=${PIPESTATUS[0]}
t5=$(now)
walls "$t3" "$t4" "$t5" "UCX rcache on" | tee -a "$FH_TEST_DIR/ratio.txt"
cat "$rc_stats" 2>/dev/null
echo "UCX rcache on: without shim exit $rc_plain, with shim exit $rc_shim"
[ "$rc_plain" = 0 ] || { echo "FAIL: the MPI program fails with UCX's rcache even without the shim"; exit 1; }
[ "$rc_shim" = 0 ] || { echo "FAIL: wrong bytes or a crash under the shim with UCX's rcache on"; exit 1; }
if grep -q "unable to handle VM_UNMAP" "$FH_TEST_DIR/shim-rcache.log"; then
    echo "FAIL: Open MPI/UCX memory hooks disturbed under the shim (rcache on)"
    exit 1
fi

# Without userfaultfd (as under a seccomp profile that refuses it), the shim must still cache and
# stay correct: the unmaps come from the library that owns libc's entries (libucm's VM_UNMAPPED
# events, ld-preload/src/foreign_events.rs), synchronously. With that subscription off too, the
# shim sees nothing of free's unmaps and must pass everything through (no hits): the hits of the
# first run come from the subscription.
for mode in uffd uffd,foreign; do
    echo "--- UCX rcache off, with the shim, FH_TEST_DISABLE_HOOKS=$mode"
    st=$FH_TEST_DIR/stats-$mode.txt
    rm -f "$st"
    timeout 300 "${mpi[@]}" "${rcache_off[@]}" -x LD_PRELOAD="$SHIM" -x FH_STATS=1 -x FH_STATS_FILE="$st" \
        -x FH_MAX_PINNED=256M -x FH_TEST_DISABLE_HOOKS="$mode" "$CC_OUT/preload_mpi_fresh" "$ITERS" 2>&1 |
        tee "$FH_TEST_DIR/shim-$mode.log" | tail -5
    rc=${PIPESTATUS[0]}
    cat "$st" 2>/dev/null
    [ "$rc" = 0 ] || { echo "FAIL: wrong bytes or a crash under the shim (FH_TEST_DISABLE_HOOKS=$mode)"; exit 1; }
    if [ "$mode" = uffd ]; then
        grep -q "subscribed to UCX libucm VM_UNMAPPED" "$st" || { echo "FAIL: the shim did not subscribe to libucm's events"; exit 1; }
        grep -qE 'cache: +[1-9][0-9]* hits' "$st" || { echo "FAIL: no cache hits with libucm's events as the only source"; exit 1; }
        grep -qE '[1-9][0-9]* invalidations' "$st" || { echo "FAIL: no invalidations from libucm's events"; exit 1; }
    elif grep -qE 'cache: +[1-9][0-9]* hits' "$st"; then
        echo "FAIL: hits with no event source at all: the shim cached what nobody invalidates"
        exit 1
    fi
done
echo "preload-mpi: libucm's events carry invalidation when userfaultfd is off"
