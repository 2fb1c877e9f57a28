"""Issue 35, session 20: the steps with a 129-256-token chunk by decodes and by the chunk's cached
prefix (0 or not): the bare profile (hide_launch only: the paused points) and the grid state's model
(the power cap by kind) over live, and the mean prefill-busy share f the cap read.
Run from the repo root: python mixed_raw_vs_cap.py PART_DIR"""
import sys
from pathlib import Path

import numpy as np
from prefill_bins import load

from bench.simulator import fidelity_steps as fs
from sims.profile_cost import ProfileCost

part = Path(sys.argv[1]); tag = part.name
steps, bad, cost, terms = load(part)
raw = ProfileCost.from_json(part / f"profile_{tag}.json", hide_launch=True, decode_spread="off")
res = {i: (t, f) for i, t, f in fs.model_step_ms(cost, steps)}
resr = {i: t for i, t, f in fs.model_step_ms(raw, steps)}
print(tag, "raw terms: hide_launch only")
print(f"{'d':>8s} {'prefix':>7s} {'n':>5s} {'live':>7s} {'raw/live':>8s} {'cap/live':>8s} {'mean f':>6s}")
for dlo, dhi in ((1, 8), (9, 32), (33, 64), (65, 256)):
    for slo, shi in ((0, 0), (1, 100000)):
        sel = [i for i, s in enumerate(steps) if 129 <= s["p"] <= 256 and dlo <= s["d"] <= dhi and i in res
               and slo <= max(st for n, st in s["chunks"]) <= shi]
        if len(sel) < 10: continue
        live = sum(steps[i]["ms"] for i in sel)
        print(f"{dlo:3d}-{dhi:<4d} {'0' if shi == 0 else '>0':>7s} {len(sel):5d} {live/len(sel):7.2f} {sum(resr[i] for i in sel)/live:8.4f} {sum(res[i][0] for i in sel)/live:8.4f} {np.mean([res[i][1] for i in sel]):6.3f}")
