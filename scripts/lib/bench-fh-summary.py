#!/usr/bin/env python3
"""Summary of scripts/bench-fh: gathers fh_bench's sweeps (Figs. 3-5), its app run (Table 3),
fh_core (native), perftest's ib_write_lat/ib_write_bw and the anchor (shmem_putmem, MPI_Put) from
RESDIR/logs into RESDIR/bench-fh.json, prints the issue's targets as PASS/MISS lines with their
ratios, and the ratios to perftest and to the anchor. Exit 0 all PASS, 3 a MISS.

    bench-fh-summary.py RESDIR
"""
import json
import os
import statistics
import sys

import perftest_log  # scripts/lib, next to this script

res = sys.argv[1]
logs = os.path.join(res, "logs")


def load(name):
    p = os.path.join(logs, name)
    if not os.path.exists(p):
        return None
    with open(p) as f:
        text = f.read().strip()
    if not text:
        return None
    if name.endswith(".jsonl"):
        return [json.loads(l) for l in text.splitlines() if l.strip()]
    return json.loads(text.splitlines()[-1])


def perf_col(name, size, col):
    """perftest's result row in logs/NAME: the line starting with the size; column `col`."""
    return perftest_log.column(os.path.join(logs, name), size, col)


sweeps = load("fh_bench.json") or {}
page = load("fh_bench_page.json") or {}
app = load("fh_app.json") or {}
core = load("fh_core.jsonl") or []
core_guest = load("fh_core_guest.jsonl") or []
anchor = {n: load(n + ".json") for n in ("shmem_put", "mpi_put")}
# A program that printed its result and then failed (shmem_put on rxe: SIGSEGV at exit) keeps
# its numbers, with the failure noted.
for n, a in anchor.items():
    if a and "error" in a:
        p = os.path.join(logs, n + ".log")
        lines = [l for l in open(p, errors="replace")] if os.path.exists(p) else []
        found = [json.loads(l) for l in lines if l.startswith("{")]
        if found:
            err = [l.strip() for l in a["error"].splitlines() if "signal" in l or "rror" in l]
            anchor[n] = dict(found[-1], exit=a.get("exit"), failed_after_result=err[:3])
perf = {
    # ib_write_lat: #bytes #iterations t_min t_max t_typical ...; ib_write_bw: ... BW average (col 4)
    "ib_write_lat_8_t_typical_us": perf_col("ib_write_lat.log", 8, 5),
    "ib_write_bw_65536_bw_avg_mb_s": perf_col("ib_write_bw.log", 65536, 4),
}

targets = list(sweeps.get("targets", []))
# The page-mode run's own targets, renamed (its hit-latency ratio is informative too).
for t in page.get("targets", []):
    if t["target"] in ("past_bound_vs_rdv_unpin", "hit_latency_vs_floor", "pinned_peak_vs_bound"):
        targets.append(dict(t, target=t["target"] + "_page_mode",
                            what=t["what"] + " [FH_MAXREGION=4k]"))


def target(name, value, op, limit, what):
    ok = value <= limit if op == "<=" else value >= limit
    targets.append({"target": name, "value": value, "op": op, "limit": limit, "pass": ok, "what": what})


hits = [r for r in core if r.get("test") == "hit"]
if hits:
    worst = max(hits, key=lambda r: r["ns_typical"])
    target("core_hit_ns", worst["ns_typical"], "<=", 100.0,
           "fh_core natively: Firehose bookkeeping of a hit put (acquire + release), worst typical over "
           f"working sets and modes ({worst['working_set_buckets']} buckets, region {worst['region_buckets']})")
if app.get("app"):
    ok = all(r["verified"] for r in app["app"])
    target("app_verified", 1.0 if ok else 0.0, ">=", 1.0, "bitonic sort result verified for every transport")


def series(rows, name):
    return [r for r in rows if r["series"] == name]


m = sweeps.get("config", {}).get("m", 0)
lat = sweeps.get("lat", [])
bw = sweeps.get("bw", [])


def median_below_m(rows, name, key):
    v = [r[key] for r in series(rows, name) if r["working_set"] <= m]
    return statistics.median(v) if v else None


ratios = {}
fh_lat = median_below_m(lat, "firehose", "t_typical_us")
fh_bw = median_below_m(bw, "firehose", "bw_mb_s")
floor_lat = median_below_m(lat, "floor", "t_typical_us")
floor_bw = median_below_m(bw, "floor", "bw_mb_s")
if fh_lat and perf["ib_write_lat_8_t_typical_us"]:
    ratios["firehose_8b_lat_vs_ib_write_lat"] = fh_lat / perf["ib_write_lat_8_t_typical_us"]
if floor_lat and perf["ib_write_lat_8_t_typical_us"]:
    ratios["floor_8b_lat_vs_ib_write_lat"] = floor_lat / perf["ib_write_lat_8_t_typical_us"]
if fh_bw and perf["ib_write_bw_65536_bw_avg_mb_s"]:
    # perftest's MB is 2^20 bytes; fh_bench's 10^6.
    ratios["firehose_64k_bw_vs_ib_write_bw"] = fh_bw / (perf["ib_write_bw_65536_bw_avg_mb_s"] * 1.048576)
for name, a in anchor.items():
    if a and "lat_8b_us" in a and fh_lat:
        ratios[f"firehose_8b_lat_vs_{name}"] = fh_lat / a["lat_8b_us"]
    if a and "bw_64k_mb_s" in a and fh_bw:
        ratios[f"firehose_64k_bw_vs_{name}"] = fh_bw / a["bw_64k_mb_s"]

doc = {
    "sweeps": sweeps,
    "sweeps_page_mode": page,
    "app": app.get("app", []),
    "app_config": app.get("config", {}),
    "core": core,
    "core_guest": core_guest,
    "perftest": perf,
    "anchor": anchor,
    "medians_below_m": {"firehose_8b_lat_us": fh_lat, "floor_8b_lat_us": floor_lat,
                        "firehose_64k_bw_mb_s": fh_bw, "floor_64k_bw_mb_s": floor_bw},
    "ratios": ratios,
    "targets": targets,
}
with open(os.path.join(res, "bench-fh.json"), "w") as f:
    json.dump(doc, f, indent=1)

print("== bench-fh summary (ratios within one boot; absolute numbers are TCG's)")
print(f"perftest: ib_write_lat 8 B t_typical {perf['ib_write_lat_8_t_typical_us']} us, "
      f"ib_write_bw 64 KiB {perf['ib_write_bw_65536_bw_avg_mb_s']} MB/s (2^20)")
for name, a in anchor.items():
    if a is None:
        print(f"anchor {name}: not run")
    elif "error" in a:
        err = a["error"].strip().splitlines()
        print(f"anchor {name}: FAILED (exit {a.get('exit', '?')}): {err[-1] if err else ''}")
    else:
        note = f" (then exit {a['exit']}: {'; '.join(a['failed_after_result'])})" if a.get("exit") else ""
        print(f"anchor {name}: 8 B put+quiet {a['lat_8b_us']:.2f} us, 64 KiB bw {a['bw_64k_mb_s']:.2f} MB/s{note}")
for r in app.get("app", []):
    print(f"app {r['series']:<12} {r['ranks']} ranks {r['keys_per_rank']} keys/rank x{r['reps']}: "
          f"{r['secs']:.3f} s, puts {r['puts']}, one-sided {r['one_sided']}, misses {r['misses']}, "
          f"moves {r['moves']}, verified {r['verified']}")
def hit_typ(rows):
    v = [r["ns_typical"] for r in rows if r.get("test") == "hit"]
    return statistics.median(v) if v else None


if hit_typ(core) and hit_typ(core_guest):
    ratios["guest_vs_native_cpu_slowdown_fh_core_hit"] = hit_typ(core_guest) / hit_typ(core)
for k, v in ratios.items():
    print(f"ratio {k}: {v:.3f}")
miss = 0
for t in targets:
    ok = t["pass"]
    miss += not ok
    print(f"{'PASS' if ok else 'MISS'} {t['target']}: {t['value']:.4f} {t['op']} {t['limit']} ({t['what']})")
sys.exit(3 if miss else 0)
