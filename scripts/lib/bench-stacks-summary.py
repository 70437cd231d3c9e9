#!/usr/bin/env python3
"""Summary of scripts/bench-stacks: medians per program and configuration, and the ratios.

Usage: bench-stacks-summary.py RUNS.jsonl OUTDIR
NetPIPE rows: Mbps at the largest measured size not above 64 KiB, 256 KiB and 1 MiB (higher is
better). hpcc rows: its own figures of merit (higher is better) and the wall seconds of the whole
run (lower is better); its residual checks are counted. Ratios: shim/ucx and shim/none, as "how the shim compares" (for time, the inverse, so
that above 1.0 always means the shim did better).
"""
import json
import os
import statistics
import sys

SIZES = [65536, 262144, 1048576]
CFGS = ["ucx", "shim", "none"]
# hpcc's summary keys (higher is better) and their labels.
HPCC = [("HPL_Tflops", "HPL Tflops"), ("PTRANS_GBs", "PTRANS GB/s"),
        ("MPIFFT_Gflops", "FFT Gflops"), ("MPIRandomAccess_GUPs", "RandomAcc GUPs"),
        ("AvgPingPongBandwidth_GBytes", "pingpong GB/s"),
        ("NaturallyOrderedRingBandwidth_GBytes", "ring GB/s")]


def main():
    runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
    out = sys.argv[2]
    ok = [r for r in runs if r["rc"] == 0]
    print(f"# bench-stacks: {len(runs)} runs, {len(runs) - len(ok)} failed; "
          f"{max((r['round'] for r in runs), default=0)} alternating rounds, medians")
    checks = [r for r in runs if r["prog"] == "np_check"]
    if checks:
        print("NetPIPE -i integrity: " + ", ".join(
            f"{r['cfg']} {'passed' if r['rc'] == 0 else 'FAILED'}" for r in checks))
    hp = [r for r in runs if r["prog"] == "hpcc"]
    if hp:
        print("hpcc residual checks: " + ", ".join(
            f"{c} {sum(r['passed'] for r in hp if r['cfg'] == c)} passed "
            f"{sum(r['failed'] for r in hp if r['cfg'] == c)} failed" for c in CFGS))
    print()
    print(f"{'#program':<14} {'measure':<14} {'ucx':>10} {'shim':>10} {'none':>10} "
          f"{'shim/ucx':>9} {'shim/none':>9}")
    for prog, label in (("np_fresh", "NetPIPE -I"), ("np_reuse", "NetPIPE")):
        rows = [r for r in ok if r["prog"] == prog]
        if not rows:
            continue
        measured = sorted({int(k[5:]) for r in rows for k in r if k.startswith("mbps_")})
        for target in SIZES:
            below = [s for s in measured if s <= target]
            if not below:
                continue
            size = below[-1]
            key = f"mbps_{size}"
            med = {}
            for c in CFGS:
                vals = [r[key] for r in rows if r["cfg"] == c and key in r]
                med[c] = statistics.median(vals) if vals else None
            print(row(label, f"Mbps@{size // 1024}K", med, higher_better=True))
    rows = [r for r in ok if r["prog"] == "hpcc"]
    for key, what in HPCC:
        med = {}
        for c in CFGS:
            vals = [r[key] for r in rows if r["cfg"] == c and key in r]
            med[c] = statistics.median(vals) if vals else None
        if any(v is not None for v in med.values()):
            print(row("hpcc", what, med, higher_better=True, digits=4))
    if rows:
        med = {c: (statistics.median([r["secs"] for r in rows if r["cfg"] == c])
                   if any(r["cfg"] == c for r in rows) else None) for c in CFGS}
        print(row("hpcc", "wall s", med, higher_better=False))
    print()
    for prog in ("np_fresh", "np_reuse", "hpcc"):
        path = os.path.join(out, f"stats-{prog}-shim.txt")
        if not os.path.exists(path):
            continue
        keep = ("registrations:", "cache:", "bypass:", "time saved:", "miss path:",
                "at most", "estimated")
        lines = [l.rstrip() for l in open(path) if any(k in l for k in keep)]
        print(f"shim FH_STATS, {prog}, last round (one line per rank and kind):")
        for l in lines[:16]:
            print("  " + l.strip())


def row(label, what, med, higher_better, digits=1):
    def fmt(v):
        if v is None:
            return f"{'-':>10}"
        return f"{v:10.{digits}f}" if digits == 1 else f"{v:10.4g}"

    def ratio(a, b):
        if a is None or b is None or a == 0 or b == 0:
            return f"{'-':>9}"
        return f"{(a / b if higher_better else b / a):9.2f}"

    return (f"{label:<14} {what:<14} {fmt(med['ucx'])} {fmt(med['shim'])} {fmt(med['none'])} "
            f"{ratio(med['shim'], med['ucx'])} {ratio(med['shim'], med['none'])}")


if __name__ == "__main__":
    main()
