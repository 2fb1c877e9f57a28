"""Slow attainment by rate over seeds 0-4 (mean / min / max, %) and the refusals, from study.json
(`study.py`): how far the schedule alone moves it at one rate.

    python3 bench/results/slo_gap_class_s15/by_rate.py study.json > by_rate.txt
"""
from __future__ import annotations

import json
import sys


def main(path: str) -> int:
    with open(path) as fh:
        runs = json.load(fh)["runs"]
    variants = sorted({r["variant"] for r in runs}, key=["base", "overtake", "overtake_h5"].index)
    for scale in (1.0, 1.1):
        print(f"\n## profile x {scale}: Slow attainment % over seeds 0-4, mean / min / max (Slow refused)\n")
        rates = sorted({r["rate"] for r in runs if r["n"] == 400})
        print("| variant | " + " | ".join(f"{x:g} req/s" for x in rates) + " |")
        print("|---" * (len(rates) + 1) + "|")
        for v in variants:
            cells = []
            for x in rates:
                rs = [r for r in runs if r["variant"] == v and r["rate"] == x and r["n"] == 400
                      and r["step_scale"] == scale]
                a = [100 * r["classes"]["slow"]["attainment"] for r in rs]
                ref = sum(r["classes"]["slow"]["refused"] for r in rs)
                cells.append(f"{sum(a) / len(a):.1f} / {min(a):.1f} / {max(a):.1f} ({ref})")
            print(f"| {v} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else "study.json"))
