"""Issue 35, session 36: per grid part and replay form, the intervals and means inside the bound to 0.95x.

    python bench/results/pairs_s36/count_forms.py DIR

Reads DIR/<part>_<form>.json (validate_replay JSONs, as `tiles_pairless.sh` writes them), pools the parts that one
cell's calls measured (as `fidelity_grid_state/run.sh` does), and prints one line a part: per form the intervals
inside / 15, the means inside / 15 and TPOT P50 at 0.5 / 0.8 / 0.95x; then the totals a form.
"""
import json
import pathlib
import sys

from bench.simulator.fidelity_table import cells, pool

LOADS = ("0.5x", "0.8x", "0.95x")
# one cell measured over several calls -> the parts pooled (fidelity_grid_state/run.sh)
POOLS = {"33b-5seeds": ("33b-s11", "33b-s13"), "6.7b-mixed-s25-5seeds": ("6.7b-mixed-s25", "6.7b-mixed-s25-4"),
         "33b-mixed-s25-3seeds": ("33b-mixed-s25-1", "33b-mixed-s25-2")}


def score(doc: dict) -> tuple[int, int, str]:
    cs = [c for c in cells(doc) if c["load"] in LOADS]
    inside = sum(f["inside"] for c in cs for f in c["figures"].values())
    means = sum(f["mean_inside"] for c in cs for f in c["figures"].values())
    tpot = " / ".join(f"{100 * c['figures']['tpot_p50']['mean']:+.1f}" for c in cs)
    return inside, means, tpot


def main() -> None:
    d = pathlib.Path(sys.argv[1])
    docs: dict[tuple[str, str], dict] = {}
    for f in sorted(d.glob("*_*.json")):
        part, form = f.stem.rsplit("_", 1)
        docs[(part, form)] = json.loads(f.read_text())
    forms = sorted({k[1] for k in docs}, key=lambda x: (x != "default", x))
    for name, members in POOLS.items():
        for form in forms:
            if all((m, form) in docs for m in members):
                docs[(name, form)] = pool([docs.pop((m, form)) for m in members])
    parts = sorted({k[0] for k in docs}, key=lambda p: (p.startswith("h100"), p))
    totals = {f: [0, 0] for f in forms}
    print("part".ljust(22) + "".join(f"| {f}: intervals, means, TPOT P50 %".ljust(46) for f in forms))
    for p in parts:
        row = p.ljust(22)
        for f in forms:
            if (p, f) not in docs:
                row += "| -".ljust(46)
                continue
            i, m, t = score(docs[(p, f)])
            totals[f][0] += i
            totals[f][1] += m
            row += f"| {i:2d} {m:2d}  {t}".ljust(46)
        print(row)
    print("total".ljust(22) + "".join(f"| {totals[f][0]:3d} {totals[f][1]:3d}".ljust(46) for f in forms))


if __name__ == "__main__":
    main()
