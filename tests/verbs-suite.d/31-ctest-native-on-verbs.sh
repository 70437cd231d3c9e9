# The native "cases that broke real caches" C tests (c-tests/case*.c) again, with their caches on
# the verbs backend (FH_CASE_BACKEND=verbs: case_cache() in c-tests/case_util.h opens the device and
# pins with real ibv_reg_mr), so their counter checks (miss after every unmap path, invalidations,
# in-use handles, evict-and-retry on RLIMIT_MEMLOCK) hold with real pinning too. A variable of its
# own: ctest sets FH_BACKEND=mlock for native tests. Only case* tests: the others build their cache
# with fh_test_cache(), which is always mlock, so running them here would only repeat them.
#
# Excluded, and why:
#   case4_reentrancy  sized for mlock speed: 8 threads x 1500 registrations of up to 1 MiB, nearly all
#                     misses; with ibv_reg_mr under TCG it does not finish within its own 100 s
#                     watchdog (seen here: every worker past 500/1500 when the watchdog fired, i.e.
#                     slow, not hung). What it tests (hooks entered from inside free) does not
#                     depend on the backend.
#   case6_threads     its stale-hit detector assumes the mlock backend's fresh key per pin (the key
#                     names one pin of one set of pages, used as an index below 2^20); verbs lkeys are
#                     provider-chosen and recycled, so a repeated key proves nothing. Also 16 threads x
#                     600 real registrations exceed its 110 s watchdog under TCG.
#   case6_stale_threads_shared*  one cache for every thread: stale is told by the mlock backend's
#                     keys, which grow with every pin; verbs keys are not ordered, so on this backend
#                     the shared run checks nothing (and its must-fail twin cannot fail).
#   case6_stale_threads_helper  its judgement of a helper's pins ahead (stale_threads.h,
#                     st_helper_mode) reads mlock keys too; on verbs it would judge a helper's
#                     correct prefetch as stale and its unpin ahead as "not primed" (seen: 3 of
#                     24 rounds). Helpers on verbs are tested by 55-preload-helper.
#   case6_stale_threads_mustfail_uffd_heap  must find a heap chunk whose pages went by brk (only
#                     userfaultfd sees that): on verbs libc's trim drops pinned pages with madvise
#                     first (the patch sees it), so brk-only rounds are rare, and 4 threads x 8
#                     rounds here found none in one CI run (27 rounds). It runs natively (mlock,
#                     where madvise cannot drop locked pages), at 16 threads.
# Then proof that the checks still bite on this backend: case2_munmap with FH_MONITOR=none (no
# invalidation at all) must FAIL with a stale hit.
#
# FH_CTEST_BUILD picks the CMake build tree (default build/native); ctest runs from a copy of its
# CTestTestfile.cmake in the scratch dir (the guest sees the tree read-only), see 30-ctest-verbs.sh.
set -uo pipefail
. "$FH_REPO/scripts/lib/verbs-test.sh"
build=${FH_CTEST_BUILD:-$FH_REPO/build/native}
[ -f "$build/CTestTestfile.cmake" ] || fh_skip_or_fail "$build is not a CMake build tree (cmake -S . -B $build && cmake --build $build)"
[ -x "$build/c_case2_munmap" ] || fh_skip_or_fail "$build/c_case2_munmap not built"
fh_require_cmd ctest
export FH_DEVICE=${FH_RDMA_DEV:-} FH_CASE_BACKEND=verbs

# The variable must reach the cache: case_cache() says which backend it opened.
out=$(timeout 300 "$build/c_case2_munmap" 2>&1)
rc=$?
echo "$out"
[ "$rc" = 0 ] || { echo "case2_munmap on the verbs backend exited $rc"; exit 1; }
grep -q '(case_cache: verbs backend)' <<<"$out" || { echo "FH_CASE_BACKEND=verbs did not reach case_cache()"; exit 1; }

work=$FH_TEST_DIR/ctest-native-on-verbs
mkdir -p "$work"
cp "$build/CTestTestfile.cmake" "$work/"
out=$(cd "$work" && timeout 1200 ctest --test-dir "$work" -L native -R '^case' \
    -E '^(case4_reentrancy|case6_threads|case6_stale_threads_shared.*|case6_stale_threads_helper|case6_stale_threads_mustfail_uffd_heap)$' --output-on-failure 2>&1)
rc=$?
echo "$out"
[ "$rc" = 0 ] || { echo "ctest -L native (FH_CASE_BACKEND=verbs) exited $rc"; exit 1; }
if grep -q '(Skipped)' <<<"$out"; then
    echo "some native case tests skipped on the verbs backend although ${FH_RDMA_DEV:-?} exists"
    exit 1
fi
grep -qE '100% tests passed, 0 tests failed out of [1-9]' <<<"$out" || { echo "ctest ran no case test"; exit 1; }

# The same checks must fail when nothing invalidates: a stale hit on real MRs.
out=$(FH_MONITOR=none timeout 300 "$build/c_case2_munmap" 2>&1)
brc=$?
echo "$out"
if [ "$brc" = 0 ] || ! grep -q 'STALE HIT' <<<"$out"; then
    echo "case2_munmap with FH_MONITOR=none exited $brc without a stale hit: the check cannot fail"
    exit 1
fi
echo "ctest -L native case tests on the verbs backend: all passed on ${FH_RDMA_DEV:-?}; FH_MONITOR=none run failed as it must"
