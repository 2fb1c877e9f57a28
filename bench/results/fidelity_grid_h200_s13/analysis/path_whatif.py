"""Issue 35: what-if — the delivery path as a per-stream cost instead of one constant. Live, a run's
median `out` (step end -> client's first token) follows the streams of the first-token step:
out = a + k x streams, k 0.073 ms (6.7B) / 0.069, 0.068 (33B, two sessions) (path_by_streams.py).
Here each request's simulated first token gets http_in + front + a + k x (sequences of its simulated
first-token step) instead of the constant delivery delay, with k taken from the OTHER model's runs
and a from this session's lowest load (out there minus k x its streams). TTFT only (TPOT: the same
delay on every token of a stream, to first order). Re-simulation as fidelity_steps does it.

    python path_whatif.py R TAG LEAD_MS DELIVERY_MS K_MS PROFILE [SEEDS [OUT.json]]

OUT.json: the per-run errors (pool_path_whatif.py pools sessions).
"""
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))

from bench.simulator.fidelity_resim import prompt_identity, resimulate, session_prefill_cap
from bench.simulator.fidelity_stats import mean_ci
from bench.simulator.fidelity_steps import dispatch_delay, read_steps
from scheduler.decisions import read_log

R, TAG = Path(sys.argv[1]), sys.argv[2]
LEAD, DELIV, K = float(sys.argv[3]) / 1e3, float(sys.argv[4]) / 1e3, float(sys.argv[5]) / 1e3
PROFILE = sys.argv[6]
SEEDS = None if len(sys.argv) < 8 or sys.argv[7] == "all" else {int(x) for x in sys.argv[7].split(",")}
OUT = Path(sys.argv[8]) if len(sys.argv) > 8 else None
per_run = []
v = json.loads((R / f"validate_{TAG}.json").read_text())
arrivals, batches = read_log(R / f"decisions_{TAG}.jsonl.gz")
rows = read_steps(R / f"steps_{TAG}.jsonl.gz")
net, _ = dispatch_delay(rows, batches)
res = resimulate(v, arrivals, PROFILE, False, 0.0, LEAD, True, True, True, record_steps=True,
                 network_delay_s=net, prefill_cap=session_prefill_cap(v))
arr = sorted(arrivals, key=lambda a: a.t)
_, runs = prompt_identity(v["config"], len(arr))
first_end, seqs = {}, {}
for s in res["steps"]:
    for rid, _n, _p in s.prefill:
        first_end[rid] = s.t + s.ms / 1e3          # the last prefill chunk's step gives the token
        seqs[rid] = s.num_decodes + len(s.prefill)
# the path's base at the lowest load: http_in + front + (out - K x its streams)
low = v["loads"][0]["runs"]
lseq = {}
for a, (si, li) in zip(arr, runs, strict=True):
    if li == 0 and a.request_id in seqs:
        lseq.setdefault(si, []).append(seqs[a.request_id])
base = float(np.mean([r["ttft_path_ms"]["http_in"] + r["ttft_path_ms"]["front"] + r["ttft_path_ms"]["out"]
                      - 1e3 * K * np.median(lseq[si]) for si, r in enumerate(low)])) / 1e3
print(f"{TAG}: path = {1e3 * base:.2f} ms + {1e3 * K:.3f} ms x streams (constant before: {1e3 * DELIV:.2f} ms); "
      f"profile {Path(PROFILE).name}")
print(f"{'load':6s} {'metric':9s} {'constant path':>18s} {'per-stream path':>18s}")
for li, ld in enumerate(v["loads"]):
    errs = {"c": {"ttft_p50": [], "ttft_p99": []}, "s": {"ttft_p50": [], "ttft_p99": []}}
    for si, run in enumerate(ld["runs"]):
        if SEEDS is not None and int(run["seed"]) not in SEEDS:
            continue
        ids = [a for a, r in zip(arr, runs, strict=True) if r == (si, li) and a.request_id in first_end]
        t0 = np.array([first_end[a.request_id] - a.t for a in ids])
        st = np.array([seqs[a.request_id] for a in ids])
        for key, ttft in (("c", t0 + DELIV), ("s", t0 + base + K * st)):
            for m, q in (("ttft_p50", 50), ("ttft_p99", 99)):
                live = run["live"]["ttft_ms"]["p50" if q == 50 else "p99"]
                errs[key][m].append((1e3 * np.percentile(ttft, q) - live) / live)
                per_run.append({"load": ld["load_label"], "seed": int(run["seed"]), "path": key,
                                "metric": m, "rel_err": errs[key][m][-1]})
    for m in ("ttft_p50", "ttft_p99"):
        c, s = mean_ci(errs["c"][m]), mean_ci(errs["s"][m])
        print(f"{ld['load_label']:6s} {m:9s} {100 * c['mean']:+8.1f} ± {100 * c['ci']:4.1f}   "
              f"{100 * s['mean']:+8.1f} ± {100 * s['ci']:4.1f}")
if OUT is not None:
    OUT.write_text(json.dumps(per_run, indent=0) + "\n")
