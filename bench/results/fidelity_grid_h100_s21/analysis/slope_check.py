"""Issue 35, session 20: the live decode-only steps of d sequences (d 1-16, not after idle) fitted
as a line in their total context, against the same line through the model's times at those steps.
Run from the repo root: python slope_check.py PART_DIR"""
import sys
from pathlib import Path

import numpy as np
from prefill_bins import load

from bench.simulator import fidelity_steps as fs

part = Path(sys.argv[1]); tag = part.name
steps, bad, cost, terms = load(part)
res = {i: t for i, t, f in fs.model_step_ms(cost, steps)}
print(tag, "coef", np.round(cost.coef * 1e3, 6), "cols", cost._cols)
for d in (1, 2, 4, 8, 16):
    sel = [i for i, s in enumerate(steps) if i in res and s["d"] == d and not s["p"] and not s["idle_before"]]
    if len(sel) < 30: continue
    x = np.array([steps[i]["ctx"] for i in sel], float); y = np.array([steps[i]["ms"] for i in sel]); m = np.array([res[i] for i in sel])
    A = np.stack([np.ones_like(x), x], 1)
    bl = np.linalg.lstsq(A, y, rcond=None)[0]; bm = np.linalg.lstsq(A, m, rcond=None)[0]
    print(f"  d {d:2d}: n {len(sel)} total ctx {x.min():.0f}-{x.max():.0f}: live {bl[0]:.3f} + {bl[1]*1e3:.4f} ms/1k tok;  model {bm[0]:.3f} + {bm[1]*1e3:.4f} ms/1k tok")
