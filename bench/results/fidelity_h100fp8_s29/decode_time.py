"""Issue 35, session 29: the same by the time into the part's live runs.
    python bench/results/fidelity_h100fp8_s29/decode_time.py PART_DIR"""
import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from live_part import POW2, load_part

part = Path(sys.argv[1])
rows, steps, cost = load_part(part)
t0 = rows[0]["mono"]
X = []
for i, s in enumerate(steps):
    if s["p"] or s["idle_before"] or s["d"] < 5 or "device_ms" not in rows[i]: continue
    raw = 1e3 * cost.step_time(s["d"], 0, s["ctx"])
    X.append((rows[i]["mono"] - t0, rows[i]["device_ms"], raw, s["d"] in POW2))
X = np.array(X)
edges = np.linspace(0, X[:, 0].max() + 1e-9, 11)
for a, b in itertools.pairwise(edges):
    Y = X[(X[:, 0] >= a) & (X[:, 0] < b)]
    if len(Y) < 30: continue
    o = Y[Y[:, 3] == 0]; p = Y[Y[:, 3] == 1]
    print(f"t {a:6.0f}-{b:6.0f} s  n {len(Y):5d}  live/raw other {o[:,1].sum()/o[:,2].sum():.4f}  pow2 {p[:,1].sum()/max(p[:,2].sum(),1e-9):.4f}")
