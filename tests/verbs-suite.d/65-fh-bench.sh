# shellcheck shell=bash
# A smoke run of the Firehose bench (bench/src/bin/fh_bench, scripts/bench-fh measures with it):
# two working sets (below M, and past M + MAXVICTIM) at 8 B and 64 KiB, Fig. 5 at two sizes, all
# four transports, then the app (bitonic sort, 4 ranks, verified). Checked: the runs succeed (the
# bench itself fails a run whose target pinned more than M + MAXVICTIM), the one-sided hit rate
# below M is 100 % after warm-up, the app sorted correctly for every transport. Then
# FH_BENCH_BREAK=1 (the bound check against M alone, which the sweep past M exceeds) must fail.
# No timing is judged here: that is scripts/bench-fh's job, outside the test command.
set -uo pipefail
. "$FH_REPO/scripts/lib/verbs-test.sh"
fh_require_cmd mpirun
bin=$(fh_require_bin fh_bench) || { rc=$?; echo "$bin"; exit "$rc"; }
out=${FH_VERBS_OUT:-/tmp}/65-fh-bench
mkdir -p "$out"

mpi() {
    local n=$1
    shift
    timeout 300 mpirun --allow-run-as-root --oversubscribe -np "$n" \
        -x FH_DEVICE="$FH_RDMA_DEV" -x FH_GID_INDEX -x FH_IB_PORT -x FH_PROGRESS_THREAD \
        -x FH_M -x FH_MAXVICTIM -x FH_BENCH_BREAK "$bin" "$@"
}
export FH_PROGRESS_THREAD=0 FH_M=1m FH_MAXVICTIM=512k FH_BENCH_BREAK=
small=(--test lat,bw,peak --sweep 256k,2m --iters 150 --unpin-iters 10 --warmup 100 --bw-msgs 32
    --sizes 8,65536 --peak-bytes 256k --batches 2)
fails=0
echo "--- sweeps, 2 ranks"
if mpi 2 "${small[@]}" --json-out "$out/sweep.json" > "$out/sweep.txt" 2>&1; then
    cat "$out/sweep.txt"
    python3 - "$out/sweep.json" <<'PY' || fails=$((fails + 1))
import json, sys
d = json.load(open(sys.argv[1]))
rows = [r for r in d["lat"] + d["bw"] if r["series"] == "firehose" and r["working_set"] <= d["config"]["m"]]
assert rows, "no firehose rows below M"
bad = [r for r in rows if r["hits"] == 0 or r["misses"] != 0]
assert not bad, f"misses below M after warm-up: {bad}"
past = [r for r in d["lat"] if r["series"] == "firehose" and r["working_set"] > d["config"]["m"] + d["config"]["max_victim"]]
assert past and all(r["misses"] > 0 for r in past), "the sweep past M + MAXVICTIM never missed"
assert all(r["target_pinned_peak"] <= d["config"]["m"] + d["config"]["max_victim"] for r in past)
print("ok: hits below M, misses past the bound, pinned peak within M + MAXVICTIM")
PY
else
    echo "FAILED: sweeps (exit $?)"; tail -20 "$out/sweep.txt"; fails=$((fails + 1))
fi
echo "--- app, 4 ranks"
if FH_M=48m FH_MAXVICTIM=16m mpi 4 --test app --app-keys 8192 --app-reps 1 --app-chunk 16k \
    --json-out "$out/app.json" > "$out/app.txt" 2>&1; then
    cat "$out/app.txt"
    python3 -c 'import json,sys; a=json.load(open(sys.argv[1]))["app"]; assert len(a)==4 and all(r["verified"] for r in a), a; print("ok: app verified x4")' \
        "$out/app.json" || fails=$((fails + 1))
else
    echo "FAILED: app (exit $?)"; tail -20 "$out/app.txt"; fails=$((fails + 1))
fi
echo "--- FH_BENCH_BREAK=1: the bound check against M alone must fail the run"
if FH_BENCH_BREAK=1 mpi 2 --test lat --sweep 2m --iters 50 --unpin-iters 5 --warmup 50 --batches 1 \
    --series firehose > "$out/break.txt" 2>&1; then
    echo "FH_BENCH_BREAK=1 passed: the pinned-bytes check cannot fail"; fails=$((fails + 1))
elif grep -q "over M + MAXVICTIM" "$out/break.txt"; then
    echo "ok: the check failed the run"
else
    echo "FH_BENCH_BREAK=1 failed for another reason:"; tail -20 "$out/break.txt"; fails=$((fails + 1))
fi
[ "$fails" = 0 ] || { echo "$fails fh-bench runs failed"; exit 1; }
