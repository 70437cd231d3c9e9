# shellcheck shell=bash
# Memory windows on the device (tests/verbs, binary rma-windows): 3 ranks as threads of one
# process, each with its own context, PD, QPs and Rma. Rank 1 puts 64 KiB into rank 0's buffer;
# rank 2 replays the key rank 1 was granted over its own connection to rank 0: with windows
# (FH_MW default auto; rxe binds type 2 windows) the device refuses it (remote access error) and
# rank 0's bytes are rank 1's. Then FH_MW=off (region keys, valid on every connection) must FAIL
# with the replay landing: the check can fail.
set -uo pipefail
. "$FH_REPO/scripts/lib/verbs-test.sh"
bin=$(fh_require_bin rma-windows) || { rc=$?; echo "$bin"; exit "$rc"; }

timeout 300 "$bin"
rc=$?
[ "$rc" = 0 ] || { echo "rma-windows exited $rc"; exit "$rc"; }
FH_MW=on timeout 300 "$bin"
rc=$?
[ "$rc" = 0 ] || { echo "rma-windows (FH_MW=on) exited $rc"; exit "$rc"; }

out=$(FH_MW=off timeout 300 "$bin" 2>&1)
brc=$?
echo "$out"
if [ "$brc" != 1 ] || ! grep -q "rank 2 replayed rank 1's key" <<<"$out"; then
    echo "FH_MW=off run exited $brc without the replay landing: the check cannot fail"
    exit 1
fi
echo "ok: FH_MW=off fails as it must"
