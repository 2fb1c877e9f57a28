"""Issue 35, round 2: the per-stream delivery path BUILT INTO the simulator
(EngineConfig.delivery_per_stream_s) against the constant path, re-simulated from the committed
logs as fidelity_steps does it (the validate's model terms, record_steps, power cap, hide launch).

Before: every token delivery_delay_s = the lowest load's http_in + front + out (the validate's
constant). After: base + k x the streams (decodes + prefill chunks) of the token's simulated step,
first AND last tokens (so TPOT moves too, by k x the difference over the output), base = the
lowest load's http_in + front + out less k x the median LIVE streams of its requests' first-token
steps (step log; bench.serving.ttft_path.delivery_path does the same from the per-request records).

    python path_model.py R TAG LEAD_MS K_MS PROFILE SEEDS|all OUT.json

OUT.json: per-run errors of both (pool_path_model.py pools sessions and prints the tables).
"""
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))

from bench.simulator.fidelity_resim import prompt_identity, resimulate, session_prefill_cap
from bench.simulator.fidelity_steps import dispatch_delay, read_steps
from scheduler.decisions import read_log

R, TAG = Path(sys.argv[1]), sys.argv[2]
LEAD, K = float(sys.argv[3]) / 1e3, float(sys.argv[4]) / 1e3
PROFILE, SEEDS, OUT = sys.argv[5], sys.argv[6], Path(sys.argv[7])
seeds = None if SEEDS == "all" else {int(x) for x in SEEDS.split(",")}
v = json.loads((R / f"validate_{TAG}.json").read_text())
arrivals, batches = read_log(R / f"decisions_{TAG}.jsonl.gz")
rows = read_steps(R / f"steps_{TAG}.jsonl.gz")
net, _ = dispatch_delay(rows, batches)
# live streams of each request's first-token step, the lowest load's runs
arr = sorted(arrivals, key=lambda a: a.t)
_, runs = prompt_identity(v["config"], len(arr))
seqs = {}
for r in rows:
    for rid, _n, _p in r["prefill"]:
        seqs[rid] = int(r["decodes"]) + len(r["prefill"])
low = v["loads"][0]["runs"]
const = [r["ttft_path_ms"]["http_in"] + r["ttft_path_ms"]["front"] + r["ttft_path_ms"]["out"] for r in low]
low_streams = [float(np.median([seqs[a.request_id] for a, rr in zip(arr, runs, strict=True)
                                if rr == (si, 0) and a.request_id in seqs])) for si in range(len(low))]
constant = float(np.mean(const)) / 1e3
base = float(np.mean([c - 1e3 * K * s for c, s in zip(const, low_streams, strict=True)])) / 1e3
print(f"{TAG}: constant {1e3 * constant:.3f} ms -> {1e3 * base:.3f} ms + {1e3 * K:.3f} ms x streams "
      f"(lowest load's live first-token streams median {np.mean(low_streams):.1f}); {Path(PROFILE).name}")
out = []
for key, d, k in (("constant", constant, 0.0), ("per_stream", base, K)):
    res = resimulate(v, arrivals, PROFILE, False, d, LEAD, True, True, True, record_steps=True,
                     network_delay_s=net, prefill_cap=session_prefill_cap(v), delivery_per_stream_s=k)
    for ld in res["loads"]:
        for run in ld["runs"]:
            if seeds is not None and int(run["seed"]) not in seeds:
                continue
            for m, c in run["compare"].items():
                out.append({"tag": TAG, "model": key, "load": ld["load_label"], "seed": int(run["seed"]),
                            "metric": m, "rel_err": c["rel_err"], "sim": c["sim"], "live": c["live"]})
OUT.write_text(json.dumps({"constant_ms": 1e3 * constant, "base_ms": 1e3 * base, "per_stream_ms": 1e3 * K,
                           "rows": out}, indent=0) + "\n")
