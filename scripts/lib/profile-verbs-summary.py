#!/usr/bin/env python3
"""The table of scripts/profile-verbs: instructions per op from callgrind's dumps.

  profile-verbs-summary.py DIR OPS [--json]

DIR holds callgrind.<program>.<pid>.<dump>-<thread> files (program `shmem` or `mpi`: the two
builds of rma_interleaved --count). A dump is named by its client request, e.g. `fh_get pass 2`;
thread 01 is the one that ran the ops. Each dump's self cost is summed by the object file that
ran it (the raw format: a cost line belongs to the current `ob=`, except the line after `calls=`,
which is the callee's inclusive cost), so the groups add up to the dump's total.
Exit 1 when a dump it needs is missing or the two programs disagree on Firehose's counts.
"""
import glob
import json
import os
import re
import sys

GROUPS = [
    ("provider", ("libibverbs", "librxe", "libmlx", "librdmacm", "libefa")),
    ("libc", ("libc.so",)),
    ("loader", ("ld-linux",)),
    ("firehose", ("libfirehose",)),
    ("stack", ("liboshmem", "libucp", "libuct", "libucs", "libucm", "libmpi", "libopen-", "mca_")),
    ("program", ("rma_interleaved",)),
]
NAMES = [g for g, _ in GROUPS] + ["other"]


def group_of(obj):
    for g, pats in GROUPS:
        if any(p in obj for p in pats):
            return g
    return "other"


# Firehose's paths, by the inclusive cost of the functions that hold them (Rust symbols).
# A path's value is the largest of its symbols' (the C exports call `start_in` / `wait_in`,
# which `start` / `wait` wrap: the wrapper's cost holds the inner one's).
PATHS = [
    ("post", ("firehose::rma::engine::Rma::start", "firehose::rma::engine::Rma::start_in")),
    ("link_post", ("<firehose::net::verbs::link::VerbsLink as firehose::net::link::Link>::rdma",)),
    ("wait", ("firehose::rma::engine::Rma::wait", "firehose::rma::engine::Rma::wait_in")),
    ("link_poll", ("<firehose::net::verbs::link::VerbsLink as firehose::net::link::Link>::poll",)),
]

NAMED = re.compile(r"^(ob|fl|fi|fe|fn|cob|cfi|cfl|cfn)=(?:\((\d+)\))?\s*(.*)$")


def parse(path):
    """(dump name, total, {group: self cost}, {path: inclusive cost})."""
    names = {}
    desc, total, ob, fn = None, None, "?", "?"
    by = dict.fromkeys(NAMES, 0)
    incl = {}
    skip_next = False
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("desc: Trigger: Client Request: "):
                desc = line.split(": ", 3)[3].strip()
                continue
            if line.startswith("summary:") or line.startswith("totals:"):
                total = int(line.split()[1])
                continue
            m = NAMED.match(line)
            if m:
                kind, ident, name = m.groups()
                # Three name spaces: objects, functions (fn, cfn) and files (fl, fi, fe, cfi, cfl).
                space = "ob" if kind in ("ob", "cob") else "fn" if kind in ("fn", "cfn") else "fl"
                key = (space, ident)
                if ident is not None and name:
                    names[key] = name
                elif ident is not None:
                    name = names.get(key, "?")
                if kind == "ob":
                    ob = name
                elif kind == "fn":
                    fn = name
                continue
            if line.startswith("calls="):
                skip_next = True
                continue
            if line[:1].isdigit() or line[:1] in "+-*":
                parts = line.split()
                if len(parts) < 2:
                    continue
                incl[fn] = incl.get(fn, 0) + int(parts[1])
                if skip_next:
                    skip_next = False
                    continue
                by[group_of(ob)] += int(parts[1])
    paths = {k: max(incl.get(sym, 0) for sym in syms) for k, syms in PATHS}
    return desc, total, by, paths


def main():
    args = [a for a in sys.argv[1:] if a != "--json"]
    as_json = "--json" in sys.argv[1:]
    d, ops = args[0], int(args[1])
    runs = {}  # (program, dump name) -> (total, by)
    for path in glob.glob(os.path.join(d, "callgrind.*-01")):
        prog = os.path.basename(path).split(".")[1]
        desc, total, by, paths = parse(path)
        if desc and desc.endswith("pass 2") and total is not None:
            if sum(by.values()) != total:
                print(f"profile-verbs: {path}: groups {sum(by.values())} != total {total}", file=sys.stderr)
                return 1
            runs[(prog, desc[: -len(" pass 2")])] = (total, by, paths)
    need = [(p, f"{w}_{k}") for p in ("shmem", "mpi") for w in ("fh", p) for k in ("get", "put")]
    missing = [f"{p}: {n}" for p, n in need if (p, n) not in runs]
    if missing:
        print("profile-verbs: no dump for " + ", ".join(missing) + f" in {d}", file=sys.stderr)
        return 1
    per = lambda p, n: runs[(p, n)][0] / ops  # noqa: E731
    for k in ("get", "put"):
        a, b = per("shmem", f"fh_{k}"), per("mpi", f"fh_{k}")
        # One library, two programs: Firehose's count must agree (within 2 %: the programs'
        # anchors leave different state behind, e.g. in the progress thread's wake-ups).
        if abs(a - b) > 0.02 * max(a, b):
            print(f"profile-verbs: fh_{k} counts differ between programs: {a:.0f} and {b:.0f}", file=sys.stderr)
            return 1
    res = {"tool": "profile-verbs", "ops": ops}
    for k in ("get", "put"):
        fh = per("shmem", f"fh_{k}")
        res[f"{k}_fh"] = round(fh, 1)
        res[f"{k}_shmem"] = round(per("shmem", f"shmem_{k}"), 1)
        res[f"{k}_mpi"] = round(per("mpi", f"mpi_{k}"), 1)
        res[f"{k}_fh_over_shmem"] = round(fh / res[f"{k}_shmem"], 4)
        res[f"{k}_fh_over_mpi"] = round(fh / res[f"{k}_mpi"], 4)
        for prog, name in (("shmem", f"fh_{k}"), ("shmem", f"shmem_{k}"), ("mpi", f"mpi_{k}")):
            by = runs[(prog, name)][1]
            res[f"{name}_by"] = {g: round(by[g] / ops, 1) for g in NAMES if by[g]}
        paths = runs[("shmem", f"fh_{k}")][2]
        res[f"fh_{k}_paths"] = {p: round(v / ops, 1) for p, v in paths.items()}
    if as_json:
        print(json.dumps(res))
        return 0
    print(f"# profile-verbs: user-space instructions per 8 B op, rank 0's calling thread, {ops} ops per run (callgrind, second pass)")
    print(f"{'#op':<6} {'fh':>9} {'shmem':>9} {'mpi':>9} {'fh/shmem':>9} {'fh/mpi':>9}")
    for k in ("get", "put"):
        print(f"{k:<6} {res[k + '_fh']:>9.0f} {res[k + '_shmem']:>9.0f} {res[k + '_mpi']:>9.0f} "
              f"{res[k + '_fh_over_shmem']:>9.3f} {res[k + '_fh_over_mpi']:>9.3f}")
    print("# fh: fh_get / fh_put; shmem: shmem_getmem / shmem_putmem + shmem_quiet; mpi: MPI_Get / MPI_Put + MPI_Win_flush (osc ucx)")
    print("# by object, per op: provider = librxe/libibverbs (work request, doorbell call, CQ poll); "
          "firehose / stack = the library measured (libfirehose, or UCX + Open MPI)")
    print(f"{'#run':<10} " + " ".join(f"{g:>9}" for g in NAMES))
    for k in ("get", "put"):
        for name in (f"fh_{k}", f"shmem_{k}", f"mpi_{k}"):
            by = res[f"{name}_by"]
            print(f"{name:<10} " + " ".join(f"{by.get(g, 0):>9.0f}" for g in NAMES))
    print("# fh's paths, per op (inclusive: each with what it calls, the provider's share too)")
    for k in ("get", "put"):
        pa = res[f"fh_{k}_paths"]
        print(f"# fh_{k}: post (Rma::start_in) {pa['post']:.0f}, of which the link's post "
              f"(VerbsLink::rdma) {pa['link_post']:.0f}; wait and completion (Rma::wait_in) "
              f"{pa['wait']:.0f}, of which the link's poll (VerbsLink::poll) {pa['link_poll']:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
