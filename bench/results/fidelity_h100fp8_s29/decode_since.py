"""Issue 35, session 29: the same by the time since the last prefill step.
    python bench/results/fidelity_h100fp8_s29/decode_dsince.py PART_DIR  (from the repo root)"""
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
    grp = "pow2" if s["d"] in (1,2,4,8,16,32,64,128) else "other"
    by[(grp, b)].append((dv, 1e3 * cost.step_time(s["d"], 0, s["ctx"])))
for k in sorted(by):
    a = np.array(by[k]); print(k[0], f"{edges[k[1]]}-{edges[k[1]+1]} ms since prefill", len(a), round(a[:,0].sum()/a[:,1].sum(), 4))
