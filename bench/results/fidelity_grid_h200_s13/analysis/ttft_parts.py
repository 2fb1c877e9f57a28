"""Issue 35: where TTFT goes, live against the re-simulations (median ms per run, mean over the seeds).
Live: `sim validate`'s TTFT path (bench.serving.ttft_path: http_in, front, window, to_step,
prefill, out). Simulated (fidelity_resim with every step recorded): window (push -> flush),
to_step (flush -> start of the first prefill step: the dispatch delay and the wait for the engine),
prefill (first prefill step start -> last prefill step end), path (the constant delivery delay:
http_in + front + out measured at the lowest load). Also the share of live busy time in steps
carrying prefill, per load.

    python ttft_parts.py R TAG LEAD_MS DELIVERY_MS [SURROGATE_PROFILE]
"""
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))

from bench.simulator.fidelity_resim import prompt_identity, resimulate, session_prefill_cap
from bench.simulator.fidelity_steps import LiveTimedCost, dispatch_delay, read_steps
from scheduler.decisions import read_log

R, TAG, LEAD, DELIV = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3]) / 1e3, float(sys.argv[4]) / 1e3
SURR = sys.argv[5] if len(sys.argv) > 5 else None
validate = json.loads((R / f"validate_{TAG}.json").read_text())
arrivals, batches = read_log(R / f"decisions_{TAG}.jsonl.gz")
rows = read_steps(R / f"steps_{TAG}.jsonl.gz")
net, _ = dispatch_delay(rows, batches)
cap = session_prefill_cap(validate)
arr = sorted(arrivals, key=lambda a: a.t)
_, runs = prompt_identity(validate["config"], len(arr))
push = {a.request_id: a.t for a in arr}
run_of = {a.request_id: r for a, r in zip(arr, runs, strict=True)}


def sim_parts(profile, wrap=None):
    res = resimulate(validate, arrivals, str(profile), False, DELIV, LEAD, True, True, True,
                     record_steps=True, wrap_cost=wrap, network_delay_s=net, prefill_cap=cap)
    first, last = {}, {}
    for s in res["steps"]:
        for rid, _n, _p in s.prefill:
            first.setdefault(rid, s.t)
            last[rid] = s.t + s.ms / 1e3
    disp = res["dispatch_time"]
    out = {}
    for rid, (si, li) in run_of.items():
        if si < 0 or rid not in first:
            continue
        v = (disp[rid] - push[rid], first[rid] - disp[rid], last[rid] - first[rid])
        out.setdefault((si, li), []).append(v)
    return {k: np.median(np.array(v), axis=0) * 1e3 for k, v in out.items()}


variants = [("as run", sim_parts(R / f"profile_{TAG}.json")),
            ("live step times", sim_parts(R / f"profile_{TAG}.json",
                                          lambda c, ids: LiveTimedCost(c, ids, rows)))]
if SURR:
    variants.append(("what-if profile", sim_parts(SURR)))
# live busy time in steps carrying prefill, per load (the runs' step spans)
mono = np.array([r["mono"] for r in rows])
ms = np.array([r["ms"] for r in rows])
pf = np.array([bool(r["prefill_tokens"]) for r in rows])
print(f"{TAG}: median ms per run, mean over the seeds; sim path = delivery {1e3 * DELIV:.2f} ms (constant); "
      f"dispatch delay {1e3 * net:.2f} ms")
print(f"{'load':6s} {'side':18s} {'window':>7s} {'to_step':>8s} {'prefill':>8s} {'path':>6s}")
for li, ld in enumerate(validate["loads"]):
    lp = [r["ttft_path_ms"] for r in ld["runs"]]
    live = [np.mean([p[k] for p in lp]) for k in ("window", "to_step", "prefill")]
    path = np.mean([p["http_in"] + p["front"] + p["out"] for p in lp])
    outs = np.mean([p["out"] for p in lp])
    print(f"{ld['load_label']:6s} {'live':18s} {live[0]:7.2f} {live[1]:8.2f} {live[2]:8.2f} {path:6.2f}"
          f"  (out {outs:.2f})")
    for name, parts in variants:
        v = np.mean([parts[(si, li)] for si in range(len(ld["runs"]))], axis=0)
        print(f"{'':6s} {name:18s} {v[0]:7.2f} {v[1]:8.2f} {v[2]:8.2f} {1e3 * DELIV:6.2f}")
    ids = {rid for rid, r in run_of.items() if r[1] == li}
    span = [i for i, r in enumerate(rows) if any(c[0] in ids for c in r["prefill"])]
    m = np.zeros(len(rows), bool)
    m[min(span):max(span) + 1] = True
    print(f"{'':6s} live busy time in steps with prefill: {100 * ms[m & pf].sum() / ms[m].sum():.0f}%")
