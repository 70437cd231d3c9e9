# Helpers for tests in tests/verbs-suite.d/ (sourced). See scripts/verbs-suite for the environment.

# fh_skip_or_fail MSG: a missing prerequisite is a SKIP (exit 77) for a developer, but a FAIL (exit 1)
# when CI=true, so that CI can never go green by running nothing.
fh_skip_or_fail() {
    if [ "${CI:-}" = true ]; then
        echo "FAIL (CI=true): $*" >&2
        exit 1
    fi
    echo "SKIP: $*" >&2
    exit 77
}

# fh_require_bin NAME: skip/fail unless the prebuilt binary $FH_BIN_DIR/NAME exists; print its path.
# Either call it directly (its exit then ends the test) and run "$FH_BIN_DIR/NAME", or
# `bin=$(fh_require_bin NAME) || exit $?` (the exit happens in the subshell: pass it on).
fh_require_bin() {
    [ -x "$FH_BIN_DIR/$1" ] || fh_skip_or_fail "$FH_BIN_DIR/$1 not built (cargo build --release first)"
    echo "$FH_BIN_DIR/$1"
}

# fh_require_cmd NAME: like fh_require_bin for a command from PATH (e.g. perftest's ib_write_bw).
fh_require_cmd() {
    command -v "$1" >/dev/null || fh_skip_or_fail "$1 not installed (scripts/install-deps --vm)"
}

# fh_wait_listen PORT PID: wait (up to ~30 s, TCG is slow) until a TCP listener is on PORT, while PID lives.
fh_wait_listen() {
    local port=$1 pid=$2
    for _ in $(seq 1 150); do
        ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && return 0
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.2
    done
    return 1
}
