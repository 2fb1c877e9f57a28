"""Issue 35, session 29: the live decode-only steps' excess over the profile by the step before (decode / prefill, same d or not) and d on a power of 2 or not.
    python bench/results/fidelity_h100fp8_s29/decode_prev.py PART_DIR"""
import collections
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from live_part import POW2, load_part

part = Path(sys.argv[1])
rows, steps, cost = load_part(part)
by = collections.defaultdict(list)
for i, s in enumerate(steps):
    if i < 3 or s["p"] or s["idle_before"] or max(s["ctxs"]) > 1.15 * s["ctx"] / s["d"]: continue
    dv = rows[i].get("device_ms")
    if dv is None: continue
    prev = steps[i-1]; prev2 = steps[i-2]
    pp = "afterP" if prev["p"] else ("afterP2" if prev2["p"] else "afterD")
    same = "same_d" if prev["d"] == s["d"] else "new_d"
    grp = "pow2" if s["d"] in POW2 else "other"
    by[(grp, pp, same)].append((dv, 1e3 * cost.step_time(s["d"], 0, s["ctx"])))
for k in sorted(by):
    a = np.array(by[k]); print(k, len(a), round(a[:,0].sum()/a[:,1].sum(), 4))
