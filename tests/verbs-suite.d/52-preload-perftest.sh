# shellcheck shell=bash
# perftest's ib_write_bw, unchanged, with both sides under libfirehose_preload.so: both exit 0, the
# client reports a positive average bandwidth, and each side's FH_STATS summary shows the shim
# served its registration.
set -uo pipefail
. "$FH_REPO/scripts/lib/verbs-test.sh"
. "$FH_REPO/c-tests/preload/suite-lib.sh"
fh_require_cmd ib_write_bw
preload_setup

SIZE=65536
ITERS=${FH_PERFTEST_ITERS:-200}
PORT=18517
args=(-d "$FH_RDMA_DEV" -i "$FH_IB_PORT" -x "$FH_GID_INDEX" -s "$SIZE" -n "$ITERS" -p "$PORT")

attempt() {
    local n=$1 srv=$FH_TEST_DIR/server.$1.log cli=$FH_TEST_DIR/client.$1.log spid src crc
    rm -f "$FH_TEST_DIR"/stats.*
    FH_STATS=1 FH_STATS_FILE=$FH_TEST_DIR/stats.server under_shim timeout 300 ib_write_bw "${args[@]}" > "$srv" 2>&1 &
    spid=$!
    if ! fh_wait_listen "$PORT" "$spid"; then
        echo "attempt $n: server never listened"; cat "$srv"; kill "$spid" 2>/dev/null; wait "$spid"; return 1
    fi
    FH_STATS=1 FH_STATS_FILE=$FH_TEST_DIR/stats.client under_shim timeout 300 ib_write_bw "${args[@]}" "$FH_SERVER_ADDR" > "$cli" 2>&1
    crc=$?
    wait "$spid"; src=$?
    echo "attempt $n: server exit $src, client exit $crc"
    echo "--- client"; cat "$cli"; echo "--- server"; cat "$srv"
    echo "--- stats"; cat "$FH_TEST_DIR"/stats.* 2>/dev/null
    if grep -q "Correlation coefficient" "$cli" "$srv"; then return 2; fi
    [ "$src" = 0 ] && [ "$crc" = 0 ] || return 1
    awk -v s="$SIZE" -v n="$ITERS" '$1 == s && $2 == n && $4 + 0 > 0 { ok = 1 } END { exit !ok }' "$cli" ||
        { echo "no positive BW row"; return 1; }
    for side in server client; do
        grep -qE 'registrations: +[1-9][0-9]* app calls' "$FH_TEST_DIR/stats.$side" ||
            { echo "$side: the shim saw no registration"; return 1; }
    done
}

attempt 1; rc=$?
if [ "$rc" = 2 ]; then echo "perftest clock check failed (TCG); retrying once"; attempt 2; rc=$?; fi
exit "$rc"
