"""Issue 35, session 36: a `sim validate` log's per-run lines (live / sim of its own simulation: generated arrivals,
no delivery path) as the mean error a load with its range, for a part whose validate JSON was lost.

    python bench/results/pairs_s36/log_runs.py VALIDATE_LOG
"""
import re
import sys
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"load (\S+) rate \S+ seed (\d+): (.*?)\s+\[loadavg")
FIG = re.compile(r"(\w+) ([\d.]+)/([\d.]+) \(")


def main() -> None:
    by = defaultdict(lambda: defaultdict(list))
    for m in LINE.finditer(Path(sys.argv[1]).read_text()):
        for name, live, sim in FIG.findall(m.group(3)):
            by[m.group(1)][name].append(100 * (float(sim) / float(live) - 1))
    for load, figs in by.items():
        n = len(next(iter(figs.values())))
        print(f"{load} ({n} seeds): " + ", ".join(
            f"{k} {sum(v) / len(v):+.1f} [{min(v):+.1f}, {max(v):+.1f}]" for k, v in figs.items()))


if __name__ == "__main__":
    main()
