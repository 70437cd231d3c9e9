# shellcheck shell=bash
# ibv_close_device without ibv_dealloc_pd under libfirehose_preload.so
# (c-tests/preload/preload_close_device.c): the caches of the device's domains must release what
# they keep before the real close, so that no MR is later deregistered through the freed context
# (a munmap of a cached range after the close). The sequence must also run without the shim.
set -uo pipefail
. "$FH_REPO/scripts/lib/verbs-test.sh"
. "$FH_REPO/c-tests/preload/suite-lib.sh"
preload_setup
preload_cc preload_close_device

timeout 120 "$CC_OUT/preload_close_device" plain
rc=$?
[ "$rc" = 77 ] && fh_skip_or_fail "no RDMA device"
[ "$rc" = 0 ] || { echo "preload_close_device without the shim exited $rc"; exit 1; }
FH_STATS=1 under_shim timeout 120 "$CC_OUT/preload_close_device"
rc=$?
[ "$rc" = 0 ] || { echo "preload_close_device under the shim exited $rc"; exit 1; }
