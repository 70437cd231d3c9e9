# VerbsLink (src/net/verbs) on the device: 4 ranks as threads of one process (tests/verbs, binary
# net-link): argument errors (BadRank, TooLong), a message storm among all pairs with every byte
# and the per-pair order checked (inline and copied sizes up to max_msg), wait timing out and
# waking, and a dropped rank reported PeerLost within seconds while the others keep talking.
# A small receive depth makes the test's credit window and the send-queue wrap matter. Then the
# same binary with FH_TEST_BREAK=1 must FAIL with a data mismatch, proving its byte check can fail.
set -uo pipefail
. "$FH_REPO/scripts/lib/verbs-test.sh"
bin=$(fh_require_bin net-link) || { rc=$?; echo "$bin"; exit "$rc"; }

export FH_AM_RECV_DEPTH=${FH_AM_RECV_DEPTH:-16} FH_AM_MAX_SIZE=${FH_AM_MAX_SIZE:-4096}
timeout 400 "$bin"
rc=$?
[ "$rc" = 0 ] || { echo "net-link exited $rc"; exit "$rc"; }

# Tiny slots: every message fits inline (max_msg 128 < the QP's inline limit), 4 slots per peer
# (test window 2, a signaled send every work request, the send queue wraps constantly).
FH_AM_RECV_DEPTH=4 FH_AM_MAX_SIZE=128 FH_TEST_MSGS=100 timeout 400 "$bin"
rc=$?
[ "$rc" = 0 ] || { echo "net-link (4 slots of 128 bytes) exited $rc"; exit "$rc"; }

out=$(FH_TEST_BREAK=1 FH_TEST_MSGS=10 timeout 300 "$bin" 2>&1)
brc=$?
echo "$out"
if [ "$brc" != 1 ] || ! grep -q "data mismatch: first bad offset" <<<"$out"; then
    echo "FH_TEST_BREAK=1 run exited $brc without reporting a data mismatch: the check cannot fail"
    exit 1
fi
echo "break-check run failed as it must"
