"""Admitted requests by predicted TTFT (+ margin) at admission, all runs: how many missed by
> 10%, and what a stricter threshold on pred + margin (per class) would have refused (static:
the rest of the run unchanged)."""
import os
import sys
from collections import Counter

sys.path.insert(0, "/tmp/h31m/work")
import numpy as np
from miss_trace import SLO, load

runs = sys.argv[1:]
rows = []
for run in runs:
    recs, arrivals, main = load(run)
    for a, r in zip(main, recs):
        rows.append({"run": os.path.basename(run), "i": r["i"], "c": a.queue_class,
                     "t": a.t - main[0].t, "refused": a.refused or r["error"] == "http_429",
                     "err": r["error"], "pred": (a.predicted_ms or 0) / 1e3,
                     "margin": (a.margin_ms or 0) / 1e3, "ttft": r["ttft_s"]})
adm = [x for x in rows if not x["refused"] and x["ttft"] is not None]
print("runs", len(runs), "admitted", len(adm), "refused", sum(x["refused"] for x in rows),
      "errors", Counter(x["err"] for x in rows))
miss = [x for x in adm if x["ttft"] / SLO[x["c"]] > 1.1]
print("misses", len(miss), Counter(x["c"] for x in miss))
print("miss indices:", sorted(Counter(x["i"] for x in miss).items()))
print("miss times by class:", {c: sorted(round(x["t"], 1) for x in miss if x["c"] == c) for c in (0, 1, 2)})
for c in (0, 1, 2):
    sel = [x for x in adm if x["c"] == c]
    p = np.array([x["pred"] + x["margin"] for x in sel]); m = np.array([x["ttft"] / SLO[c] > 1.1 for x in sel])
    print(f"class {c}: admitted {len(sel)}, missed {m.sum()}; pred+margin of the misses: "
          f"{np.round(np.sort(p[m]) * 1e3).astype(int).tolist()}")
    for th in (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7):
        cut = p > th * SLO[c]
        print(f"   refuse pred+margin > {th:.2f} SLO: extra refused {cut.sum()} ({100*cut.mean():.1f}% of admitted), "
              f"misses left {(m & ~cut).sum()}")
