"""Issue 35, session 16 (H35F): a WHAT-IF profile whose pause check carries a stand-in for the run the
profiler does not measure yet, "sustained_mixed" (the capped mixed step — a 256-token chunk beside the
decodes — paused and back to back for 2.5 s; sims.profile_cost "Power by step kind"). The stand-in
comes from the LIVE steps of the same call, so a replay with it is a what-if, not a validation:

- the step: the live busy steps with one 256-token chunk beside decodes, their median decode count d
  and median context per decode c;
- r_mix = sum of live times / sum of the profile's base times (the cost model with the power cap off,
  at each step's own composition) over those steps whose prefill-busy exponential average (the
  profile's trace tau, or the 100 ms window where the profile has no trace) was >= 0.9: the steps a
  sustained run of them stands for. paused_ms_median = the base at (d, 256, c), step_ms_median =
  that x r_mix (no trace: the model takes the level as measured).

    python whatif_mixed_run.py R OUT.json      # R: a grid part's directory (validate, steps, profile)
"""
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench.simulator.fidelity_steps import busy_shares, live_steps, read_steps
from scheduler.decisions import read_log
from sims.profile_cost import POWER_CAP_WINDOW_S, ProfileCost

CHUNK = 256
FULL = 0.9


def main(argv):
    R, out = Path(argv[0]), Path(argv[1])
    tag = R.name
    prof = R / f"profile_{tag}.json"
    doc = json.loads(prof.read_text())
    arr, _ = read_log(R / f"decisions_{tag}.jsonl.gz")
    steps, _ = live_steps(read_steps(R / f"steps_{tag}.jsonl.gz"), {a.request_id: a.max_tokens for a in arr})
    base = ProfileCost.from_json(prof, hide_launch=True)
    capped = ProfileCost.from_json(prof, hide_launch=True, power_cap=True, cap_by_power=False)
    tau = capped.power_cap_tau_s
    window = capped.power_cap_window_s or POWER_CAP_WINDOW_S
    sel, ds, cs, live, model = [], [], [], [], []
    for k, s in enumerate(steps):
        if s["idle_before"] or not s["d"] or s["p"] != CHUNK or len(s["chunks"]) != 1:
            continue
        ds.append(s["d"])
        cs.append(s["ctx"] / s["d"])
        f = busy_shares(steps, k, window, tau)[0]
        if f >= FULL:
            ctx = s["ctx"] + sum(n + st for n, st in s["chunks"])
            live.append(s["ms"])
            model.append(1e3 * base.step_time(s["d"], s["p"], ctx, s["chunks"]))
            sel.append(k)
    if not sel:
        print(f"{tag}: no busy step of one {CHUNK}-token chunk at a prefill-busy average >= {FULL} "
              f"(tau {tau}): no stand-in (the cap model {capped.describe()['power_cap']})")
        return
    d, c = int(np.median(ds)), int(np.median(cs))
    r_mix = sum(live) / sum(model)
    paused = 1e3 * base.step_time(d, CHUNK, d * c + CHUNK)
    run = {"run": "sustained_mixed", "num_decode_seqs": d, "num_prefill_tokens": CHUNK, "decode_context_len": c,
           "paused_ms_median": round(paused, 4), "step_ms_median": round(paused * r_mix, 4),
           "whatif": (f"stand-in from the live steps of {tag}: {len(sel)} busy steps of one {CHUNK}-token chunk "
                      f"beside decodes with the prefill-busy average >= {FULL} (tau {tau}, window {window:.3f} s), "
                      f"live / base {r_mix:.4f}; d, c the medians of {len(ds)} such steps")}
    doc["pause_check"]["runs"] = [r for r in doc["pause_check"]["runs"] if r["run"] != "sustained_mixed"] + [run]
    doc["whatif_sustained_mixed"] = run["whatif"]
    out.write_text(json.dumps(doc, indent=1))
    check = ProfileCost.from_json(out, hide_launch=True, power_cap=True, cap_by_power=True)
    print(f"{tag}: {run['whatif']}")
    print(f"  run {json.dumps({k: v for k, v in run.items() if k != 'whatif'})}")
    print(f"  model: {json.dumps(check.describe()['power_cap'])}")


if __name__ == "__main__":
    main(sys.argv[1:])
