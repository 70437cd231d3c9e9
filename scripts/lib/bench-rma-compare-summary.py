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
typical are shown beside them. A boot runs fh_bench and the anchors in one or more rounds
(`fh_rma-rN.json`, `shmem_put-rN.log`, `mpi_put-rN.log`; an older boot's unsuffixed files are one
round): a boot's value is the median over its rounds, its ratio the median over its rounds of the
ratio within each round. A target's ratio is the median over boots of those (under TCG only
ratios within one boot mean anything). The interleaved runs (`rma_interleaved_{mpi,shmem}-rN.log`:
Firehose and one anchor in one process, alternating blocks) give their own ratios, median over
rounds then boots, shown with the same bounds in lower case (pass/miss); the exit code follows
the separate runs.
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


def rounds_of(logs):
    """The rounds a boot ran (`fh_rma-rN.json` and the anchors' `-rN` logs), in order; a boot of
    an older layout (one unsuffixed run of each) is one round named ''."""
    try:
        names = os.listdir(logs)
    except OSError:
        return [""]
    found = sorted({int(m.group(1)) for n in names for m in [re.fullmatch(r"(?:fh_rma|shmem_put|mpi_put|rma_interleaved_mpi|rma_interleaved_shmem)-r(\d+)\.\w+", n)] if m})
    return [f"-r{r}" for r in found] or [""]


def anchor_result(logs, name, sfx, b):
    """The result line of program `name` in the round of suffix `sfx` (None without one); its
    exit goes into the boot (the first that failed, else 0) and, when it failed, a note."""
    a = result_line(os.path.join(logs, f"{name}{sfx}.log"))
    code = rc(os.path.join(logs, f"{name}{sfx}.rc"))
    if b.get(name + "_exit") in (0, None):
        b[name + "_exit"] = code
    if code not in (0, None):
        b["notes"].append(f"{name}{sfx} exit {code}" + (" after printing its numbers" if a else ", no numbers"))
    return a


def one_round(logs, sfx, b):
    """The values of fh_bench and the anchors in one round (files with suffix `sfx`)."""
    v = {m[0]: {} for m in MEASURES}
    fh = None
    text = read(os.path.join(logs, f"fh_rma{sfx}.json"))
    if text:
        try:
            fh = json.loads(text.strip().splitlines()[-1])
        except ValueError:
            b["notes"].append(f"fh_rma{sfx}.json unreadable")
    code = rc(os.path.join(logs, f"fh_rma{sfx}.rc"))
    if code not in (0, None) or b.get("fh_bench_exit") is None:
        b["fh_bench_exit"] = code
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
            rate = min(
                (r.get("hit_rate_pct") or 0.0 for k, r in rows.items() if k.startswith(f"firehose_{op}")),
                default=None,
            )
            key = f"fh_{op}_hit_rate_pct"
            if rate is not None:
                b[key] = rate if b.get(key) is None else min(b[key], rate)
        b["fh_env"] = fh.get("env")
    for name, src in (("shmem_put", "shmem"), ("mpi_put", "mpi")):
        a = anchor_result(logs, name, sfx, b)
        if a:
            v["put_lat"][src] = a.get("lat_8b_us")
            v["get_lat"][src] = a.get("get_lat_8b_us")
            v["put_bw"][src] = a.get("bw_64k_mb_s")
            v["get_bw"][src] = a.get("get_bw_64k_mb_s")
    return v


def interleaved_round(logs, sfx, b):
    """The ratios of rma_interleaved (Firehose and one anchor in one process) in one round:
    `{measure}_fh_vs_{anchor}`, each the median over block pairs of the ratio within a pair.
    Firehose's RDMA work requests per op of the bandwidth measures go to the boot's
    `fh_wr_per_op` lists (one value per run)."""
    out = {}
    for anchor in ("mpi", "shmem"):
        a = anchor_result(logs, f"rma_interleaved_{anchor}", sfx, b)
        if not a:
            continue
        for key, _, _, _ in MEASURES:
            r = a.get(f"{key}_ratio")
            if r:
                out[f"{key}_fh_vs_{anchor}"] = r
            w = a.get(f"{key}_fh_wr_per_op")
            if w is not None and key.endswith("_bw"):
                b.setdefault("fh_wr_per_op", {}).setdefault(key, []).append(w)
    return out


def ratios_of(v):
    out = {}
    for key, _, _, _ in MEASURES:
        f = v[key].get("fh")
        for other in ("shmem", "mpi", "floor", "perftest"):
            o = v[key].get(other)
            if f and o:
                out[f"{key}_fh_vs_{other}"] = f / o
    return out


def boot(dirname):
    """One boot: perftest once; fh_bench and the anchors per round. Its value of a measure is the
    median over its rounds; its ratio the median over rounds of the ratio within each round."""
    logs = os.path.join(res, dirname, "logs")
    b = {"boot": dirname, "exit": rc(os.path.join(res, dirname + ".rc")), "values": {}, "notes": []}
    mb = 1.048576  # perftest's MB/sec is 2^20 bytes
    lat = lambda n: perf_col(os.path.join(logs, n + ".log"), 8, 5)  # noqa: E731  t_typical
    bw = lambda n: perf_col(os.path.join(logs, n + ".log"), 65536, 4)  # noqa: E731  BW average
    w, r = bw("ib_write_bw"), bw("ib_read_bw")
    perftest = {"put_lat": lat("ib_write_lat"), "get_lat": lat("ib_read_lat"),
                "put_bw": w * mb if w else None, "get_bw": r * mb if r else None}
    rounds = []
    for sfx in rounds_of(logs):
        v = one_round(logs, sfx, b)
        for key in perftest:
            v[key]["perftest"] = perftest[key]
        rounds.append({"round": sfx.lstrip("-") or "r1", "values": v, "ratios": ratios_of(v),
                       "interleaved": interleaved_round(logs, sfx, b)})
    b["rounds"] = rounds
    b["values"] = {key: {src: med([rd["values"][key].get(src) for rd in rounds]) for src, _ in SOURCES}
                   for key, _, _, _ in MEASURES}
    keys = {k for rd in rounds for k in rd["ratios"]}
    b["ratios"] = {k: med([rd["ratios"].get(k) for rd in rounds]) for k in keys}
    keys = {k for rd in rounds for k in rd["interleaved"]}
    b["interleaved"] = {k: med([rd["interleaved"].get(k) for rd in rounds]) for k in keys}
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
nr = max((len(b["rounds"]) for b in boots), default=0)
print(f" bench-rma-compare: {n} boot(s) x {nr} round(s), library defaults (no FH_* tuning), 2 ranks, window 16")
if nr > 1:
    print(" a boot's value: the median of its rounds; its ratio: the median of the ratios within each round")
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

order = [m[0] for m in MEASURES]


def ratio_table(field, titles):
    """Prints the boots' ratios under `field` (a row per ratio, a column per boot, the median);
    returns them as {ratio: {per_boot, median}}. Nothing when no boot has any."""
    out = {}
    keys = sorted({k for b in boots for k in b.get(field, {})},
                  key=lambda k: (order.index(k.split("_fh_vs_")[0]), k))
    if not keys:
        return out
    for t in titles:
        print(t)
    print(head)
    for k in keys:
        vals = [b.get(field, {}).get(k) for b in boots]
        out[k] = {"per_boot": vals, "median": med(vals)}
        print(f"  {k:<41} " + "".join(f"{x:<12.3f}" if x is not None else f"{'-':<12}" for x in vals)
              + (f"{out[k]['median']:.3f}" if out[k]["median"] is not None else "-"))
    print(rule)
    return out


ratios = ratio_table("ratios", ["ratios (per boot: median over its rounds of the ratio within each round; median over boots)"])
inter = ratio_table("interleaved", [
    "interleaved in one process (bench/anchor/rma_interleaved.c: blocks of Firehose ops and of",
    " the anchor's alternating F A A F ...; a round's ratio is the median over block pairs)"])
for b in boots:
    hr = [f"{op} hit rate {b.get(f'fh_{op}_hit_rate_pct')}" for op in ("put", "get")]
    line = f" {b['boot']}: boot exit {b['exit']}, fh_bench exit {b.get('fh_bench_exit')}, " \
           f"shmem_put exit {b.get('shmem_put_exit')}, mpi_put exit {b.get('mpi_put_exit')}; " + ", ".join(hr)
    wr = b.get("fh_wr_per_op", {})
    if wr:
        # An op that crosses a region boundary of the target takes one request per region.
        line += "; fh RDMA work requests per 64 KiB op (interleaved): " + ", ".join(
            f"{k.split('_')[0]} {med(v):.2f}" for k, v in sorted(wr.items()))
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

def judge(table, interleaved):
    """The targets (latency ratio <= 1.0, bandwidth ratio >= 1.0) on `table`'s medians, printed as
    PASS/MISS lines (the interleaved ones, only those measured, as lower-case pass/miss)."""
    out = []
    for key, label, _, lower in MEASURES:
        for other in ("shmem", "mpi"):
            k = f"{key}_fh_vs_{other}"
            if interleaved and k not in table:
                continue
            v = table.get(k, {}).get("median")
            op, limit = ("<=", 1.0) if lower else (">=", 1.0)
            ok = v is not None and (v <= limit if lower else v >= limit)
            what = f"{label}: fh / {other}, median over boots of the ratio within each boot"
            out.append({"target": k, "value": v, "op": op, "limit": limit, "pass": ok, "what": what})
            shown = f"{v:.4f}" if v is not None else "no number"
            if interleaved:
                print(f"{'pass' if ok else 'miss'} {k} (interleaved): {shown} {op} {limit}")
            else:
                print(f"{'PASS' if ok else 'MISS'} {k}: {shown} {op} {limit} ({what})")
    return out


targets = judge(ratios, False)
# The same targets on the interleaved runs (shown; the exit code follows the separate runs above).
inter_targets = judge(inter, True)

doc = {"bench": "bench-rma-compare", "boots": boots, "median": medians, "ratios": ratios,
       "targets": targets, "interleaved": inter, "interleaved_targets": inter_targets,
       "instructions_per_op": ins}
with open(os.path.join(res, "bench-rma-compare.json"), "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
if not any(b["values"]["put_lat"].get("fh") for b in boots):
    print("bench-rma-compare: no boot gave Firehose numbers", file=sys.stderr)
    sys.exit(1)
sys.exit(0 if all(t["pass"] for t in targets) else 3)
