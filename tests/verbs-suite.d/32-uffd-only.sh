# userfaultfd as the ONLY invalidation path (FH_MONITOR=uffd, libc entries not patched): the
# single-thread stale-registration cases (free+malloc, munmap/mremap/madvise then map again, old
# handle after reuse) must still never hand out a stale registration, proven with RDMA READ/WRITE.
# This guards `monitor::quiesce`: the kernel releases the unmapping thread as soon as the reader
# *reads* the event, before any listener heard of it; without the quiesce step in fh_register,
# verbs_case12 with FH_MONITOR=uffd was a STALE HIT in 5 of 5 runs here (with it, 0 of 5).
# (Across threads, uffd stays asynchronous: see the remaining windows in docs/guarantees.md.)
set -uo pipefail
. "$FH_REPO/scripts/lib/verbs-test.sh"
build=${FH_CTEST_BUILD:-$FH_REPO/build/native}
fails=0 runs=0
for t in verbs_case1_free_malloc verbs_case2_unmap verbs_case12_old_handle; do
    bin=$build/c_$t
    [ -x "$bin" ] || fh_skip_or_fail "$bin not built (cmake --build $build)"
    for i in 1 2 3; do
        runs=$((runs + 1))
        if out=$(FH_MONITOR=uffd FH_DEVICE=${FH_RDMA_DEV:-} timeout 300 "$bin" 2>&1); then
            echo "ok   $t (run $i, FH_MONITOR=uffd)"
        else
            fails=$((fails + 1))
            echo "FAIL $t (run $i, FH_MONITOR=uffd):"
            echo "$out" | tail -5
        fi
    done
done
echo "uffd-only: $((runs - fails)) of $runs runs passed"
[ "$fails" = 0 ]
