"""Reading perftest's result tables (ib_write_lat, ib_read_bw, ...) for the summary scripts."""
import math
import os


def column(path, size, col):
    """The value in column `col` (1-based) of the result row that starts with `size` in the
    perftest log at `path`; None if the file, the row or a finite number is missing (perftest -F
    prints inf when its clock check fails)."""
    if not os.path.exists(path):
        return None
    v = None
    for line in open(path, errors="replace"):
        f = line.split()
        if len(f) >= col and f[0] == str(size):
            try:
                x = float(f[col - 1])
                v = x if math.isfinite(x) else v
            except ValueError:
                pass
    return v
