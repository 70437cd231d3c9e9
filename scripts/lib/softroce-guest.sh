#!/usr/bin/env bash
# Runs INSIDE the Soft-RoCE guest (started by scripts/softroce-vm): brings up rxe0 over a dummy netdev,
# then runs the given command and records its exit code in OUTDIR/guest-rc (the host trusts that file,
# not only vng's exit code, so that a guest that dies half-way is never taken for a pass).
#
#   softroce-guest.sh OUTDIR CMD [ARGS...]
set -uo pipefail
OUT=$1; shift
rm -f "$OUT/guest-rc"

fail_setup() {
    echo "softroce-guest: setup failed: $*" >&2
    echo 1 > "$OUT/guest-rc"
    exit 1
}

echo "softroce-guest: kernel $(uname -r), $(nproc) cpus, $(awk '/MemTotal/ {print $2 " kB"}' /proc/meminfo)"
modprobe rdma_rxe || fail_setup "modprobe rdma_rxe"
modprobe ib_uverbs 2>/dev/null || true
# A dummy netdev keeps every RoCE packet inside this guest; MTU 9000 allows a 4096-byte RoCE MTU.
ip link add dummy0 type dummy || fail_setup "ip link add dummy0"
ip link set dummy0 mtu 9000
ip addr add 10.11.0.1/24 dev dummy0
ip link set dummy0 up
ip link set lo up
rdma link add rxe0 type rxe netdev dummy0 || fail_setup "rdma link add rxe0"

# The port goes ACTIVE and GIDs appear asynchronously; wait a little for both (TCG is slow).
for _ in $(seq 1 50); do
    if ibv_devinfo -d rxe0 2>/dev/null | grep -q PORT_ACTIVE &&
        [ -s /sys/class/infiniband/rxe0/ports/1/gids/1 ] &&
        ! grep -q '^0000:0000:0000:0000:0000:0000:0000:0000$' /sys/class/infiniband/rxe0/ports/1/gids/1; then
        break
    fi
    sleep 0.2
done
ibv_devices | tee "$OUT/ibv_devices.txt"
grep -qw rxe0 "$OUT/ibv_devices.txt" || fail_setup "ibv_devices does not list rxe0"
echo "softroce-guest: rxe0 up (gid1 $(cat /sys/class/infiniband/rxe0/ports/1/gids/1 2>/dev/null))"

export FH_RDMA_DEV=rxe0 FH_SOFTROCE_GUEST=1
echo "softroce-guest: running: $*"
"$@"
rc=$?
echo "$rc" > "$OUT/guest-rc"
echo "softroce-guest: command exited $rc"
exit "$rc"
