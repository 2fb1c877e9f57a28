"""Join a live run's per-request records (records_a.jsonl, schedule order) with its decision log
(decisions_a.jsonl.gz, the probes left out) and print the admitted misses by > 10% with their
admission prediction and margin, and the Slow requests admitted in the first 2.2 s:
`python join_records.py new7` (from this directory; runs 7-10)."""
import gzip
import json
import sys

run = sys.argv[1]
with open(f"live_{run}/records_a.jsonl") as fh:
    recs = [json.loads(line) for line in fh]
with gzip.open(f"live_{run}/decisions_a.jsonl.gz", "rt") as fh:
    arr = [json.loads(line) for line in fh]
arr = [a for a in arr if a.get("kind") == "arrival" and not (a.get("slo_ttft_ms") or 0) > 1e6]
arr.sort(key=lambda a: a["t"])
assert len(arr) == len(recs), (len(arr), len(recs))
mism = sum(a["max_tokens"] != r["max_tokens"] for a, r in zip(arr, recs))
print(run, "joined", len(recs), "max_tokens mismatches", mism)
tg = {"fast": 0.15, "normal": 0.4, "slow": 1.0}
t0 = arr[0]["t"]
for a, r in zip(arr, recs):
    if r["error"] is None and r["ttft_s"] is not None and r["ttft_s"] > 1.1 * tg[r["class"]]:
        print(f"  MISS {r['class']:6s} i={r['i']:3d} t={a['t']-t0:6.2f} pred={a.get('pred_ms')} margin={a.get('margin_ms')} ttft={r['ttft_s']*1e3:.0f}")
print("  slow admitted in warm-up:")
for a, r in zip(arr, recs):
    if r["class"] == "slow" and r["error"] is None and a["t"] - t0 < 2.2:
        print(f"    i={r['i']:3d} t={a['t']-t0:5.2f} pred={a.get('pred_ms')} margin={a.get('margin_ms')} ttft={r['ttft_s']*1e3:.0f}")
