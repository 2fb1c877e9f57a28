"""Issue 35 s17 (H35Q): decode-only steps by exact decode count d: live median/mean, the model at the live
steps (mean), and the profile's own decode points at that d (step - launch, i.e. what the model is fit to).

    python dec_by_d.py PART_DIR
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
    if not x.get("num_prefill_tokens"):
        pp[x["num_decode_seqs"]].append((x["context_len"], x["step_ms_median"] - x.get("launch_ms_median", 0)))
by = defaultdict(list)
for k, t, _f in model_step_ms(cost, steps):
    s = steps[k]
    if not s["p"] and not s["idle_before"]:
        by[s["d"]].append((s["ms"], t, s["ctx"] / s["d"]))
print(f"== {part.name}: decode-only steps (not after idle) by d; profile points: (context_len, step - launch ms)")
print(f"{'d':>4} {'n':>5} {'live med':>8} {'live mean':>9} {'model':>7} {'m/l':>6} {'ctx/d':>6}  profile points")
for d in sorted(set(by) | set(pp)):
    a = np.array(by.get(d, [(np.nan, np.nan, np.nan)]))
    n = len(by.get(d, []))
    pts = " ".join(f"({c},{t:.2f})" for c, t in sorted(pp.get(d, [])))
    print(f"{d:4d} {n:5d} {np.median(a[:, 0]):8.3f} {a[:, 0].mean():9.3f} {a[:, 1].mean():7.3f} "
          f"{a[:, 1].sum() / a[:, 0].sum():6.3f} {a[:, 2].mean():6.0f}  {pts}")
