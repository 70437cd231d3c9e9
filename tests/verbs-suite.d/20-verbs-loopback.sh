# Real-verbs loopback through the project's VerbsPinner (tests/verbs, binary verbs-loopback): two RC
# QPs on one port, RDMA WRITE / RDMA READ / SEND-RECV of 64 KiB with every byte checked, and an RDMA
# WRITE into a registration without remote-write rights that must be refused. Then the same binary
# with FH_TEST_BREAK=1 must FAIL with a data mismatch, proving its byte check can fail.
set -uo pipefail
. "$FH_REPO/scripts/lib/verbs-test.sh"
bin=$(fh_require_bin verbs-loopback) || { rc=$?; echo "$bin"; exit "$rc"; }

timeout 300 "$bin"
rc=$?
[ "$rc" = 0 ] || { echo "verbs-loopback exited $rc"; exit "$rc"; }

out=$(FH_TEST_BREAK=1 timeout 300 "$bin" 2>&1)
brc=$?
echo "$out"
if [ "$brc" != 1 ] || ! grep -q "data mismatch: first bad offset" <<<"$out"; then
    echo "FH_TEST_BREAK=1 run exited $brc without reporting a data mismatch: the check cannot fail"
    exit 1
fi
echo "break-check run failed as it must"
