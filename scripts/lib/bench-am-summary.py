#!/usr/bin/env python3
"""Summary of scripts/bench-am: medians over reps of every tool's numbers, the three ratios with
PASS/MISS, a table to stdout and the JSON document. Exit 0 all PASS, 3 a MISS.

    bench-am-summary.py RUNS.jsonl OUT.json ITERS REPS
"""
import json
import statistics
import sys

runs_path, json_path, iters, reps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
lines = [json.loads(l) for l in open(runs_path) if l.strip()]
runs = [r for r in lines if "tool" in r]
# The rxe port's counter changes around each run (scripts/bench-am's hw_record).
hw = [r for r in lines if "hw_tool" in r]


def values(tool, get, test=None):
    """get(run) of every run of `tool` (and of `test`, for am_bench's lines), in rep order."""
    return [get(r) for r in runs if r["tool"] == tool and (test is None or r.get("test") == test)]


def phase(r, busy):
    return next(p for p in r["phases"] if p["busy"] == busy)["reply_us"]


series = {
    "ib_send_lat_t_typical_us": values("ib_send_lat", lambda r: r["t_typical_us"]),
    "ib_send_lat_events_t_typical_us": values("ib_send_lat_ev", lambda r: r["t_typical_us"]),
    "ucx_am_lat_t_typical_us": values("ucx_am_lat", lambda r: r["t_typical_us"]),
    "am_half_rtt_typical_us": values("am", lambda r: r["half_rtt_us"]["typical"], "lat"),
    "am_rtt_typical_us": values("am", lambda r: r["rtt_us"]["typical"], "lat"),
    "am_rtt_p99_us": values("am", lambda r: r["rtt_us"]["p99"], "lat"),
    "ib_send_bw_msg_rate_mpps": values("ib_send_bw", lambda r: r["msg_rate_mpps"]),
    "ucx_am_bw_msg_rate_mpps": values("ucx_am_bw", lambda r: r["msg_rate_mpps"]),
    "am_msg_rate_mpps": values("am", lambda r: r["msg_rate_mpps"], "rate"),
    "am_msg_rate_512_mpps": values("am_rate512", lambda r: r["msg_rate_mpps"], "rate"),
}
for tool, tag in (("am_attn_pt", "thread"), ("am_attn_poll", "polling"), ("am_attn_nopt", "nothread"),
                  ("wake_floor", "wakefloor")):
    for busy in ("compute", "sleep"):
        for stat in ("typical", "p99"):
            series[f"attn_{tag}_{busy}_{stat}_us"] = values(tool, lambda r: phase(r, busy)[stat])

med = {k: statistics.median(v) for k, v in series.items() if v}


def ratio(a, b):
    # A measurement that is missing gives NaN, which fails every target (an infinite ratio
    # would pass a ">=" one).
    return med[a] / med[b] if a in med and med.get(b) else float("nan")


targets = [
    ("am_half_rtt_over_ib_send_lat", ratio("am_half_rtt_typical_us", "ib_send_lat_t_typical_us"),
     "max", 1.2, "AM round trip / 2 vs ib_send_lat t_typical (both half a round trip)"),
    ("am_rate_over_ib_send_bw", ratio("am_msg_rate_mpps", "ib_send_bw_msg_rate_mpps"),
     "min", 0.8, "AM one-way message rate vs ib_send_bw MsgRate"),
    ("attn_thread_over_idle_rtt", ratio("attn_thread_compute_typical_us", "am_rtt_typical_us"),
     "max", 2.0, "reply while computing (progress thread, median) vs idle AM round trip"),
]
verdict = {n: ("PASS" if (v <= t if kind == "max" else v >= t) else "MISS") for n, v, kind, t, _ in targets}


# Per-rep ratios (each pair measured in the same rep, minutes apart): the spread of the verdict.
def per_rep(a_tool, a_get, a_test, b_tool, b_get):
    a = values(a_tool, a_get, a_test)
    b = values(b_tool, b_get)
    return [x / y for x, y in zip(a, b) if y]


ranges = {
    "am_half_rtt_over_ib_send_lat": per_rep("am", lambda r: r["half_rtt_us"]["typical"], "lat",
                                            "ib_send_lat", lambda r: r["t_typical_us"]),
    "am_rate_over_ib_send_bw": per_rep("am", lambda r: r["msg_rate_mpps"], "rate",
                                       "ib_send_bw", lambda r: r["msg_rate_mpps"]),
}

g = med.get
print(f"\nmedians over {reps} reps (8-byte messages; latencies are half a round trip unless 'RTT'):")
print(f"{'':34} {'t_typical[usec]':>16} {'MsgRate[Mpps]':>14}")
rows = [
    ("ib_send_lat / ib_send_bw", g("ib_send_lat_t_typical_us"), g("ib_send_bw_msg_rate_mpps")),
    ("ucx_perftest am_lat / am_bw", g("ucx_am_lat_t_typical_us"), g("ucx_am_bw_msg_rate_mpps")),
    ("firehose AM (RTT/2) / one-way", g("am_half_rtt_typical_us"), g("am_msg_rate_mpps")),
]
for label, lat, rate in rows:
    print(f"{label:34} {lat if lat is not None else float('nan'):16.2f} {rate if rate is not None else float('nan'):14.6f}")
if "ib_send_lat_events_t_typical_us" in med:
    print(f"ib_send_lat -e (sleeps on completion events): t_typical {med['ib_send_lat_events_t_typical_us']:.2f} usec "
          f"(RTT {2 * med['ib_send_lat_events_t_typical_us']:.2f})")
print(f"firehose AM idle RTT: median {g('am_rtt_typical_us'):.2f} usec, p99 {g('am_rtt_p99_us'):.2f} usec")
for tag, what in (("thread", "FH_PROGRESS_THREAD=1"), ("polling", "thread, FH_PROGRESS_SPIN_US=inf"),
                  ("nothread", "FH_PROGRESS_THREAD=0")):
    for busy in ("compute", "sleep"):
        k = f"attn_{tag}_{busy}"
        if f"{k}_typical_us" in med:
            print(f"reply while rank 1 {busy:7}s, {what}: median {med[k + '_typical_us']:10.1f} usec, "
                  f"p99 {med[k + '_p99_us']:10.1f} usec")
# The floor under any progress thread that sleeps (wake_floor: a pipe, no RDMA, same phases and
# CPUs): informative, the target stays the idle RTT.
if "attn_wakefloor_compute_typical_us" in med:
    wf = {b: med[f"attn_wakefloor_{b}_typical_us"] for b in ("compute", "sleep")}
    print(f"wake-up floor (wake_floor: a thread sleeping in poll() answers a pipe write from the other CPU): "
          f"median {wf['compute']:.1f} usec while its process computes, {wf['sleep']:.1f} while it sleeps"
          + (f"; {wf['compute'] / med['am_rtt_typical_us']:.1f}x the idle AM RTT" if med.get("am_rtt_typical_us") else ""))
    if "attn_thread_compute_typical_us" in med:
        print(f"  firehose's reply while computing (progress thread) / this floor: "
              f"{med['attn_thread_compute_typical_us'] / wf['compute']:.2f}")
if "am_msg_rate_512_mpps" in med and med.get("ib_send_bw_msg_rate_mpps"):
    r512 = per_rep("am_rate512", lambda r: r["msg_rate_mpps"], "rate", "ib_send_bw", lambda r: r["msg_rate_mpps"])
    print(f"firehose AM one-way with FH_AM_RECV_DEPTH=512 (ib_send_bw's receive depth): "
          f"{med['am_msg_rate_512_mpps']:.6f} Mpps, "
          f"{med['am_msg_rate_512_mpps'] / med['ib_send_bw_msg_rate_mpps']:.2f}x ib_send_bw"
          + (f" (per rep {min(r512):.2f}-{max(r512):.2f})" if r512 else ""))
if "attn_polling_compute_typical_us" in med and med.get("am_rtt_typical_us"):
    print(f"  (a progress thread that never sleeps: reply while computing / idle RTT "
          f"{med['attn_polling_compute_typical_us'] / med['am_rtt_typical_us']:.2f})")
# Retransmissions and the like, summed over reps per tool: a run with retries waited for rxe's
# retransmit timer (ack timeout) at least once.
hw_sum = {}
for r in hw:
    d = hw_sum.setdefault(r["hw_tool"], {})
    for k, v in r["hw"].items():
        d[k] = d.get(k, 0) + v
interesting = ("completer_retry_err", "duplicate_request", "rcvd_rnr_err", "send_rnr_err",
               "retry_exceeded_err", "out_of_seq_request", "rcvd_seq_err", "ack_deferred")
if hw_sum:
    print("\nrxe hw_counters over all reps (only those that moved; rdma_sends/sent_pkts for scale):")
    for tool, d in hw_sum.items():
        shown = ", ".join(f"{k} {d[k]}" for k in ("rdma_sends",) + interesting if d.get(k))
        if shown:  # wake_floor sends nothing over rxe: no row
            print(f"  {tool:16} {shown}")
print()
for n, v, kind, t, what in targets:
    rr = ranges.get(n)
    spread = f" (per rep {min(rr):.2f}-{max(rr):.2f})" if rr else ""
    op = "<=" if kind == "max" else ">="
    print(f"{what}: {v:.2f}{spread} (target {op} {t})  {verdict[n]}")

doc = {
    "bench": "bench-am", "bytes": 8, "iterations": iters, "reps": reps,
    "median": med, "series": series,
    "ratios": {n: (v if v == v else None) for n, v, *_ in targets},  # NaN (missing) as null
    "per_rep_ratios": ranges,
    "targets": {n: {kind: t, "result": verdict[n]} for n, _, kind, t, _ in targets},
    "runs": runs,
    "hw_counters": hw_sum,
}
with open(json_path, "w") as f:
    json.dump(doc, f, indent=1)
sys.exit(0 if all(v == "PASS" for v in verdict.values()) else 3)
