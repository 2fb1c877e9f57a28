"""Issue 35, session 33: tally `mixed_tiles_compare.sh`'s tables: per part, intervals and means inside the bound
to 0.95x, same prefill chunks at 0.8 / 0.95x, and TTFT / TPOT P50 at each load, default form against mixed tiles.

    python bench/results/conditioned_s33/mixed_tiles_count.py DIR NAME...
"""
import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from bench.simulator.fidelity_table import cells


def tally(path: Path) -> dict:
    out = {"inside": 0, "means": 0, "cells": 0, "p50": {}, "chunks": {}}
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    for r in cells(json.loads(text)):
        if r["load"] not in ("0.5x", "0.8x", "0.95x"):
            continue
        for f in r["figures"].values():
            out["cells"] += 1
            out["inside"] += f["inside"]
            out["means"] += f["mean_inside"]
        out["p50"][r["load"]] = (100 * r["figures"]["ttft_p50"]["mean"], 100 * r["figures"]["tpot_p50"]["mean"])
        if r["same_chunks"]:
            out["chunks"][r["load"]] = 100 * r["same_chunks"][0]
    return out


def main(d: Path, names: list[str]) -> None:
    print("| part | form | intervals inside | means inside | TTFT / TPOT P50 at 0.5 / 0.8 / 0.95x (%) "
          "| same chunks 0.8 / 0.95x |")
    print("|---|---|---|---|---|---|")
    tot = {"default": [0, 0, 0], "tiles": [0, 0, 0]}
    for n in names:
        for form in ("default", "tiles"):
            f = d / f"{n}_{form}.json"
            if not f.exists():
                f = f.with_suffix(".json.gz")  # as committed
            if not f.exists():
                continue
            t = tally(f)
            tot[form][0] += t["inside"]
            tot[form][1] += t["means"]
            tot[form][2] += t["cells"]
            p50 = " / ".join(f"{a:+.1f}, {b:+.1f}" for a, b in t["p50"].values())
            ch = " / ".join(f"{t['chunks'].get(x, float('nan')):.1f}" for x in ("0.8x", "0.95x"))
            print(f"| {n} | {form} | {t['inside']} / {t['cells']} | {t['means']} / {t['cells']} | {p50} | {ch} |")
    for form, (i, m, c) in tot.items():
        print(f"\n{form}: intervals inside {i} of {c}, means inside {m} of {c}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), sys.argv[2:])
