"""Issue 35, session 29: read `replay_live` over `decode_replay_prep.py`'s window: the decode-only steps (not after
idle), d on a power of 2 or not, each way's device time over the profile's raw charge at the shape, and live over
the pipelined replay.

    python bench/results/fidelity_h100fp8_s29/decode_replay_read.py STEPS.json REPLAY.json
"""
import json
import sys
from pathlib import Path

import numpy as np

comps = {s["i"]: s for s in json.loads(Path(sys.argv[1]).read_text())["steps"]}
rep = json.loads(Path(sys.argv[2]).read_text())
print(f"{rep.get('device_name')}, {rep.get('passes')} pipelined passes, paused after {rep.get('pause_ms')} ms")
for grp in ("pow2", "other"):
    rows = []
    for r in rep["steps"]:
        s = comps[r["i"]]
        if s["p"] or s["idle_before"] or (s["d"] in (1, 2, 4, 8, 16, 32, 64, 128)) != (grp == "pow2"):
            continue
        rows.append((s["live_device_ms"], r["pipelined_ms"], r.get("paused_ms", np.nan), s["raw_model_ms"]))
    a = np.array(rows, dtype=float)
    if not len(a):
        continue
    live, pipe, pause, raw = (a[:, j].sum() for j in range(4))
    print(f"  decode-only, d {grp:5s} n {len(a):4d}: live / raw {live / raw:.4f}  pipelined / raw {pipe / raw:.4f}  "
          f"paused / raw {pause / raw:.4f}  live / pipelined {live / pipe:.4f}")
