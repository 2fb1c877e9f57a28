"""Issue 35, session 15: which busy-share measure the live steps' slowdown follows (committed logs;
no device time). For each profile given, the cost model's time at every live busy step with prefill
(not after an idle spell; bench.simulator.fidelity_steps.model_step_ms, the model's own power cap)
over the live time, binned two ways: by the prefill-busy share of the 100 ms before the step (the
window model's f) and by the exponential average with tau 0.5 s (the 6.7B's live clock,
clock_tau.py). A model that follows the live slowdown has the same ratio in every bin of both.
Also the spread (sd of log(model / live)) over the steps, and decode-only steps likewise.

    [TAU=0.5] python step_bins.py R PROFILE [PROFILE...]   # TAU: the EWMA bins (the 33B: 0.2)
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench.simulator.fidelity_steps import busy_shares, live_steps, model_step_ms, read_steps
from scheduler.decisions import read_log
from sims.profile_cost import ProfileCost

TAU = float(__import__("os").environ.get("TAU", "0.5"))
BINS = ((0.0, 0.01), (0.01, 0.3), (0.3, 0.6), (0.6, 1.01))


def main(argv):
    R = Path(argv[0])
    tag = R.name
    import json
    v = json.loads((R / f"validate_{tag}.json").read_text())
    arr, _ = read_log(R / f"decisions_{tag}.jsonl.gz")
    steps, _ = live_steps(read_steps(R / f"steps_{tag}.jsonl.gz"), {a.request_id: a.max_tokens for a in arr})
    busy = [k for k, s in enumerate(steps) if (s["p"] or s["d"]) and not s["idle_before"]]
    f100 = {k: busy_shares(steps, k, 0.1)[0] for k in busy}
    f500 = {k: busy_shares(steps, k, 6 * TAU, TAU)[0] for k in busy}
    for prof in argv[1:]:
        cost = ProfileCost.from_json(prof, **v["profile"]["model_terms"])
        m = {k: t for k, t, _ in model_step_ms(cost, steps)}
        print(f"== {prof}  (power cap {cost.describe()['power_cap']})")
        for kind, sel in (("with prefill", lambda s: s["p"] > 0), ("decode-only", lambda s: s["p"] == 0)):
            ks = [k for k in busy if sel(steps[k]) and k in m]
            lr = np.log([m[k] / steps[k]["ms"] for k in ks])
            tot = sum(m[k] for k in ks) / sum(steps[k]["ms"] for k in ks)
            print(f"  {kind}: {len(ks)} steps, model/live {tot:.4f}, sd of log ratio {lr.std():.4f}")
            for name, f in (("100 ms window", f100), (f"EWMA {TAU:g} s", f500)):
                row = []
                for lo, hi in BINS:
                    b = [k for k in ks if lo <= f[k] < hi]
                    if b:
                        row.append(f"[{lo:.2f},{min(hi, 1):.2f}) {len(b):5d}: "
                                   f"{sum(m[k] for k in b) / sum(steps[k]['ms'] for k in b):.4f}")
                print(f"    by {name:13s} " + "  ".join(row))


if __name__ == "__main__":
    main(sys.argv[1:])
