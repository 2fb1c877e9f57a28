"""Issue 35, session 21: a part's live decode-only steps (not after idle, max / mean context <= LIM,
default 1.15: the profile's equal-context points) against the profile's device time at their shape
(the cost model's raw step time, no terms: it reproduces every equal-context point's
`device_ms_median`), by decodes; the live step log's own `device_ms` beside its wall time.
Run from the repo root:  python decode_vs_profile.py PART_DIR [LIM]"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from prefill_bins import load

from bench.simulator import fidelity_steps as fs

part = Path(sys.argv[1]); tag = part.name
rows = [r for r in fs.read_steps(part / f"steps_{tag}.jsonl.gz") if "mono" in r]
steps, bad, cost, terms = load(part)
lim = float(sys.argv[2]) if len(sys.argv) > 2 else 1.15
print(tag, "decode-only, not after idle, max/mean context <=", lim, ": live device ms / raw model (profile device, interpolated)")
for lo, hi in ((1, 1), (2, 4), (5, 8), (9, 16), (17, 32), (33, 64), (65, 128)):
    idx = [i for i, s in enumerate(steps) if not s["p"] and lo <= s["d"] <= hi and not s["idle_before"] and max(s["ctxs"]) <= lim * s["ctx"] / s["d"]]
    if len(idx) < 10: continue
    raw = np.array([1e3 * cost.step_time(steps[i]["d"], 0, steps[i]["ctx"]) for i in idx])
    dv = np.array([rows[i].get("device_ms", np.nan) for i in idx]); l = np.array([steps[i]["ms"] for i in idx])
    print(f"  d {lo:3d}-{hi:3d}: n {len(idx):5d}  live device/model {np.nansum(dv)/raw.sum():.4f}  live ms/model {l.sum()/raw.sum():.4f}  mean ctx/seq {np.mean([steps[i]['ctx']/steps[i]['d'] for i in idx]):.0f}")
