"""Issue 35: is the engine's time line its steps' device time? From a step log's host phases
(`host_ms`: planning, the launch's host work, launch -> read-back, after): for each step, whether
its launch was done before the step before it was read back (the device never waited for the
host), how late it was otherwise, and the plan lead. The live engine (async loop) is device-bound
when launches finish before the previous read-back.

    python step_gaps.py STEPS.jsonl.gz [...]
"""
import gzip
import json
import sys

import numpy as np

for path in sys.argv[1:]:
    with gzip.open(path, "rt") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    rows = [r for r in rows if "host_ms" in r]
    read = np.array([r["mono"] + r["ms"] / 1e3 for r in rows])
    launched = read - np.array([r["host_ms"][2] for r in rows]) / 1e3
    planned = launched - np.array([r["host_ms"][1] for r in rows]) / 1e3
    late = (launched[1:] - read[:-1]) * 1e3          # > 0: launched after the step before was read back
    lead = (read[:-1] - planned[1:]) * 1e3
    gap = (np.array([r["mono"] for r in rows])[1:] - read[:-1]) * 1e3
    p = np.array([r["prefill_tokens"] for r in rows])
    ms = np.array([r["ms"] for r in rows])
    idle = np.array([r.get("device_idle_ms", np.nan) for r in rows])
    busy = gap < 0.5
    print(f"{path}: {len(rows)} steps; back to back (gap < 0.5 ms) {100 * busy.mean():.1f}%; "
          f"device idle (timing events) {np.nansum(idle[1:][busy]):.1f} ms over {ms[1:][busy].sum() / 1e3:.1f} s of steps")
    kinds = (("decode-only after decode-only", (p[1:] == 0) & (p[:-1] == 0)),
             ("decode-only after prefill", (p[1:] == 0) & (p[:-1] > 0)),
             ("prefill after decode-only", (p[1:] > 0) & (p[:-1] == 0)),
             ("prefill after prefill", (p[1:] > 0) & (p[:-1] > 0)))
    for name, m in kinds:
        m = m & busy
        v = late[m]
        print(f"  {name:30s} n={m.sum():6d} launched after the previous read-back {100 * np.mean(v > 0):4.1f}%, "
              f"by {np.sum(np.maximum(v, 0)):.1f} ms in all; launch done before it: p50 {-np.median(v):.3f} ms; "
              f"plan lead p50 {np.median(lead[m]):.3f} ms; step ms mean {ms[1:][m].mean():.2f}")
