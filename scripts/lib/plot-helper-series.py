#!/usr/bin/env python3
"""Pinned bytes over time for helper_bench's three modes (no cache, lazy, helper), one row per
program, measured runs on the left, modelled ones on the right. Reads the CSV files
helper_bench --series DIR wrote (<program>-<mode>[-model].csv: ms,bytes) and writes one PNG.

usage: plot-helper-series.py SERIES_DIR OUT.png
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MODES = [("nocache", "no cache", "tab:gray"), ("lazy", "lazy cache", "tab:red"),
         ("helper", "helper thread", "tab:blue")]
PROGRAMS = ["fig1", "cg", "mg"]


def load(path):
    xs, ys = [], []
    with open(path) as f:
        for row in csv.DictReader(f):
            xs.append(float(row["ms"]))
            ys.append(int(row["bytes"]) / (1 << 20))
    return xs, ys


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, out = sys.argv[1], sys.argv[2]
    progs = [p for p in PROGRAMS if os.path.exists(os.path.join(src, f"{p}-lazy.csv"))]
    if not progs:
        sys.exit(f"no series in {src}")
    fig, axes = plt.subplots(len(progs), 2, figsize=(13, 3.2 * len(progs)), squeeze=False)
    for row, prog in enumerate(progs):
        for col, (suffix, kind) in enumerate([("", "measured"), ("-model", "modelled")]):
            ax = axes[row][col]
            for mode, label, color in MODES:
                path = os.path.join(src, f"{prog}-{mode}{suffix}.csv")
                if not os.path.exists(path):
                    continue
                xs, ys = load(path)
                avg = 0.0
                if len(xs) > 1 and xs[-1] > 0:
                    avg = sum(ys[i] * (xs[i + 1] - xs[i]) for i in range(len(xs) - 1)) / xs[-1]
                ax.step(xs, ys, where="post", color=color, linewidth=1.2,
                        label=f"{label} (avg {avg:.2f} MiB)")
            ax.set_title(f"{prog}: pinned bytes over time ({kind})", fontsize=10)
            ax.set_xlabel("ms")
            ax.set_ylabel("MiB pinned")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"plot-helper-series: wrote {out}")


if __name__ == "__main__":
    main()
