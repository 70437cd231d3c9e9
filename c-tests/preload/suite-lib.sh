# shellcheck shell=bash
# Helpers for the shim's verbs-suite tests (tests/verbs-suite.d/5*-preload-*.sh), sourced after
# scripts/lib/verbs-test.sh. The C programs are small: they are compiled here, in the test's scratch
# directory, so the suite needs nothing prebuilt but libfirehose_preload.so.

# preload_setup: sets SHIM (the .so, or skip/fail) and CC_OUT (where binaries go).
preload_setup() {
    SHIM=$FH_BIN_DIR/libfirehose_preload.so
    [ -r "$SHIM" ] || fh_skip_or_fail "$SHIM not built (cargo build --release -p firehose-preload)"
    command -v cc >/dev/null || fh_skip_or_fail "no C compiler"
    CC_OUT=$FH_TEST_DIR
}

# preload_cc NAME: build c-tests/preload/NAME.c (+ the C tests' loopback helper,
# c-tests/common/verbs_loopback.c) into $CC_OUT/NAME.
preload_cc() {
    local src=$FH_REPO/c-tests/preload
    cc -O1 -g -Wall -o "$CC_OUT/$1" "$src/$1.c" "$src/../common/verbs_loopback.c" -libverbs -ldl ||
        { echo "cannot compile $1.c"; exit 1; }
}

# under_shim CMD...: run CMD with the shim preloaded (extra FH_* may be set by the caller).
under_shim() {
    LD_PRELOAD=$SHIM "$@"
}
