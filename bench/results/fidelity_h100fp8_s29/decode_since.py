"""Issue 35, session 29: the same by the time since the last prefill step.
    python bench/results/fidelity_h100fp8_s29/decode_since.py PART_DIR"""
import collections
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from live_part import POW2, load_part

part = Path(sys.argv[1])
rows, steps, cost = load_part(part)
by = collections.defaultdict(list)
last_p = None
edges = [0, 10, 20, 40, 80, 160, 320, 1e9]
for i, s in enumerate(steps):
    if s["p"]:
        last_p = rows[i]["mono"]; continue
    if s["idle_before"]:
        last_p = None; continue
    if max(s["ctxs"]) > 1.15 * s["ctx"] / s["d"] or last_p is None: continue
    dv = rows[i].get("device_ms")
    if dv is None: continue
    since = 1e3 * (rows[i]["mono"] - last_p)
    b = next(j for j in range(len(edges) - 1) if since < edges[j + 1])
    grp = "pow2" if s["d"] in POW2 else "other"
    by[(grp, b)].append((dv, 1e3 * cost.step_time(s["d"], 0, s["ctx"])))
for k in sorted(by):
    a = np.array(by[k]); print(k[0], f"{edges[k[1]]}-{edges[k[1]+1]} ms since prefill", len(a), round(a[:,0].sum()/a[:,1].sum(), 4))
