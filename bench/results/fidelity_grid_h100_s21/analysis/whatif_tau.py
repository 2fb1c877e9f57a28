"""Issue 35, session 20, a what-if (rejected): the sustained trace's tau floored at FLOOR s (the fit
skips the trace's first 50 ms, so a tau below that is not resolved: the 33b-mixed profile's fit gave
0.0114 s). Run from the repo root: python whatif_tau.py FLOOR <validate_replay arguments>"""
import sys

import numpy as np

import sims.profile_cost as pc
from bench.simulator import validate_replay as vr

FLOOR = float(sys.argv[1]); argv = sys.argv[2:]
orig = pc.fit_sustained_trace
def fit(t_s, step_ms, skip_first=1, skip_s=0.05):
    f = orig(t_s, step_ms, skip_first, skip_s)
    if f is None or f["tau_s"] >= FLOOR:
        return f
    # refit with tau on the grid from FLOOR
    t = np.asarray(t_s, float); y = np.asarray(step_ms, float)
    keep = (np.arange(len(t)) >= skip_first) & (t >= t[0] + skip_s); t, y = t[keep], y[keep]; t = t - t[0]
    span = float(t[-1]); best = None
    for tau in np.geomspace(FLOOR, 4.0 * span, 240):
        x = -np.expm1(-t / tau); X = np.stack([np.ones_like(x), x], -1)
        coef, *_ = np.linalg.lstsq(X, y, rcond=None); sse = float(((X @ coef - y) ** 2).sum())
        if best is None or sse < best[0]: best = (sse, float(tau), float(coef[0]), float(coef[1]))
    sse, tau, a, b = best; end = a - b * np.expm1(-span / tau); settled = tau <= span / 3
    return {"tau_s": tau, "start_ms": a, "end_ms": float(end), "steady_ms": a + b if settled else float(end),
            "settled": bool(settled), "rmse_ms": float(np.sqrt(sse / len(y))), "n": len(y)}
pc.fit_sustained_trace = fit
vr.main(argv)
