"""Issue 35, session 29: the same by the contexts' spread (max / mean).
    python bench/results/fidelity_h100fp8_s29/decode_dspread.py PART_DIR  (from the repo root)"""
import collections
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, ".")
sys.path.insert(0, "bench/results/fidelity_grid_h100_s21/analysis")
from prefill_bins import load

from bench.simulator import fidelity_steps as fs

part = Path(sys.argv[1]); tag = part.name
rows = [r for r in fs.read_steps(part / f"steps_{tag}.jsonl.gz") if "mono" in r]
steps, bad, cost, terms = load(part)
by = collections.defaultdict(list)
edges = [1.0, 1.02, 1.04, 1.07, 1.1, 1.15, 1.3]
for i, s in enumerate(steps):
    if s["p"] or s["idle_before"] or s["d"] < 5: continue
    mm = max(s["ctxs"]) / (s["ctx"] / s["d"])
    if mm >= edges[-1]: continue
    dv = rows[i].get("device_ms")
    if dv is None: continue
    b = next(j for j in range(len(edges) - 1) if mm < edges[j + 1])
    grp = "pow2" if s["d"] in (8,16,32,64,128) else "other"
    mn = min(s["ctxs"]) / (s["ctx"] / s["d"])
    by[(grp, b)].append((dv, 1e3 * cost.step_time(s["d"], 0, s["ctx"]), mn))
for k in sorted(by):
    a = np.array(by[k]); print(k[0], f"max/mean {edges[k[1]]}-{edges[k[1]+1]}", len(a), round(a[:,0].sum()/a[:,1].sum(), 4), "min/mean", round(a[:,2].mean(),3))
