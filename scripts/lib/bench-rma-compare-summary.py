#!/usr/bin/env python3
"""Summary of scripts/bench-rma-compare: gathers every boot's perftest logs, fh_bench --test rma
and the anchors (shmem_put, mpi_put: puts and gets) from RESDIR/boot-N/logs, and the host's
instruction counts (RESDIR/profile-put.txt); prints a perftest-style table (per boot, median),
the ratios fh/shmem and fh/mpi with the targets as PASS/MISS lines, and writes everything to
RESDIR/bench-rma-compare.json. Exit 0 all PASS, 3 a MISS (or a target with no number), 1 no
boot gave Firehose numbers.

    bench-rma-compare-summary.py RESDIR

The measures set side by side are alike: latency is the mean per op of the timed loop (the
anchors time the whole loop; fh_bench's `t_avg_us`), bandwidth the bytes over the whole timed
run (the anchors' total; fh_bench's batches are equal, so bytes / `t_avg_us`), MB = 10^6 bytes
(perftest's MB/sec, 2^20, converted). fh_bench's median op (`t_typical_us`) and perftest's
typical are shown beside them. A target's ratio is the median over boots of the ratio measured
within each boot (under TCG only ratios within one boot mean anything).
"""
import json
import os
import re
import statistics
import sys

import perftest_log  # scripts/lib, next to this script

res = sys.argv[1]

# (key, label, unit, lower is better)
MEASURES = [
    ("put_lat", "8 B put latency", "usec", True),
    ("get_lat", "8 B get latency", "usec", True),
    ("put_bw", "64 KiB put bandwidth", "MB/sec", False),
    ("get_bw", "64 KiB get bandwidth", "MB/sec", False),
]
# Rows of each measure: (source, label).
SOURCES = [
    ("perftest", "perftest ib_{op}_{what}"),
    ("floor", "floor (registered once)"),
    ("fh", "fh_{op} (Firehose hit)"),
    ("fh_typical", "fh_{op}, median op"),
    ("shmem", "shmem_{op}mem (spml ucx)"),
    ("mpi", "MPI_{Op} + flush (osc ucx)"),
]


def perf_col(path, size, col):
    """perftest's result row: the line starting with the size; column `col` (1-based)."""
    return perftest_log.column(path, size, col)


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return None


def result_line(path):
    """The last JSON line a program printed (kept whatever its exit)."""
    text = read(path) or ""
    found = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except ValueError:
                pass
    return found[-1] if found else None


def rc(path):
    t = read(path)
    try:
        return int(t.strip()) if t else None
    except ValueError:
        return None


def boot(dirname):
    logs = os.path.join(res, dirname, "logs")
    b = {"boot": dirname, "exit": rc(os.path.join(res, dirname + ".rc")), "values": {}, "notes": []}
    v = {m[0]: {} for m in MEASURES}
    mb = 1.048576  # perftest's MB/sec is 2^20 bytes
    lat = lambda n: perf_col(os.path.join(logs, n + ".log"), 8, 5)  # noqa: E731  t_typical
    bw = lambda n: perf_col(os.path.join(logs, n + ".log"), 65536, 4)  # noqa: E731  BW average
    v["put_lat"]["perftest"] = lat("ib_write_lat")
    v["get_lat"]["perftest"] = lat("ib_read_lat")
    w, r = bw("ib_write_bw"), bw("ib_read_bw")
    v["put_bw"]["perftest"] = w * mb if w else None
    v["get_bw"]["perftest"] = r * mb if r else None

    fh = None
    text = read(os.path.join(logs, "fh_rma.json"))
    if text:
        try:
            fh = json.loads(text.strip().splitlines()[-1])
        except ValueError:
            b["notes"].append("fh_rma.json unreadable")
    b["fh_bench_exit"] = rc(os.path.join(logs, "fh_rma.rc"))
    if fh:
        rows = {r["series"] + ("_lat" if r["bytes"] == 8 else "_bw"): r for r in fh.get("rma", [])}
        for op in ("put", "get"):
            for way, src in (("floor", "floor"), ("firehose", "fh")):
                lr, br = rows.get(f"{way}_{op}_lat"), rows.get(f"{way}_{op}_bw")
                if lr:
                    v[op + "_lat"][src] = lr["t_avg_us"]
                    if way == "firehose":
                        v[op + "_lat"]["fh_typical"] = lr["t_typical_us"]
                if br:
                    v[op + "_bw"][src] = br["bytes"] / br["t_avg_us"]
                    if way == "firehose":
                        v[op + "_bw"]["fh_typical"] = br["bw_mb_s"]
            b[f"fh_{op}_hit_rate_pct"] = min(
                (r.get("hit_rate_pct") or 0.0 for k, r in rows.items() if k.startswith(f"firehose_{op}")),
                default=None,
            )
        b["fh_env"] = fh.get("env")
    for name, src in (("shmem_put", "shmem"), ("mpi_put", "mpi")):
        a = result_line(os.path.join(logs, name + ".log"))
        b[name + "_exit"] = rc(os.path.join(logs, name + ".rc"))
        if a:
            v["put_lat"][src] = a.get("lat_8b_us")
            v["get_lat"][src] = a.get("get_lat_8b_us")
            v["put_bw"][src] = a.get("bw_64k_mb_s")
            v["get_bw"][src] = a.get("get_bw_64k_mb_s")
        if b[name + "_exit"] not in (0, None):
            b["notes"].append(f"{name} exit {b[name + '_exit']}" + (" after printing its numbers" if a else ", no numbers"))
    b["values"] = v
    b["ratios"] = {}
    for key, _, _, _ in MEASURES:
        f = v[key].get("fh")
        for other in ("shmem", "mpi", "floor", "perftest"):
            o = v[key].get(other)
            if f and o:
                b["ratios"][f"{key}_fh_vs_{other}"] = f / o
    return b


def instructions():
    text = read(os.path.join(res, "profile-put.txt"))
    if not text:
        return None
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(\S+):\s+(-?\d+)\s+total", line)
        if m:
            out[m.group(1)] = int(m.group(2))
    return out or None


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x):
    return f"{x:<11.2f} " if isinstance(x, (int, float)) else f"{'-':<11} "


dirs = sorted(
    (d for d in os.listdir(res) if re.fullmatch(r"boot-\d+", d) and os.path.isdir(os.path.join(res, d))),
    key=lambda d: int(d.split("-")[1]),
)
boots = [boot(d) for d in dirs]
n = len(boots)
rule = "-" * (44 + 12 * (n + 1))
print(rule)
print(f" bench-rma-compare: {n} boot(s), library defaults (no FH_* tuning), 2 ranks, window 16")
print(rule)
head = f" {'measure / source':<42} " + "".join(f"{b['boot']:<12}" for b in boots) + "median"
medians = {}
for key, label, unit, _ in MEASURES:
    print(f"{label} [{unit}]")
    print(head)
    medians[key] = {}
    op, Op = key[:3], key[:3].capitalize()
    what = "lat" if key.endswith("lat") else "bw"
    pt_op = "write" if op == "put" else "read"
    for src, name in SOURCES:
        vals = [b["values"][key].get(src) for b in boots]
        m = med(vals)
        medians[key][src] = m
        name = name.format(op=pt_op if src == "perftest" else op, what=what, Op=Op)
        print(f"  {name:<41} " + "".join(fmt(x) for x in vals) + fmt(m))
    print(rule)

ratios = {}
print("ratios (per boot; median over boots)")
print(head)
order = [m[0] for m in MEASURES]
keys = sorted({k for b in boots for k in b["ratios"]}, key=lambda k: (order.index(k.split("_fh_vs_")[0]), k))
for k in keys:
    vals = [b["ratios"].get(k) for b in boots]
    ratios[k] = {"per_boot": vals, "median": med(vals)}
    print(f"  {k:<41} " + "".join(f"{x:<12.3f}" if x is not None else f"{'-':<12}" for x in vals)
          + (f"{ratios[k]['median']:.3f}" if ratios[k]["median"] is not None else "-"))
print(rule)
for b in boots:
    hr = [f"{op} hit rate {b.get(f'fh_{op}_hit_rate_pct')}" for op in ("put", "get")]
    line = f" {b['boot']}: boot exit {b['exit']}, fh_bench exit {b.get('fh_bench_exit')}, " \
           f"shmem_put exit {b.get('shmem_put_exit')}, mpi_put exit {b.get('mpi_put_exit')}; " + ", ".join(hr)
    print(line)
    for note in b["notes"]:
        print(f"   note: {note}")

ins = instructions()
if ins:
    print(rule)
    print(" instructions per blocking 8 B op on the host, simulated link (scripts/profile-put; see its log)")
    for mode, label in (("fh", "hit put"), ("floor", "floor put"), ("get", "hit get"), ("floor-get", "floor get")):
        if mode in ins:
            print(f"  {label:<12} {ins[mode]:>8}")
    if ins.get("fh") and ins.get("floor"):
        print(f"  hit put / floor put: {ins['fh'] / ins['floor']:.3f}")
    if ins.get("get") and ins.get("floor-get"):
        print(f"  hit get / floor get: {ins['get'] / ins['floor-get']:.3f}")
print(rule)

targets = []
for key, label, _, lower in MEASURES:
    for other in ("shmem", "mpi"):
        k = f"{key}_fh_vs_{other}"
        v = ratios.get(k, {}).get("median")
        op, limit = ("<=", 1.0) if lower else (">=", 1.0)
        ok = v is not None and (v <= limit if lower else v >= limit)
        targets.append({"target": k, "value": v, "op": op, "limit": limit, "pass": ok,
                        "what": f"{label}: fh / {other}, median over boots of the ratio within each boot"})
        shown = f"{v:.4f}" if v is not None else "no number"
        print(f"{'PASS' if ok else 'MISS'} {k}: {shown} {op} {limit} ({targets[-1]['what']})")

doc = {"bench": "bench-rma-compare", "boots": boots, "median": medians, "ratios": ratios,
       "targets": targets, "instructions_per_op": ins}
with open(os.path.join(res, "bench-rma-compare.json"), "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
if not any(b["values"]["put_lat"].get("fh") for b in boots):
    print("bench-rma-compare: no boot gave Firehose numbers", file=sys.stderr)
    sys.exit(1)
sys.exit(0 if all(t["pass"] for t in targets) else 3)
