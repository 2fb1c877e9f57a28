"""Issue 35, session 29: a part's live decode-only steps (not after idle, max / mean context <= LIM, default 1.15)
against the profile's raw device time at their shape, by exact decode count d (session 21's `decode_vs_profile.py`
binned d; here every d with >= 8 steps). Run from the repo root:
    python bench/results/fidelity_h100fp8_s29/decode_exact.py PART_DIR [LIM]"""
import collections
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from live_part import load_part

part = Path(sys.argv[1])
rows, steps, cost = load_part(part)
LIM = float(sys.argv[2]) if len(sys.argv) > 2 else 1.15
by = collections.defaultdict(list)
for i, s in enumerate(steps):
    if s["p"] or s["idle_before"] or max(s["ctxs"]) > LIM * s["ctx"] / s["d"]: continue
    dv = rows[i].get("device_ms")
    if dv is None: continue
    by[s["d"]].append((dv, 1e3 * cost.step_time(s["d"], 0, s["ctx"]), s["ctx"] / s["d"]))
for d in sorted(by):
    a = np.array(by[d])
    if len(a) < 8: continue
    print(f"d {d:3d} n {len(a):4d} live/model {a[:,0].sum()/a[:,1].sum():.4f} ctx {a[:,2].mean():.0f} live ms {a[:,0].mean():.3f}")
