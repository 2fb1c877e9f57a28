"""Issue 35, session 18 (H35W): the power cap's window form against the pause check's sustained trace,
and against the live steps right after a prefill step, on the committed H200 parts with a trace.

(1) trace: per profile, the "sustained" trace (a 512-token prefill step back to back for 2.5 s after
    0.5 s idle) as a ratio to the paused step, in time bins, against the model's factor along the
    same run (today's form: one exponential average, tau from `fit_sustained_trace`, which skips the
    first step and the first 50 ms) and two window forms whose terms come from the trace alone, with
    r (the settled ratio) unchanged:
      A  one exponential average, tau fitted through the model's factor to the whole trace (first
         step, which pays the idle launch, left out);
      B  two exponential averages, factor excess w * x(tau_f) + (1 - w) * x(tau_s), each x with its
         own f_ref (`ewma_duty_ref`), (tau_f, tau_s, w) fitted alike.
(2) live: per part, e = log(model / live) of the steps with prefill (after a step, not idle),
    built by H35C's `chunk_bins.part_steps` (imported), regressed as H35C's `call_level.regress`,
    and the contrast "after a prefill step" minus the others per load, for today's form and A, B.
(3) live state scan: the same steps' slowdown over the BARE profile (no cap factor), -log(bare / live),
    regressed on shape controls (const, later chunk, k > 1, d / 64) and ONE cap state
    x_tau = max(0, f_tau - f_ref(tau)) / (1 - f_ref(tau)) x compute share / the check step's, f_tau the
    prefill-busy exponential average with time constant tau, for tau on a grid: which time constant do
    the live steps follow (residual sd, the state's coefficient = the live r - 1 the data implies)?

    python window.py [trace|live|all] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from itertools import pairwise
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
sys.path.insert(0, str(HERE.parent / "fidelity_chunks_s18"))

from bench.simulator.fidelity_steps import busy_shares
from sims.profile_cost import ProfileCost, ewma_duty_ref

R = HERE.parent
PARTS = {
    "6.7b-s16": R / "fidelity_grid_h200_s16" / "6.7b",
    "6.7b-fp8-s16": R / "fidelity_grid_h200_s16" / "6.7b-fp8",
    "33b-fp8-s16": R / "fidelity_grid_h200_s16" / "33b-fp8",
    "33b-fp8-s17": R / "fidelity_grid_h200_s17" / "33b-fp8",
}
LOADS = ("0.5x", "0.8x", "0.95x", "1.2x")
EDGES = (0, 25, 50, 100, 150, 200, 300, 500, 1000, 2600)


def load(part: Path):
    tag = part.name
    doc = json.loads((part / f"profile_{tag}.json").read_text())
    val = json.loads((part / f"validate_{tag}.json").read_text())
    cost = ProfileCost.from_json(str(part / f"profile_{tag}.json"), **dict(val["profile"]["model_terms"]))
    meta = doc.get("meta", doc)
    check = meta["pause_check"]
    runs = {r["run"]: r for r in check["runs"]}
    base = float(np.mean([runs[k]["step_ms_median"] for k in ("paused", "paused_again")]))
    pause_s = float(meta["pause_ms"]) / 1e3
    return cost, runs["sustained"], base, pause_s


def x_of(t_s, tau, f_ref):
    """The factor's excess share (0..1) along a back-to-back run from idle: f = 1 - e^-t/tau."""
    f = -np.expm1(-np.asarray(t_s) / tau)
    return np.maximum(0.0, f - f_ref) / (1.0 - f_ref)


def fit_forms(t_s, ratio, r, base_s, pause_s):
    """Forms A and B fitted to the trace ratio (first step left out) with r fixed."""
    t, y = np.asarray(t_s)[1:], np.asarray(ratio)[1:]
    taus = np.geomspace(0.003, 3.0, 90)
    X = {tau: x_of(t, tau, ewma_duty_ref(base_s, pause_s, tau)) for tau in taus}
    bestA = min((float(((1 + (r - 1) * X[tau] - y) ** 2).mean()), tau) for tau in taus)
    bestB = None
    for i, tf in enumerate(taus):
        for ts in taus[i:]:
            for w in np.linspace(0.0, 1.0, 21):
                m = float(((1 + (r - 1) * (w * X[tf] + (1 - w) * X[ts]) - y) ** 2).mean())
                if bestB is None or m < bestB[0]:
                    bestB = (m, tf, ts, w)
    return {"A": {"comps": [(float(bestA[1]), 1.0)], "rmse": bestA[0] ** 0.5},
            "B": {"comps": [(float(bestB[1]), float(bestB[3])), (float(bestB[2]), float(1 - bestB[3]))],
                  "rmse": bestB[0] ** 0.5}}


def form_ratio(t_s, comps, r, base_s, pause_s):
    return 1 + (r - 1) * sum(w * x_of(t_s, tau, ewma_duty_ref(base_s, pause_s, tau)) for tau, w in comps)


def trace_part(name: str, part: Path) -> dict:
    cost, run, base, pause_s = load(part)
    t = np.asarray(run["trace_t_ms"]) / 1e3
    y = np.asarray(run["trace_ms"]) / base
    out = {"name": name, "paused_ms": base, "cap": None}
    print(f"\n## {name}: paused {base:.3f} ms, trace {len(t)} steps; the fit today: "
          f"{ {k: round(v, 4) if isinstance(v, float) else v for k, v in (cost.sustained_fit or {}).items()} }")
    bins = [(lo, hi, (t * 1e3 >= lo) & (t * 1e3 < hi)) for lo, hi in pairwise(EDGES)]
    print("  t (ms)      " + " ".join(f"{f'{lo}-{hi}':>9s}" for lo, hi, _ in bins))
    print("  trace       " + " ".join(f"{y[m].mean():9.4f}" if m.any() else f"{'':9s}" for _, _, m in bins))
    print("  n           " + " ".join(f"{int(m.sum()):9d}" for _, _, m in bins))
    if cost._cap is None or cost.power_cap_tau_s is None:
        print("  the model has no cap factor here")
        return out
    f_ref, r, _ = cost._cap
    if r <= 1.0:
        print(f"  r = {r:.4f} (the trace settles at or below the paused step): the factor is 1, no window form matters")
        return out
    tau0 = cost.power_cap_tau_s
    forms = {"today": {"comps": [(tau0, 1.0)]}, **fit_forms(t, y, r, base / 1e3, pause_s)}
    for k, v in forms.items():
        mr = form_ratio(t, v["comps"], r, base / 1e3, pause_s)
        v["rmse"] = float(np.sqrt(((mr[1:] - y[1:]) ** 2).mean()))
        early = (t > 0) & (t < 0.3)
        v["rmse_300ms"] = float(np.sqrt(((mr[early] - y[early]) ** 2).mean()))
        desc = " + ".join(f"{w:.2f} x tau {1e3 * tau:.0f} ms (f_ref {ewma_duty_ref(base / 1e3, pause_s, tau):.3f})"
                          for tau, w in v["comps"] if w > 0)
        print(f"  {k:11s} " + " ".join(f"{mr[m].mean():9.4f}" if m.any() else f"{'':9s}" for _, _, m in bins)
              + f"   rmse {v['rmse']:.4f} (< 300 ms {v['rmse_300ms']:.4f}); {desc}")
    print("  first steps (t ms: trace / today / A / B): " + "  ".join(
        f"{1e3 * t[i]:.0f}: {y[i]:.3f}/" + "/".join(f"{form_ratio(t[i:i + 1], forms[k]['comps'], r, base / 1e3, pause_s)[0]:.3f}"
                                                  for k in ("today", "A", "B")) for i in range(min(8, len(t)))))
    clk = run.get("trace_sm_clock_mhz") or []
    print("  SM clock (t ms: MHz): " + "  ".join(f"{c[0]:.0f}: {c[1]:.0f}" for c in clk[:6]))
    out.update(cap={"f_ref": f_ref, "r": r}, forms=forms)
    return out


def alt_model(cost, steps, comps, pause_s, base_s):
    """Per step (index, model ms) with the cap factor's window form replaced by `comps`
    [(tau, weight)], the rest as `fidelity_steps.model_step_ms` charges it."""
    f_ref0, r, r_dec = cost._cap
    idle = cost.launch_time if cost.hides_launch else None
    horizon = 6.0 * max(tau for tau, _ in comps)
    out = []
    try:
        for k, s in enumerate(steps):
            if not s["d"] and not s["p"]:
                continue
            chunks = s["chunks"] or None
            ctx = s["ctx"] + sum(n + st for n, st in s["chunks"])
            t = cost.step_time(s["d"], s["p"], ctx, chunks)
            cs = cost.compute_share(s["d"], s["p"], ctx, chunks) if cost.caps_by_compute else None
            if s["p"] or cs is not None:
                x = 0.0
                for tau, w in comps:
                    f, g = busy_shares(steps, k, horizon, tau)
                    cost._cap = (ewma_duty_ref(base_s, pause_s, tau), r, r_dec)
                    x += w * (cost.prefill_slowdown(f, g, cs) - 1.0)
                t *= 1.0 + x
            if idle is not None and s["idle_before"]:
                t += idle(s["d"], s["p"])
            out.append((k, 1e3 * t))
    finally:
        cost._cap = (f_ref0, r, r_dec)
    return out


def contrast(steps):
    """Per load: mean e of the steps with prefill right after a prefill step minus the other
    steps with prefill (after a step), in pp, ± se, n."""
    res = {}
    for ld in LOADS:
        a = [s["lr"] for s in steps if s["lr"] is not None and s["p"] and s["load"] == ld and s["since_prefill"] == 0]
        b = [s["lr"] for s in steps if s["lr"] is not None and s["p"] and s["load"] == ld
             and s["since_prefill"] is not None and s["since_prefill"] > 0]
        if len(a) > 2 and len(b) > 2:
            res[ld] = (100 * (np.mean(a) - np.mean(b)),
                       100 * np.sqrt(np.var(a) / len(a) + np.var(b) / len(b)), len(a), len(b),
                       100 * np.mean(a + b))
    return res


def live_part(name: str, part: Path, forms: dict | None) -> dict:
    from call_level import regress
    from chunk_bins import part_steps
    steps, cost, _val = part_steps(part)
    _c, _run, base, pause_s = load(part)
    out = {}
    variants = {"today": None}
    if forms:
        variants.update({k: v["comps"] for k, v in forms.items() if k != "today"})
    lr0 = [s["lr"] for s in steps]
    for vname, comps in variants.items():
        if comps is not None:
            for s in steps:
                s["lr"] = None
            for k, t in alt_model(cost, steps, comps, pause_s, base / 1e3):
                steps[k]["lr"] = float(np.log(t / steps[k]["ms"]))
        c = contrast(steps)
        out[vname] = {ld: list(v) for ld, v in c.items()}
        print(f"  {name:12s} {vname:5s} after-prefill contrast (pp ± se; n after / others; all steps with prefill mean %): "
              + "  ".join(f"{ld} {v[0]:+.2f}±{v[1]:.2f} ({v[2]}/{v[3]}; {v[4]:+.2f})" for ld, v in c.items()))
        print("    regress: ", end="")
        regress(vname, steps)
        for s, v in zip(steps, lr0):
            s["lr"] = v
    out["scan"] = state_scan(name, steps, cost, pause_s, base / 1e3)
    return out


SCAN_TAUS = (0.01, 0.02, 0.031, 0.05, 0.08, 0.15, 0.38, 1.0)


def state_scan(name, steps, cost, pause_s, base_s) -> dict:
    sel = [k for k, s in enumerate(steps) if s["lr"] is not None and s["p"] and s["since_prefill"] is not None
           and s["load"] in LOADS and not s["idle_before"]]
    y, C, cs = [], [], []
    for k in sel:
        s = steps[k]
        chunks = s["chunks"] or None
        ctx = s["ctx"] + sum(n + st for n, st in s["chunks"])
        y.append(-np.log(cost.step_time(s["d"], s["p"], ctx, chunks) * 1e3 / s["ms"]))
        C.append([1.0, float(any(st > 0 for _, st in s["chunks"])), float(len(s["chunks"]) > 1), s["d"] / 64])
        cs.append(cost.compute_share(s["d"], s["p"], ctx, chunks))
    y, C = np.array(y), np.array(C)
    loads = np.array([steps[k]["load"] for k in sel])
    # with a constant per load as well: the slow states also tell the loads apart (the call's level by load)
    CL = np.column_stack([C] + [(loads == ld).astype(float) for ld in LOADS[1:]])
    ref = cost._cap_share_ref or 1.0
    cs = np.array(cs) / ref
    out = {"n": len(y)}
    xs = {}
    for tau in SCAN_TAUS:
        f = np.array([busy_shares(steps, k, 6 * tau, tau)[0] for k in sel])
        fr = ewma_duty_ref(base_s, pause_s, tau)
        xs[tau] = np.maximum(0.0, f - fr) / (1 - fr) * cs
    for cname, CC in (("shape controls", C), ("shape controls + a constant per load", CL)):
        res0 = y - CC @ np.linalg.lstsq(CC, y, rcond=None)[0]
        o = out[cname] = {"sd_controls_only": float(res0.std()), "taus": {}}
        line = []
        for tau in SCAN_TAUS:
            X = np.column_stack([CC, xs[tau]])
            coef = np.linalg.lstsq(X, y, rcond=None)[0]
            res = y - X @ coef
            se = float(np.sqrt(np.linalg.inv(X.T @ X)[-1, -1] * res.var()))
            o["taus"][tau] = {"coef": float(coef[-1]), "se": se, "sd": float(res.std()),
                              "mean_x": float(xs[tau].mean())}
            line.append(f"{1e3 * tau:.0f} ms: {100 * coef[-1]:+.1f}±{100 * se:.1f} sd {100 * res.std():.3f}")
        print(f"  {name:12s} state scan, {cname} (n {len(y)}; controls only sd {100 * res0.std():.3f}%): x_tau "
              "coefficient (%) and residual sd (%) by tau: " + "; ".join(line))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", nargs="?", default="all", choices=("trace", "live", "all"))
    ap.add_argument("--json", dest="json_out")
    a = ap.parse_args(argv)
    print("# (1) the sustained trace / paused step, by time since the first back-to-back step, and the model's factor")
    traces = {n: trace_part(n, p) for n, p in PARTS.items()}
    res = {"trace": traces}
    if a.what in ("live", "all"):
        print("\n# (2) live: e = log(model / live), steps with prefill after a step; today's window form and A, B")
        res["live"] = {n: live_part(n, p, traces[n].get("forms")) for n, p in PARTS.items()}
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(res, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
