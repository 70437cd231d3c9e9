# perftest sanity: an RDMA WRITE bandwidth run between two processes over the device. Proves the test
# bed itself works (device, GID, RC QP, MR registration, out-of-band exchange) before our own tests run.
# Server and client must both exit 0 and the client must report a positive average bandwidth for
# exactly the size and iteration count asked for.
set -uo pipefail
# shellcheck source=scripts/lib/verbs-test.sh
. "$FH_REPO/scripts/lib/verbs-test.sh"
fh_require_cmd ib_write_bw

SIZE=65536
ITERS=${FH_PERFTEST_ITERS:-200}
PORT=18515
args=(-d "$FH_RDMA_DEV" -i "$FH_IB_PORT" -x "$FH_GID_INDEX" -s "$SIZE" -n "$ITERS" -p "$PORT")

# attempt N: one server + client run; returns 0 on success, 2 on perftest's clock check failing.
attempt() {
    local n=$1 srv=$FH_TEST_DIR/server.$1.log cli=$FH_TEST_DIR/client.$1.log spid src crc
    timeout 300 ib_write_bw "${args[@]}" > "$srv" 2>&1 &
    spid=$!
    if ! fh_wait_listen "$PORT" "$spid"; then
        echo "attempt $n: server never listened on $PORT"; cat "$srv"
        kill "$spid" 2>/dev/null; wait "$spid"
        return 1
    fi
    timeout 300 ib_write_bw "${args[@]}" "$FH_SERVER_ADDR" > "$cli" 2>&1
    crc=$?
    wait "$spid"
    src=$?
    echo "attempt $n: server exit $src, client exit $crc"
    echo "--- client"; cat "$cli"; echo "--- server"; cat "$srv"
    # Under TCG perftest's CPU clock calibration sometimes fails its own r^2 check: a test-bed
    # artefact, not a verbs failure, so it earns a retry.
    if grep -q "Correlation coefficient" "$cli" "$srv"; then return 2; fi
    [ "$src" = 0 ] && [ "$crc" = 0 ] || return 1
    # The result row: "#bytes #iterations BW-peak BW-average MsgRate"; the average must be a positive number.
    awk -v s="$SIZE" -v n="$ITERS" '
        $1 == s && $2 == n && $4 ~ /^[0-9]+(\.[0-9]+)?$/ && $4 + 0 > 0 { ok = 1; print "BW average " $4 " MB/s" }
        END { exit !ok }' "$cli" || { echo "no numeric BW row for $SIZE bytes x $ITERS in the client output"; return 1; }
}

# The clock check fails in maybe one run in five under TCG (r^2 just under 0.9): up to two retries,
# for that message only, keep a CI run from flaking on it; any other failure fails at once.
for n in 1 2 3; do
    attempt "$n"
    rc=$?
    [ "$rc" = 2 ] || break
    echo "perftest clock check failed (TCG artefact)"
done
exit "$rc"
