"""Issue 31, fifteenth session: where the session-14 H200 admission run's requests waited.
Joins `bench/results/slo_h200_s14`'s records (the client's send time and TTFT per request) with
gateway A's decision log (when the gateway received each request, and admission's predicted
TTFT for it). Probes (their own slo_ttft_ms) are left out; a record is matched to the earliest
unmatched arrival of the same max_tokens and outcome received after it was sent.

    python3 bench/results/slo_gpu_model_s15/client_lag_s14.py [bench/results/slo_h200_s14]
"""
import gzip
import json
import sys

import numpy as np

d = sys.argv[1] if len(sys.argv) > 1 else "bench/results/slo_h200_s14"
with gzip.open(f"{d}/records_a.jsonl.gz") as fh:
    R = [json.loads(line) for line in fh]
with gzip.open(f"{d}/decisions_a.jsonl.gz") as fh:
    D = [json.loads(line) for line in fh]
A = [x for x in D if x["kind"] == "arrival" and not x.get("slo_ttft_ms")]
t0 = A[0]["received"]
used, J = set(), {}
for r in sorted(R, key=lambda r: r["send_s"]):
    cand = [k for k, a in enumerate(A) if k not in used and a["max_tokens"] == r["max_tokens"]
            and a["received"] - t0 >= r["send_s"] - 0.05
            and a.get("refused", False) == (r["error"] == "http_429")]
    k = min(cand, key=lambda k: A[k]["received"])
    used.add(k)
    J[r["i"]] = A[k]
for r in R:
    r["lag"] = J[r["i"]]["received"] - t0 - r["send_s"]
    r["pred"] = J[r["i"]]["pred_ms"] / 1e3
print(f"schedule: last request sent at {max(r['send_s'] for r in R):.2f} s; gateway A "
      f"received its last at {max(a['received'] for a in A) - t0:.2f} s")
print("\n| request | class | sent s | reached gateway after s | client TTFT s | TTFT from the gateway's receipt s | admission's prediction s |")
print("|---|---|---|---|---|---|---|")
for r in R[::25]:
    if r["ttft_s"] is None:
        continue
    print(f"| {r['i']} | {r['class']} | {r['send_s']:.2f} | {r['lag']:.2f} | {r['ttft_s']:.2f} | "
          f"{r['ttft_s'] - r['lag']:.2f} | {r['pred']:.2f} |")
ok = [r for r in R if r["ttft_s"] is not None]
g = np.array([r["ttft_s"] - r["lag"] for r in ok])
p = np.array([r["pred"] for r in ok])
lag = np.array([r["lag"] for r in ok])
l50, l90, lmax = np.percentile(lag, [50, 90, 100])
print(f"\nadmitted requests: {len(ok)}; time in the client before the gateway received them: "
      f"p50 {l50:.2f} s, p90 {l90:.2f} s, max {lmax:.2f} s")
r10, r90 = np.percentile(p / g, [10, 90])
e50, e90 = np.percentile(np.abs(p - g), [50, 90])
print(f"admission's prediction / TTFT from the gateway's receipt: p50 {np.median(p / g):.2f} "
      f"(p10 {r10:.2f}, p90 {r90:.2f}); |prediction - that TTFT| p50 {e50:.3f} s, p90 {e90:.3f} s")
print("\n| class | admitted | TTFT p90 from the gateway's receipt s | client TTFT p90 s | prediction / TTFT p50 |")
print("|---|---|---|---|---|")
for c in ("fast", "normal", "slow"):
    rc = [r for r in ok if r["class"] == c]
    gc = np.array([r["ttft_s"] - r["lag"] for r in rc])
    pc = np.array([r["pred"] for r in rc])
    print(f"| {c} | {len(rc)} | {np.percentile(gc, 90):.3f} | "
          f"{np.percentile([r['ttft_s'] for r in rc], 90):.3f} | {np.median(pc / gc):.2f} |")
