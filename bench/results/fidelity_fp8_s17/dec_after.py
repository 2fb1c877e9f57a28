"""Issue 35 s17 (H35Q): decode-only steps by decode bucket x what ran before (a step with prefill /
decode-only), model / live, and by the j-th decode-only step after the last step with prefill.

    python dec_after.py PART_DIR
"""
import sys
from itertools import pairwise
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from step_bins import build, load_steps

from bench.simulator.fidelity_steps import model_step_ms

part = Path(sys.argv[1])
cost, terms, prof = build(part, None)
steps, _ = load_steps(part)
model = {k: t for k, t, _f in model_step_ms(cost, steps)}
j, since = [], 99
for s in steps:
    since = 0 if s["p"] else min(since + 1, 99)
    j.append(since)
print(f"== {part.name}: decode-only (not after idle): model / live by bucket and by steps since the last prefill step")
edges = [0, 16, 32, 48, 64, 96, 128]
print(f"{'d':>8s} " + " ".join(f"{'j=' + str(a):>14s}" for a in ("1", "2", "3-5", "6+")))
for lo, hi in pairwise(edges):
    row = []
    for a, b in ((1, 1), (2, 2), (3, 5), (6, 99)):
        sel = [k for k, s in enumerate(steps) if not s["p"] and s["d"] and not s["idle_before"] and lo < s["d"] <= hi
               and a <= j[k] <= b and k in model]
        if sel:
            lv = np.array([steps[k]["ms"] for k in sel]); md = np.array([model[k] for k in sel])
            row.append(f"{md.sum() / lv.sum():.3f} ({len(sel):4d})")
        else:
            row.append(f"{'-':>14s}")
    print(f"{lo + 1:3d}-{hi:<4d} " + " ".join(f"{x:>14s}" for x in row))
