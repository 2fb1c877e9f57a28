"""Issue 35 s17 (H35Q): the live steps with > 512 prefill tokens beside the model, and the profile's
points with >= 1024 prefill tokens (what the model has there).

    python big_steps.py PART_DIR
"""
import json
import sys
from collections import Counter
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
print(f"== {part.name}: profile points with p >= 1024 (d, p, c, k, s: step - launch ms)")
for x in doc["points"]:
    if x.get("num_prefill_tokens", 0) >= 1024:
        print(f"  d={x['num_decode_seqs']:3d} p={x['num_prefill_tokens']:5d} c={x['context_len']:4d} k={x['num_prefill_seqs']} "
              f"s={x['prefill_context_len']:4d}: {x['step_ms_median'] - x['launch_ms_median']:7.2f}  "
              f"model {1e3 * cost.step_time(x['num_decode_seqs'], x['num_prefill_tokens'], x['num_context_tokens'], [(x['num_prefill_tokens'] // x['num_prefill_seqs'], x['prefill_context_len'])] * x['num_prefill_seqs']):7.2f}")
rec = [(steps[k], t) for k, t, _f in model_step_ms(cost, steps) if steps[k]["p"] > 512]
shapes = Counter()
print("live steps > 512 prefill tokens: shape (d, p, chunks as tokens@start) -> n, live ms, model ms")
by = {}
for s, t in rec:
    key = (min(s["d"], 99) // 8 * 8, s["p"] // 128 * 128, len(s["chunks"]), sum(1 for _, st in s["chunks"] if st))
    by.setdefault(key, []).append((s["ms"], t, s["d"], s["p"]))
print(f"  {'d(8s) p(128s) chunks with-prefix':36s} {'n':>4s} {'live':>7s} {'model':>7s} {'m/l':>6s}")
for key in sorted(by):
    a = np.array(by[key])
    print(f"  {key!s:36s} {len(a):4d} {a[:, 0].mean():7.2f} {a[:, 1].mean():7.2f} {a[:, 1].sum() / a[:, 0].sum():6.3f}")
for s, t in rec[:8]:
    print("  e.g.", s["d"], s["p"], s["chunks"], f"live {s['ms']:.2f} model {t:.2f}")
