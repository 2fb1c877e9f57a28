"""Issue 35, session 29: the same by the contexts' spread (max / mean).
    python bench/results/fidelity_h100fp8_s29/decode_spread.py PART_DIR"""
import collections
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from live_part import POW2, load_part

part = Path(sys.argv[1])
rows, steps, cost = load_part(part)
by = collections.defaultdict(list)
edges = [1.0, 1.02, 1.04, 1.07, 1.1, 1.15, 1.3]
for i, s in enumerate(steps):
    if s["p"] or s["idle_before"] or s["d"] < 5: continue
    mm = max(s["ctxs"]) / (s["ctx"] / s["d"])
    if mm >= edges[-1]: continue
    dv = rows[i].get("device_ms")
    if dv is None: continue
    b = next(j for j in range(len(edges) - 1) if mm < edges[j + 1])
    grp = "pow2" if s["d"] in POW2 else "other"
    mn = min(s["ctxs"]) / (s["ctx"] / s["d"])
    by[(grp, b)].append((dv, 1e3 * cost.step_time(s["d"], 0, s["ctx"]), mn))
for k in sorted(by):
    a = np.array(by[k]); print(k[0], f"max/mean {edges[k[1]]}-{edges[k[1]+1]}", len(a), round(a[:,0].sum()/a[:,1].sum(), 4), "min/mean", round(a[:,2].mean(),3))
