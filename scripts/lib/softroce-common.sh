# Shared settings for scripts/install-deps, scripts/softroce-vm and scripts/verbs-tests (sourced, not run).

# virtme-ng version known to boot the Debian kernel with Soft-RoCE on this kind of machine.
# shellcheck disable=SC2034 # used by the scripts that source this file
FH_VIRTME_NG_VERSION=1.42

# The repository root (this file lives in scripts/lib/).
fh_repo_root() { (cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd); }

# Where the virtme-ng venv lives: outside target/ so that `cargo clean` keeps it.
fh_venv_dir() { echo "${FH_CACHE_DIR:-/var/cache/firehose}/venv"; }

# The Debian kernel to boot in the guest: the newest installed one, not `uname -r` (the host
# kernel of a container or CI runner may have no modules at all).
# shellcheck disable=SC2012 # kernel release names are plain
fh_guest_kver() { ls /lib/modules 2>/dev/null | sort -V | tail -1; }

# Where host-side logs go: target/softroce/ unless overridden.
fh_softroce_dir() { echo "${FH_SOFTROCE_DIR:-$(fh_repo_root)/target/softroce}"; }

# The RDMA device to measure on, as the verbs suite picks it: exports FH_DEVICE (FH_RDMA_DEV, else
# the first device), FH_IB_PORT (default 1) and FH_GID_INDEX (the IPv4-mapped GID, else index 0).
fh_rdma_device_env() {
    local g
    FH_DEVICE=${FH_RDMA_DEV:-$(find /sys/class/infiniband -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null | sort | head -1)}
    FH_IB_PORT=${FH_IB_PORT:-1}
    if [ -z "${FH_GID_INDEX:-}" ]; then
        FH_GID_INDEX=0
        for g in /sys/class/infiniband/"$FH_DEVICE"/ports/"$FH_IB_PORT"/gids/*; do
            if grep -q '^0000:0000:0000:0000:0000:ffff:' "$g" 2>/dev/null; then FH_GID_INDEX=$(basename "$g"); break; fi
        done
    fi
    export FH_DEVICE FH_IB_PORT FH_GID_INDEX
}
