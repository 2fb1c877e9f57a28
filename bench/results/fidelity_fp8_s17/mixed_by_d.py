"""Issue 35 s17 (H35Q): live steps of one 256-token chunk (from position 0 or 256) beside d decodes, by d:
live mean, model mean (at the live steps), and the profile's (d, 256) points (k=1, s=0; step - launch ms).

    python mixed_by_d.py PART_DIR
"""
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from step_bins import build, load_steps

from bench.simulator.fidelity_steps import model_step_ms

part = Path(sys.argv[1])
cost, terms, prof = build(part, None)
steps, _ = load_steps(part)
doc = json.loads(Path(prof).read_text())
pp = defaultdict(list)
for x in doc["points"]:
    if x.get("num_prefill_tokens") == 256 and x["num_prefill_seqs"] == 1 and not x["prefill_context_len"]:
        pp[x["num_decode_seqs"]].append((x["context_len"], x["step_ms_median"] - x.get("launch_ms_median", 0)))
by = defaultdict(list)
for k, t, _f in model_step_ms(cost, steps):
    s = steps[k]
    if s["p"] == 256 and len(s["chunks"]) == 1 and not s["idle_before"]:
        by[(s["d"] - 1) // 4 * 4 + 1 if s["d"] else 0].append((s["ms"], t, s["chunks"][0][1]))
print(f"== {part.name}: one 256-token chunk beside d decodes (d in 4s), not after idle")
print(f"{'d':>4} {'n':>5} {'live':>7} {'model':>7} {'m/l':>6} {'at 256':>6}  profile (ctx, ms)")
for d in sorted(set(by) | set(pp)):
    a = np.array(by.get(d, [(np.nan,) * 3]))
    pts = " ".join(f"({c},{t:.2f})" for c, t in sorted(pp.get(d, [])))
    print(f"{d:4d} {len(by.get(d, [])):5d} {a[:, 0].mean():7.3f} {a[:, 1].mean():7.3f} {a[:, 1].sum() / a[:, 0].sum():6.3f} "
          f"{np.mean(a[:, 2] > 0):6.2f}  {pts}")
