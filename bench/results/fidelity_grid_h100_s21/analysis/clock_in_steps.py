"""Issue 35, session 20: the SM clock and power of the nvidia-smi samples (every 100 ms) that fell
inside a live step, by the step's kind and decodes: what the steps themselves ran at (the 0.5 s
windows of clock_windows.py mostly sample the decode steps between them).
Run from the repo root: python clock_in_steps.py PART_DIR
"""
import bisect
import gzip
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from bench.simulator.h200_clocks import read_smi

D_BINS = ((0, 0), (1, 8), (9, 32), (33, 64), (65, 256))


def kind(s: dict) -> str:
    dbin = next(f"{lo}-{hi}" for lo, hi in D_BINS if lo <= s["decodes"] <= hi)
    if 129 <= s["prefill_tokens"] <= 256:
        return f"chunk 129-256, decodes {dbin}"
    if s["prefill_tokens"] == 0:
        return f"decode-only, decodes {dbin}"
    return "prefill > 1024" if s["prefill_tokens"] > 1024 else "other prefill"


def main(part: str) -> None:
    tag = part.rstrip("/").split("/")[-1]
    times, rows = read_smi(f"{part}/smi_{tag}.csv.gz")
    with gzip.open(f"{part}/steps_{tag}.jsonl.gz", "rt") as fh:
        steps = [json.loads(line) for line in fh]
    st = np.array([s["t"] for s in steps])
    en = st + np.array([s["ms"] for s in steps]) / 1e3
    out: dict[str, list] = {}
    for t, r in zip(times, rows, strict=True):
        i = bisect.bisect_right(st, t) - 1
        if i >= 0 and t <= en[i]:
            out.setdefault(kind(steps[i]), []).append((float(r["clocks.sm"]), float(r["power.draw"])))
    print(f"== {tag}: samples inside a step, by its kind")
    for k in sorted(out):
        a = np.array(out[k])
        print(f"  {k:32s} n {len(a):4d}  SM median {np.median(a[:, 0]):5.0f} MHz (p25 {np.percentile(a[:, 0], 25):5.0f})"
              f"  power {np.median(a[:, 1]):4.0f} W")


if __name__ == "__main__":
    main(sys.argv[1])
