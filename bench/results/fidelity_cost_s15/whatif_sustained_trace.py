"""Issue 35, session 15, a WHAT-IF (not a measurement): the 6.7B profile with the pause check the
profiler now runs (on the 512-token prefill-only step, with the sustained run's trace), the trace
stood in as T(t) = paused (1 + (r - 1)(1 - exp(-t / tau))) for 2.5 s of back-to-back steps, so that
the cost model's exponential-average power cap (sims.profile_cost, "Sustained load") can be scored on
the committed logs before the device measures the trace.

    python whatif_sustained_trace.py R PROFILE TAU_S R_MODE TRAIN_SEEDS OUT_PROFILE

R: the grid part's folder (validate JSON, decision and step logs); PROFILE: the profile to start from
(e.g. the decode-bucket what-if); TAU_S: the time constant (live 6.7B clock: ~0.5 s, clock_tau.py);
R_MODE: "none" (the profile as it is: a baseline; nothing written), a number (r itself), "clock:IDLE:BUSY" (r = 1 + (IDLE / BUSY - 1) x the 512-token step's
compute share: its compute part at the busy clock, the live clocks by clock_tau.py), or "fit" (r
from 1.00 to 1.15 by 0.005, the one whose model / live total over TRAIN_SEEDS' busy steps with prefill
is closest to 1, as session 14's whatif_sustained_cap.py). The paused level is the profile's own
(0, 512) point (measured with the 60 ms pause); no after_decode run (r_dec = 1).
"""
import copy
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench.simulator.fidelity_resim import prompt_identity
from bench.simulator.fidelity_steps import live_steps, model_step_ms, read_steps
from scheduler.decisions import read_log
from sims.profile_cost import ProfileCost


def with_trace(doc: dict, tau: float, r: float, p: int = 512, span_s: float = 2.5) -> dict:
    new = copy.deepcopy(doc)
    pt = next(x for x in doc["points"] if x["num_decode_seqs"] == 0 and x["num_prefill_tokens"] == p
              and x.get("num_prefill_seqs", 1) == 1 and not x.get("prefill_context_len"))
    base = pt["step_ms_median"]
    ts, ms, t = [], [], 0.0
    while t < span_s:
        x = base * (1 + (r - 1) * -math.expm1(-t / tau))
        ts.append(round(t * 1e3, 3))
        ms.append(round(x, 4))
        t += x / 1e3
    new["pause_check"] = {"num_prefill_tokens": p, "num_prefill_seqs": 1, "whatif": True, "runs": [
        {"run": "paused", "pause_ms": doc.get("pause_ms", 60.0), "step_ms_median": base},
        {"run": "back_to_back", "pause_ms": 0.0, "step_ms_median": base},
        {"run": "paused_again", "pause_ms": doc.get("pause_ms", 60.0), "step_ms_median": base},
        {"run": "sustained", "pause_ms": 0.0, "step_ms_median": ms[-1], "trace_t_ms": ts, "trace_ms": ms}]}
    new["whatif_sustained"] = {"tau_s": tau, "r": r, "note": "stand-in trace, not measured (issue 35 s15)"}
    return new


def main(argv):
    R, prof_path, tau, mode, train, out = Path(argv[0]), Path(argv[1]), float(argv[2]), argv[3], argv[4], Path(argv[5])
    train = {int(x) for x in train.split(",")}
    tag = R.name
    v = json.loads((R / f"validate_{tag}.json").read_text())
    arr, _ = read_log(R / f"decisions_{tag}.jsonl.gz")
    rows = read_steps(R / f"steps_{tag}.jsonl.gz")
    steps, _ = live_steps(rows, {a.request_id: a.max_tokens for a in arr})
    arr_s = sorted(arr, key=lambda a: a.t)
    _, runs = prompt_identity(v["config"], len(arr_s))
    seeds = [int(x) for x in v["config"]["seeds"].split(",")]
    run_of = {a.request_id: r for a, r in zip(arr_s, runs, strict=True)}
    cur, seed_of = None, []
    for row in rows:
        for rid, _n, _p in row["prefill"]:
            cur = run_of.get(rid, cur)
        seed_of.append(seeds[cur[0]] if cur is not None and cur[0] >= 0 else None)
    doc = json.loads(prof_path.read_text())
    terms = v["profile"]["model_terms"]

    def score(r):
        tmp = out.with_suffix(".tmp.json")
        tmp.write_text(json.dumps(doc if r is None else with_trace(doc, tau, r)))
        cost = ProfileCost.from_json(str(tmp), **terms)
        tmp.unlink()
        m = {k: t for k, t, _ in model_step_ms(cost, steps)}
        res = {}
        for name, sel in (("train", lambda s: s in train), ("held out", lambda s: s is not None and s not in train)):
            ks = [k for k in m if sel(seed_of[k]) and not steps[k]["idle_before"]]
            pk = [k for k in ks if steps[k]["p"]]
            dk = [k for k in ks if not steps[k]["p"]]
            if pk and dk:  # (a part without these seeds: nothing to score)
                res[name] = (sum(m[k] for k in pk) / sum(steps[k]["ms"] for k in pk),
                             sum(m[k] for k in dk) / sum(steps[k]["ms"] for k in dk))
        return cost, res

    if mode == "fit":
        best = None
        for r in np.arange(1.0, 1.1501, 0.005):
            _, res = score(float(r))
            print(f"r {r:.3f}: busy steps model/live, train seeds: with prefill {res['train'][0]:.4f}, "
                  f"decode-only {res['train'][1]:.4f}")
            if best is None or abs(res["train"][0] - 1) < abs(best[1] - 1):
                best = (round(float(r), 3), res["train"][0])
        r = best[0]
    elif mode.startswith("clock:"):
        idle, busy = (float(x) for x in mode.split(":")[1:3])
        share = ProfileCost.from_json(prof_path, **terms).compute_share(0, 512, 512, [512])
        r = 1 + (idle / busy - 1) * share
        print(f"r = 1 + ({idle:.0f} / {busy:.0f} - 1) x compute share {share:.3f} = {r:.4f}")
    elif mode == "none":  # the profile as it is (a baseline for the same step totals)
        _, res = score(None)
        for name, (rp, rd) in res.items():
            print(f"  {name} seeds' busy steps model/live: with prefill {rp:.4f}, decode-only {rd:.4f}")
        return
    else:
        r = float(mode)
    cost, res = score(r)
    fit = cost.sustained_fit
    print(f"tau {tau} s, r {r:.4f}: the trace's fit tau {fit['tau_s']:.3f} s, r {fit['r']:.4f}, f_ref "
          f"{fit['f_ref']:.3f} (the 100 ms window's was 0.4)")
    for name, (rp, rd) in res.items():
        print(f"  {name} seeds' busy steps model/live: with prefill {rp:.4f}, decode-only {rd:.4f}")
    out.write_text(json.dumps(with_trace(doc, tau, r), indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
