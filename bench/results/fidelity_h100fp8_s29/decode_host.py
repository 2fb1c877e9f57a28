"""Issue 35, session 29: the live decode-only steps' excess over the profile's raw charge (ms) against the host's phases
(plan, launch work, launch to read-back) within d bins: does host latency land inside the timed span?
    python bench/results/fidelity_h100fp8_s29/decode_host.py PART_DIR"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from live_part import POW2, load_part

part = Path(sys.argv[1])
rows, steps, cost = load_part(part)
X = []
for i, s in enumerate(steps):
    if s["p"] or s["idle_before"] or s["d"] < 5 or "host_ms" not in rows[i] or "device_ms" not in rows[i]: continue
    raw = 1e3 * cost.step_time(s["d"], 0, s["ctx"])
    h = rows[i]["host_ms"]; hp = rows[i-1].get("host_ms")
    X.append((rows[i]["device_ms"] - raw, h[0], h[1], h[2], h[3], rows[i].get("device_idle_ms", np.nan), s["d"] in POW2, raw, s["d"]))
X = np.array(X, dtype=float)
print("n", len(X), "mean excess ms", X[:,0].mean().round(4))
for j, name in ((1, "plan"), (2, "launch host"), (3, "launch->readback"), (4, "after"), (5, "device idle")):
    c = np.corrcoef(X[:,0], X[:,j])[0,1]
    q = np.quantile(X[:,j], [0.25, 0.5, 0.75])
    lo = X[X[:,j] <= q[0], 0].mean(); hi = X[X[:,j] >= q[2], 0].mean()
    print(f"{name:18s} median {q[1]:.3f} ms  corr {c:+.3f}  excess at its lowest quarter {lo:.4f}  highest quarter {hi:.4f}")
print("within d bins: excess ms by launch host work (lowest / highest quarter), and by plan time")
for lo_d, hi_d in ((5, 7), (9, 15), (17, 24), (25, 31), (33, 47)):
    Y = X[(X[:, 8] >= lo_d) & (X[:, 8] <= hi_d)]
    out = []
    for j in (2, 1, 3):
        q = np.quantile(Y[:, j], [0.25, 0.75])
        out.append(f"{Y[Y[:, j] <= q[0], 0].mean():.3f} / {Y[Y[:, j] >= q[1], 0].mean():.3f}")
    print(f"  d {lo_d}-{hi_d} n {len(Y)} mean {Y[:,0].mean():.3f}: launch {out[0]}  plan {out[1]}  launch->readback {out[2]}")
