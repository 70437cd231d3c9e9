# The C tests labelled `verbs` (c-tests/verbs_*.c: free+malloc, unmap paths, access rights, old
# handle after reuse, caller PD, uncached registrations when the bounds leave no room) on the real
# device, through ctest. One suite test: it passes only
# if ctest passes and none of them skipped (here a device exists, so a skip means nothing ran).
# Each ctest test shows up in this test's log as ctest's own `N/M Test #k: name ... Passed` line.
#
# The host's test command builds build/native before the verbs step; FH_CTEST_BUILD picks another
# CMake build tree. The guest sees the tree read-only and ctest writes Testing/ next to the
# CTestTestfile it runs, so the (self-contained, absolute-path) CTestTestfile.cmake is copied to
# the scratch dir and ctest runs there; the binaries are used in place.
set -uo pipefail
. "$FH_REPO/scripts/lib/verbs-test.sh"
build=${FH_CTEST_BUILD:-$FH_REPO/build/native}
[ -f "$build/CTestTestfile.cmake" ] || fh_skip_or_fail "$build is not a CMake build tree (cmake -S . -B $build && cmake --build $build)"
fh_require_cmd ctest

work=$FH_TEST_DIR/ctest
mkdir -p "$work"
cp "$build/CTestTestfile.cmake" "$work/"
out=$(cd "$work" && FH_DEVICE=${FH_RDMA_DEV:-} timeout 900 ctest --test-dir "$work" -L verbs --output-on-failure 2>&1)
rc=$?
echo "$out"
[ "$rc" = 0 ] || { echo "ctest -L verbs exited $rc"; exit 1; }
if grep -q '(Skipped)' <<<"$out"; then
    echo "some verbs C tests skipped although the device ${FH_RDMA_DEV:-?} exists"
    exit 1
fi
grep -qE '100% tests passed, 0 tests failed out of [1-9]' <<<"$out" || { echo "ctest ran no verbs test"; exit 1; }
echo "ctest -L verbs: all passed on ${FH_RDMA_DEV:-?}"
