"""The statistics of a fidelity comparison (live vs simulated): the figures compared, each
figure's relative error, and their mean with a Student-t interval over runs. Apart from
`bench.simulator.validate` (which runs the comparison) so that the tools that re-simulate a
recorded session (`fidelity_resim`, `fidelity_steps`) use the same numbers without importing the
runner that imports them."""
from __future__ import annotations

import math

import numpy as np

METRICS = (("ttft_p50", "ttft_ms", "p50"), ("ttft_p99", "ttft_ms", "p99"),
           ("tpot_p50", "tpot_ms", "p50"), ("tpot_p99", "tpot_ms", "p99"),
           ("throughput", "output_throughput", None), ("itl_p50", "itl_ms", "p50"))
GOAL = 0.05                      # the target: within 5% of live


def pick(report: dict, key: str, stat: str | None) -> float:
    v = report[key]
    return float(v[stat] if stat else v)


def mean_ci(values, confidence: float = 0.95) -> dict:
    """mean ± t·s/√n (Student t, n − 1 degrees of freedom); half-width NaN for one value."""
    from scipy import stats
    v = np.asarray(values, dtype=np.float64)
    n = len(v)
    m = float(v.mean()) if n else math.nan
    if n < 2:
        return {"mean": m, "ci": math.nan, "n": n}
    s = float(v.std(ddof=1))
    t = float(stats.t.ppf(0.5 + confidence / 2, n - 1))
    return {"mean": m, "ci": t * s / math.sqrt(n), "n": n}


def compare(live: dict, sim: dict) -> dict:
    out = {}
    for name, key, stat in METRICS:
        lv, sv = pick(live, key, stat), pick(sim, key, stat)
        out[name] = {"live": lv, "sim": sv, "rel_err": (sv - lv) / lv if lv else math.nan}
    return out


def summarize_load(runs: list[dict], confidence: float) -> dict:
    out = {}
    for name, _, _ in METRICS:
        cols = {k: [r["compare"][name][k] for r in runs] for k in ("live", "sim", "rel_err")}
        s = {k: mean_ci(v, confidence) for k, v in cols.items()}
        err = s["rel_err"]
        s["within_goal"] = bool(abs(err["mean"]) <= GOAL)
        # the goal holds with confidence only when the whole interval is inside ±5%
        s["within_goal_ci"] = bool(np.isfinite(err["ci"]) and abs(err["mean"]) + err["ci"] <= GOAL)
        out[name] = s
    return out
