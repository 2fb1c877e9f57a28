"""Issue 35, session 20: the SM clock and power of a part's nvidia-smi samples (every 100 ms), by what
the engine ran in the H seconds before each (idle, decode-only by batch, busy by prefill share).
Run from the repo root: python clock_windows.py PART_DIR [H=0.3]"""
import bisect
import gzip
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from bench.simulator.h200_clocks import read_smi

part = sys.argv[1]; tag = part.rstrip("/").split("/")[-1]
times, rows = read_smi(f"{part}/smi_{tag}.csv.gz")
with gzip.open(f"{part}/steps_{tag}.jsonl.gz", "rt") as fh:
    steps = [json.loads(line) for line in fh]
st = np.array([s["t"] for s in steps]); en = st + np.array([s["ms"] for s in steps]) / 1e3
pre = np.array([s["prefill_tokens"] > 0 for s in steps]); dec = np.array([s["decodes"] for s in steps])
H = float(sys.argv[2]) if len(sys.argv) > 2 else 0.3
out = {}
for t, r in zip(times, rows):
    lo = t - H
    i = bisect.bisect_left(en, lo); j = bisect.bisect_right(st, t)
    if j <= i:
        key = "idle"
    else:
        busy = sum(min(en[k], t) - max(st[k], lo) for k in range(i, j))
        pbusy = sum(min(en[k], t) - max(st[k], lo) for k in range(i, j) if pre[k])
        if busy < 0.8 * H: key = "partly idle"
        elif pbusy == 0: key = f"decode-only d~{int(np.median(dec[i:j]))//16*16}+"
        else: key = f"busy, prefill share {min(int(pbusy / busy * 4), 3) / 4:.2f}+"
    out.setdefault(key, []).append((float(r["clocks.sm"]), float(r["power.draw"])))
for k in sorted(out):
    a = np.array(out[k])
    print(f"  {k:32s} n {len(a):5d}  SM {np.median(a[:,0]):6.0f} MHz  power {np.median(a[:,1]):5.0f} W")
