"""One traced live miss in detail: its backend's receipts and starts over the 2 s before it.

    python inspect_one.py RUN_DIR RECORD_INDEX
"""
import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from miss_trace import _lines, load

run, idx = sys.argv[1], int(sys.argv[2])
recs, arrivals, main = load(run)
arr = {a.request_id: a for a in arrivals}
a = main[idx]
rid = a.request_id
sent = {}
for p in glob.glob(os.path.join(run, "trace", "gw_*")):
    for r in _lines(p):
        if r[0] == "send":
            for x in r[3]:
                sent[x] = (r[1], r[2])
b = sent[rid][1]
print("miss", rid, "class", a.queue_class, "t", a.t, "pred", a.predicted_ms, a.margin_ms, "sent", sent[rid])
for p in glob.glob(os.path.join(run, "trace", "be_*")):
    rows = list(_lines(p))
    if not any(r[0] == "recv" and r[2] == rid for r in rows):
        continue
    t_recv = next(r[1] for r in rows if r[0] == "recv" and r[2] == rid)
    starts = {}
    for r in rows:
        if r[0] == "step":
            for x in r[3]:
                starts[x] = r[1]
    steps = [r for r in rows if r[0] == "step"]
    tend = starts[rid] + 0.05
    for r in rows:
        if t_recv - 2.0 <= r[1] <= tend:
            if r[0] == "recv":
                x = r[2]; ar = arr.get(x)
                print(f"  recv {r[1]-t_recv:+.3f} {x[-4:]} cls={ar.queue_class if ar else '?'} mt={ar.max_tokens if ar else '?'} start={starts.get(x, 0)-t_recv:+.3f} gw_t={ar.t - t_recv if ar else 0:+.3f}")
            elif r[0] == "step" and r[3]:
                print(f"  step {r[1]-t_recv:+.3f} {r[2]-r[1]:.4f} started={[x[-4:] for x in r[3]]} running={r[4]} waiting={r[5]}")
