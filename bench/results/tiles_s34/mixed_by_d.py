"""Issue 35, session 34: the whole-tiles term at the live steps by decode count, without the schedule.

Session 33's `mixed_tiles_steps.py` gives each part's busy mixed steps one total; with the term on, four older H200
parts read over live (6.7b-s16: 1.0085 -> 1.0218). This splits the same steps (busy: no idle before; a prefill chunk
and decodes) into bins of decode count d and prints the cost model over live in each, off and on, with the slope
of each over d (least squares on the bins' ratios, weighted by their step counts): the term is meant to take out a
slope (the decodes' partial tiles grow with d), not a level.

    python bench/results/tiles_s34/mixed_by_d.py PART_DIR...
"""
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench/results/fidelity_grid_h100_s21/analysis"))
from prefill_bins import load

from bench.simulator import fidelity_steps

BINS = ((1, 8), (9, 16), (17, 32), (33, 48), (49, 64), (65, 128))


def main(parts: list[Path]) -> None:
    head = "  ".join(f"d {lo:>2}-{hi:<3}" for lo, hi in BINS)
    for part in parts:
        steps, _bad, cost, _terms = load(part)
        busy = [i for i, s in enumerate(steps) if s["p"] and s["d"] and not s["idle_before"]]
        print(f"\n{part.resolve().relative_to(ROOT / 'bench/results')}  ({len(busy)} busy mixed steps)")
        print(f"  {'':8s} {head}   slope/64 d")
        for on in (False, True):
            cost.mixed_tiles = on
            cost._memo.clear()
            m = {i: t for i, t, _ in fidelity_steps.model_step_ms(cost, steps)}
            cells, xs, ys, ws = [], [], [], []
            for lo, hi in BINS:
                sel = [i for i in busy if lo <= steps[i]["d"] <= hi]
                if len(sel) < 20:
                    cells.append(f"{'-':>10s}")
                    continue
                r = sum(m[i] for i in sel) / sum(steps[i]["ms"] for i in sel)
                cells.append(f"{r:6.4f}({len(sel):>3d})"[:10].rjust(10))
                xs.append(np.mean([steps[i]["d"] for i in sel]))
                ys.append(r)
                ws.append(len(sel))
            slope = np.polyfit(xs, ys, 1, w=np.sqrt(ws))[0] * 64 if len(xs) >= 2 else float("nan")
            print(f"  {'on' if on else 'off':8s} {'  '.join(cells)}   {slope:+.4f}")


if __name__ == "__main__":
    main([Path(p) for p in sys.argv[1:]])
