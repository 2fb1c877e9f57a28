"""Issue 31, fourteenth session: where the live Retry-After error is, by the Retry-After's own
size (Slow probes). python regimes.py RUN_DIR ..."""
import gzip
import json
import sys

import numpy as np
from scipy.stats import spearmanr

rows = []
for run in sys.argv[1:]:
    with gzip.open(run + "/records_a.jsonl.gz", "rt") as fh:
        for line in fh:
            x = json.loads(line)
            if x["error"] == "http_429" and x["probe_ttft_s"] and x["class"] == "slow":
                rows.append((x["retry_after_s"], x["probe_ttft_s"]))
ra = np.array([r[0] for r in rows])
w = np.array([r[1] for r in rows])
e = ra / w
print(f"Slow probes {len(rows)}, Spearman(Retry-After, wait) {spearmanr(ra, w)[0]:.2f}; "
      f"within +-25% {np.mean(np.abs(e - 1) <= .25) * 100:.1f}%, short (< 0.75x) "
      f"{np.mean(e < 0.75) * 100:.1f}%, long (> 1.25x) {np.mean(e > 1.25) * 100:.1f}%")
print("| Retry-After | probes | share | wait p50 s | Retry-After p50 s | within +-25% | too short | too long | Spearman |")
print("|---|---|---|---|---|---|---|---|---|")
for lo, hi in ((0, 0.1), (0.1, 1.0), (1.0, 2.5), (2.5, 100)):
    m = (ra >= lo) & (ra < hi)
    if m.sum() < 2:
        continue
    ee = e[m]
    print(f"| {lo:g}-{hi:g} s | {m.sum()} | {m.mean() * 100:.0f}% | {np.median(w[m]):.2f} | "
          f"{np.median(ra[m]):.2f} | {np.mean(np.abs(ee - 1) <= .25) * 100:.0f}% | "
          f"{np.mean(ee < 0.75) * 100:.0f}% | {np.mean(ee > 1.25) * 100:.0f}% | "
          f"{spearmanr(ra[m], w[m])[0]:.2f} |")
