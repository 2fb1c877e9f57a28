"""Issue 35, session 33: within each d bin, does live / raw model of the busy one-chunk (256-token) mixed steps rise
with the decodes' spread? Least squares of live / raw on max / mean - 1, and on the raw surface' own rise if every
decode were charged at the longest context ((raw@max - raw) / raw: 0 = the mean is right, 1 = the max is).

    python bench/results/conditioned_s33/spread_regression.py PART_DIR
"""
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / 'bench/results/fidelity_grid_h100_s21/analysis'))
from prefill_bins import load

part = Path(sys.argv[1])
steps, bad, cost, terms = load(part)
rows = []
for i, s in enumerate(steps):
    if s["p"] == 256 and s["d"] >= 8 and not s["idle_before"] and len(s["chunks"]) == 1:
        c = np.array(s["ctxs"]); d = s["d"]
        raw = 1e3 * cost.step_time(d, 256, s["ctx"], s["chunks"])
        rmax = 1e3 * cost.step_time(d, 256, int(c.max()) * d + s["ctx"] - int(c.sum()), s["chunks"])
        rows.append((d, s["ms"] / raw, c.max() / c.mean() - 1, c.std() / c.mean(), s["chunks"][0][1] > 0, (rmax - raw) / raw, s["ms"]))
a = np.array(rows, dtype=float)
for lo, hi in ((8, 15), (16, 31), (32, 47), (48, 63)):
    m = (a[:, 0] >= lo) & (a[:, 0] <= hi)
    x = a[m]
    for later in (0, 1):
        y = x[x[:, 4] == later]
        if len(y) < 30: continue
        # live/raw against (max/mean - 1): slope, and against the raw charge at max - raw (fraction)
        A = np.c_[np.ones(len(y)), y[:, 2]]
        co, *_ = np.linalg.lstsq(A, y[:, 1], rcond=None)
        B = np.c_[np.ones(len(y)), y[:, 5]]
        cb, *_ = np.linalg.lstsq(B, y[:, 1], rcond=None)
        q = np.quantile(y[:, 2], [0.1, 0.5, 0.9])
        print(f"d {lo}-{hi} {'later' if later else 'first'} n {len(y)}: live/raw mean {y[:,1].mean():.4f}; vs max/mean-1 (q10-50-90 {q[0]:.3f} {q[1]:.3f} {q[2]:.3f}): {co[0]:.4f} + {co[1]:.3f} x;  vs (raw@max-raw)/raw (mean {y[:,5].mean():.4f}): {cb[0]:.4f} + {cb[1]:.3f} x")
