"""python slots_at.py RUN_DIR RECORD_INDEX. For a miss: every backend's state at its admission (from the trace): running requests' end
times (start + max_tokens steps), waiting ones; and the requests dispatched around it."""
import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from miss_trace import _lines, load

run, idx = sys.argv[1], int(sys.argv[2])
recs, arrivals, main = load(run)
arr = {a.request_id: a for a in arrivals}
a = main[idx]; rid = a.request_id; T = a.t
sent = {}
for p in glob.glob(os.path.join(run, "trace", "gw_*")):
    for r in _lines(p):
        if r[0] == "send":
            for x in r[3]:
                sent[x] = (r[1], r[2])
        if r[0] == "win" and rid in r[3]:
            print("window", [ (x[-4:], arr[x].queue_class) for x in r[3]], f"{r[1]-T:+.4f} {r[2]-T:+.4f}")
print("miss", rid[-4:], "cls", a.queue_class, "pred", a.predicted_ms, "margin", a.margin_ms, "-> backend", sent[rid][1])
for x in sorted(sent, key=lambda x: sent[x][0]):
    if -0.1 < sent[x][0] - T < 0.1:
        print(f"  sent {sent[x][0]-T:+.4f} {x[-4:]} cls={arr[x].queue_class} -> b{sent[x][1]} gw_t={arr[x].t-T:+.4f} pred={arr[x].predicted_ms}")
for p in sorted(glob.glob(os.path.join(run, "trace", "be_*"))):
    rows = list(_lines(p))
    starts, recv = {}, {}
    for r in rows:
        if r[0] == "step":
            for x in r[3]: starts[x] = r[1]
        if r[0] == "recv": recv[x := r[2]] = r[1]
    bs = [sent[x][1] for x in recv if x in sent]
    if not bs: continue
    b = max(set(bs), key=bs.count)
    run_ = sorted((starts[x] + arr[x].max_tokens * 0.02 - T, x[-4:], arr[x].queue_class) for x in starts
                  if x in arr and starts[x] <= T < starts[x] + arr[x].max_tokens * 0.02)
    wait = [(x[-4:], arr[x].queue_class) for x in recv if x in arr and recv[x] <= T and starts.get(x, 1e18) > T]
    print(f"b{b}: running {len(run_)} ends {[f'{e:+.2f}/{c}' for e, _, c in run_]} waiting {wait}")
