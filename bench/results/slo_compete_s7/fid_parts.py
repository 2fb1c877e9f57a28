"""`[--forced]`: the replay that follows the live decisions. What parts the simulator's admission decisions from the live ones (fid_join.py's JSON files):
per differing decision, its class, which side refused, and which term of the check differs more,
sim minus live: the prediction (the point wait) or the margin (calibration + the arrivals'
upper quantile); and whether it came in the first 2 s. `python fid_parts.py A.json B.json ...`"""
import json
import sys
from collections import Counter

KEY = "differing"
args = sys.argv[1:]
if args and args[0] == "--forced":  # the replay that follows the live decisions
    KEY, args = "differing_forced", args[1:]
for path in args:
    with open(path) as fh:
        d = json.load(fh)
    c = Counter()
    for x in d[KEY]:
        if x["sim_pred_ms"] is None or x["live_pred_ms"] is None:
            c[(x["class"], "no prediction")] += 1
            continue
        dp = x["sim_pred_ms"] - x["live_pred_ms"]
        dm = (x["sim_margin_ms"] or 0) - (x["live_margin_ms"] or 0)
        term = "margin" if abs(dm) > abs(dp) else "prediction"
        side = "sim refused" if x["live"] == "admitted" else "live refused"
        c[(x["class"], side, term)] += 1
        if x["t"] < 2.0:
            c[("first 2 s",)] += 1
        if x["forced_same"]:
            c[("forced replay agrees with live",)] += 1
    print(d["run"], KEY, len(d[KEY]), "of", d["num_arrivals"])
    for k, v in sorted(c.items(), key=lambda kv: -kv[1]):
        print("   ", " / ".join(k), v)
