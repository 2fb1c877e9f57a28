"""Issue 35, session 14, a what-if (not a validation): the 6.7B profile with the power cap its pause
check did not see. The s14 profile's pause check read back to back 0.91 x paused (ten 6.3 ms steps:
63 ms, shorter than the power limiter's response), so the model had no cap, while live the steps
with prefill under sustained load ran 6% over it. Here the check's back-to-back figure is replaced
by paused x r, r chosen on the TRAIN seeds' live busy steps with prefill (model / live total closest
to 1, r in steps of 0.01), and the profile written for scoring on the held-out seeds
(validate_replay --seeds 2,3,4). It stands in for what the profiler's new "sustained" run (a second
back to back before timing) is to measure on the device.

    python whatif_sustained_cap.py R TRAIN_SEEDS OUT_PROFILE > whatif_sustained_cap.txt
"""
import copy
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))

from bench.simulator.fidelity_resim import prompt_identity
from bench.simulator.fidelity_steps import live_steps, model_step_ms, read_steps
from scheduler.decisions import read_log
from sims.profile_cost import ProfileCost

R, train, OUT = Path(sys.argv[1]), {int(x) for x in sys.argv[2].split(",")}, Path(sys.argv[3])
tag = "6.7b"
v = json.loads((R / f"validate_{tag}.json").read_text())
arr, _ = read_log(R / f"decisions_{tag}.jsonl.gz")
rows = read_steps(R / f"steps_{tag}.jsonl.gz")
steps, _ = live_steps(rows, {a.request_id: a.max_tokens for a in arr})
arr_s = sorted(arr, key=lambda a: a.t)
_, runs = prompt_identity(v["config"], len(arr_s))
seeds = [int(x) for x in v["config"]["seeds"].split(",")]
run_of = {a.request_id: r for a, r in zip(arr_s, runs, strict=True)}
cur, keep = None, []
for row in rows:
    for rid, _n, _p in row["prefill"]:
        cur = run_of.get(rid, cur)
    keep.append(cur is not None and cur[0] >= 0 and seeds[cur[0]] in train)
prof = json.loads((R / f"profile_{tag}.json").read_text())
runs_pc = {r["run"]: r for r in prof["pause_check"]["runs"]}
base = (runs_pc["paused"]["step_ms_median"] + runs_pc["paused_again"]["step_ms_median"]) / 2
print(f"pause check as measured: back to back {runs_pc['back_to_back']['step_ms_median'] / base:.3f} x paused, "
      f"after decodes {runs_pc['after_decode']['step_ms_median'] / base:.3f} (both clamped to 1 by the model)")
best = None
for r in np.arange(1.00, 1.201, 0.01):
    p2 = copy.deepcopy(prof)
    for x in p2["pause_check"]["runs"]:
        if x["run"] == "back_to_back":
            x["step_ms_median"] = base * r
    tmp = OUT.with_suffix(".tmp.json")
    tmp.write_text(json.dumps(p2))
    cost = ProfileCost.from_json(str(tmp), **v["profile"]["model_terms"])
    m = {k: t for k, t, _ in model_step_ms(cost, steps)}
    ks = [k for k in m if keep[k] and not steps[k]["idle_before"]]
    pk = [k for k in ks if steps[k]["p"]]
    dk = [k for k in ks if not steps[k]["p"]]
    rp = sum(m[k] for k in pk) / sum(steps[k]["ms"] for k in pk)
    rd = sum(m[k] for k in dk) / sum(steps[k]["ms"] for k in dk)
    print(f"r {r:.2f}: train seeds' busy steps model/live: with prefill {rp:.4f}, decode-only {rd:.4f}")
    if best is None or abs(rp - 1) < abs(best[1] - 1):
        best = (round(float(r), 2), rp, p2)
    tmp.unlink()
OUT.write_text(json.dumps(best[2], indent=1) + "\n")
print(f"chosen r {best[0]:.2f} (steps with prefill {best[1]:.4f} of live on seeds {sorted(train)}) -> {OUT}")
