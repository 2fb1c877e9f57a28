"""Issue 31, s16 (H31M): where the Fast requests go while a Normal request waits for a slot
(lag-traced live runs). Placement by predicted TTFT sends a Fast request to the backend whose
slot frees first, which is where a waiting Normal request was placed for the same reason; the
slot model projects the Fast arrivals at the rate sent to that backend (about a quarter of all).
Per admitted Normal request that waited for a slot (started > 1 step after its receipt): the
Fast requests sent anywhere during its wait, and those sent to its backend that started before it.

    python fast_share.py RUN_DIR ...
"""
from __future__ import annotations

import glob
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from miss_trace import SLO, _lines, load


def analyse(run):
    recs, arrivals, main = load(run)
    cls_of = {a.request_id: a.queue_class for a in arrivals}
    sent_to, sent_at, start, recv = {}, {}, {}, {}
    for p in glob.glob(os.path.join(run, "trace", "gw_*")):
        for r in _lines(p):
            if r[0] == "send":
                for x in r[3]:
                    if x in cls_of:
                        sent_to[x], sent_at[x] = int(r[2]), r[1]
    for p in glob.glob(os.path.join(run, "trace", "be_*")):
        for r in _lines(p):
            if r[0] == "recv" and r[2] in cls_of:
                recv[r[2]] = r[1]
            elif r[0] == "step":
                for x in r[3]:
                    if x in cls_of:
                        start[x] = r[1]
    fast = sorted((sent_at[x], x) for x in sent_at if cls_of[x] == 0)
    rows = []
    for a, rec in zip(main, recs):
        x = a.request_id
        if a.queue_class != 1 or rec["ttft_s"] is None or x not in start or x not in recv or start[x] - recv[x] < 0.03:
            continue
        t0, t1 = sent_at[x], start[x]
        during = [f for t, f in fast if t0 < t < t1]
        here = [f for f in during if sent_to[f] == sent_to[x] and start.get(f, 1e18) < t1]
        rows.append((len(during), len(here), rec["ttft_s"] / SLO[1] > 1.1, t1 - t0))
    return rows


rows = []
for run in sys.argv[1:]:
    rows += analyse(run)
d = np.array([r[0] for r in rows]); h = np.array([r[1] for r in rows])
m = np.array([r[2] for r in rows]); w = np.array([r[3] for r in rows])
print(f"Normal requests that waited for a slot: {len(rows)} (wait p50 {np.median(w) * 1e3:.0f} ms)")
print(f"Fast sent anywhere during their waits: {d.sum()}; to their backend and started before "
      f"them: {h.sum()} ({100 * h.sum() / max(1, d.sum()):.1f}%; an even share of 4 backends: 25%)")
for lo, hi in ((0.03, 0.15), (0.15, 0.3), (0.3, 1.0)):
    s = (w >= lo) & (w < hi)
    print(f"  wait {lo * 1e3:.0f}-{hi * 1e3:.0f} ms: {s.sum()} requests, Fast during {d[s].sum()}, "
          f"overtook {h[s].sum()} ({100 * h[s].sum() / max(1, d[s].sum()):.1f}%)")
print(f"the misses among them: {m.sum()}; Fast during {d[m].sum()}, overtook {h[m].sum()}")
