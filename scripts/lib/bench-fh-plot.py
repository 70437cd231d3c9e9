#!/usr/bin/env python3
"""Figs. 3, 4 and 5 of scripts/bench-fh as PNGs, drawn from bench-fh.json (matplotlib, Agg
backend: no display, its own fonts). Vertical lines mark M and M + MAXVICTIM.

    bench-fh-plot.py BENCH-FH.JSON OUTDIR
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

doc = json.load(open(sys.argv[1]))
out = sys.argv[2]
sw = doc.get("sweeps", doc)
cfg = sw.get("config", {})
m, victim = cfg.get("m", 0), cfg.get("max_victim", 0)
STYLE = {
    "firehose": dict(color="tab:red", marker="o", label="Firehose"),
    "rdv_nounpin": dict(color="tab:blue", marker="s", label="Rendezvous no-unpin"),
    "rdv_unpin": dict(color="tab:green", marker="^", label="Rendezvous with-unpin"),
    "floor": dict(color="black", marker="x", linestyle="--", label="registered once (floor)"),
}
SUB = "Soft-RoCE (rxe) in a TCG VM: compare within the figure, not with hardware"


def knees(ax):
    if m:
        ax.axvline(m / 1024, color="grey", linestyle=":", linewidth=1)
        ax.text(m / 1024, ax.get_ylim()[1], " M", va="top", fontsize=8, color="grey")
    if m and victim:
        ax.axvline((m + victim) / 1024, color="grey", linestyle="-.", linewidth=1)
        ax.text((m + victim) / 1024, ax.get_ylim()[1], " M+MAXVICTIM", va="top", fontsize=8, color="grey")


def plot(rows, x, y, xlabel, ylabel, title, fname, logx=False, logy=False, mark=True, extra=()):
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for name, st in STYLE.items():
        pts = sorted((r[x], r[y]) for r in rows if r["series"] == name)
        if pts:
            xs = [p[0] / 1024 if x == "working_set" else p[0] for p in pts]
            ax.plot(xs, [p[1] for p in pts], **st)
    for label, st, pts in extra:
        if pts:
            ax.plot([p[0] / 1024 for p in pts], [p[1] for p in pts], label=label, **st)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title + "\n" + SUB, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    if mark:
        knees(ax)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out, fname)
    fig.savefig(path)
    plt.close(fig)
    print(f"bench-fh-plot: wrote {path}")


page = doc.get("sweeps_page_mode") or {}
page_fh = sorted((r["working_set"], r["t_typical_us"]) for r in page.get("lat", []) if r["series"] == "firehose")
plot(sw.get("lat", []), "working_set", "t_typical_us", "random remote working set [KiB]",
     "8-byte put latency, median [us]", "Fig. 3: put latency vs. remote working set",
     "fig3.png", logy=True,
     extra=[("Firehose, page mode (FH_MAXREGION=4k)", dict(color="tab:orange", marker="o", linestyle=":"), page_fh)])
plot(sw.get("bw", []), "working_set", "bw_peak_mb_s", "random remote working set [KiB]",
     "64 KiB put bandwidth, best batch [MB/s]", "Fig. 4: put bandwidth vs. remote working set", "fig4.png")
plot(sw.get("peak", []), "bytes", "bw_peak_mb_s", "message size [bytes]", "put bandwidth, best batch [MB/s]",
     "Fig. 5: peak put bandwidth by message size", "fig5.png", logx=True, logy=True, mark=False)
