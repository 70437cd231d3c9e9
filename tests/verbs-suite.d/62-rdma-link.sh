# One-sided RDMA through VerbsLink (Link::rdma, RdmaDone) on the device: 5 ranks as threads of one
# process (tests/verbs, binary rdma-link), regions swapped through the bootstrap allgather:
# refused arguments (zero length, too long, wrapping, own/out-of-range rank); random WRITEs and
# READs of 1 B..32 KiB at random offsets to every peer, batches overfilling the send queue (every
# other round through Link::rdma_batch, runs of up to 20 ops to one peer: chains split and wait
# for room), every token reported once and every READ byte checked; a refused batch (one
# zero-length op) posts nothing; a final fill checked byte by byte at each
# target; write-then-send ordering (the notify never overtakes its write); and remote access
# errors (another PD's rkey, a range past the end, a garbage-rkey READ) to a dedicated fifth rank:
# RemoteAccess, the op behind it flushed, PeerLost once, within seconds, while a fourth
# connection to that rank keeps working. Then FH_TEST_BREAK=1 must FAIL with a data mismatch.
set -uo pipefail
. "$FH_REPO/scripts/lib/verbs-test.sh"
bin=$(fh_require_bin rdma-link) || { rc=$?; echo "$bin"; exit "$rc"; }

# 16 send-queue entries per peer: a batch of 48 random ops to 3 peers fills them.
export FH_AM_RECV_DEPTH=${FH_AM_RECV_DEPTH:-16} FH_AM_MAX_SIZE=${FH_AM_MAX_SIZE:-4096}
timeout 600 "$bin"
rc=$?
[ "$rc" = 0 ] || { echo "rdma-link exited $rc"; exit "$rc"; }

# 4 entries per peer: almost every op waits for room, sharing the queue with the notifies.
FH_AM_RECV_DEPTH=4 FH_TEST_ROUNDS=4 timeout 600 "$bin"
rc=$?
[ "$rc" = 0 ] || { echo "rdma-link (4 send-queue entries) exited $rc"; exit "$rc"; }

out=$(FH_TEST_BREAK=1 FH_TEST_ROUNDS=2 timeout 300 "$bin" 2>&1)
brc=$?
echo "$out"
if [ "$brc" != 1 ] || ! grep -q "data mismatch: first bad offset" <<<"$out"; then
    echo "FH_TEST_BREAK=1 run exited $brc without reporting a data mismatch: the check cannot fail"
    exit 1
fi
echo "break-check run failed as it must"
