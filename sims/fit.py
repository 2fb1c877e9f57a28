"""Fit the spec's latency–throughput model ``T = α·(1/L)^β·min(B, C/L)`` and alternatives.

L: first-token latency (ms); T: output throughput (tokens/s); B: block size; C: bandwidth (GB/s).
Taking logs, ``log T − log min(B, C/L) = log α + β·(−log L)``: ordinary least squares in log space
(scipy.stats.linregress) gives α, β, their 95% confidence intervals (t distribution) and R².
The `C/L` term mixes units (GB/s over ms) and the spec's α, β are unverified vendor figures, so we
report what the data says and compare with forms that need no such term:

* power law        T = a·L^b                     (log-log linear)
* saturating       T = Tmax·L / (L + L_half)     (throughput approaching a ceiling)
"""
from __future__ import annotations

import csv
import json
import math
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from scipy import optimize, stats


@dataclass
class FitResult:
    form: str
    params: dict[str, float]
    ci95: dict[str, tuple[float, float]]
    r2_log: float                       # R² of log T (what the fit minimizes)
    r2: float                           # R² of T itself
    rmse_log: float
    aic: float
    residuals_log: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _summary(form, params, ci, logT, pred_log, k) -> FitResult:
    resid = logT - pred_log
    n = len(logT)
    ss_res = float((resid ** 2).sum())
    ss_tot = float(((logT - logT.mean()) ** 2).sum())
    T, P = np.exp(logT), np.exp(pred_log)
    ss_tot_lin = float(((T - T.mean()) ** 2).sum())
    r2_lin = 1.0 - float(((T - P) ** 2).sum()) / ss_tot_lin if ss_tot_lin > 0 else float("nan")
    aic = n * math.log(max(ss_res / n, 1e-300)) + 2 * k
    return FitResult(form, params, ci, 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan"),
                     r2_lin, math.sqrt(ss_res / n), aic, [float(r) for r in resid])


def _check(L, T):
    L, T = np.asarray(L, dtype=np.float64), np.asarray(T, dtype=np.float64)
    ok = (L > 0) & (T > 0) & np.isfinite(L) & np.isfinite(T)
    if ok.sum() < 3:
        raise ValueError(f"need at least 3 points with positive latency and throughput, got {ok.sum()}")
    return L[ok], T[ok]


def fit_spec(L, T, block_size: float, bandwidth_gbps: float) -> FitResult:
    """α, β of T = α·(1/L)^β·min(B, C/L)."""
    L, T = _check(L, T)
    offset = np.log(np.minimum(block_size, bandwidth_gbps / L))
    x, y = -np.log(L), np.log(T) - offset
    res = stats.linregress(x, y)
    n = len(L)
    tq = stats.t.ppf(0.975, n - 2)
    log_a, beta = res.intercept, res.slope
    a_ci = (math.exp(log_a - tq * res.intercept_stderr), math.exp(log_a + tq * res.intercept_stderr))
    b_ci = (beta - tq * res.stderr, beta + tq * res.stderr)
    pred = log_a + beta * x + offset
    return _summary("spec: T = a*(1/L)^b*min(B, C/L)", {"alpha": math.exp(log_a), "beta": beta},
                    {"alpha": a_ci, "beta": b_ci}, np.log(T), pred, 2)


def fit_power(L, T) -> FitResult:
    L, T = _check(L, T)
    res = stats.linregress(np.log(L), np.log(T))
    tq = stats.t.ppf(0.975, len(L) - 2)
    a = math.exp(res.intercept)
    ci = {"a": (math.exp(res.intercept - tq * res.intercept_stderr),
                math.exp(res.intercept + tq * res.intercept_stderr)),
          "b": (res.slope - tq * res.stderr, res.slope + tq * res.stderr)}
    pred = res.intercept + res.slope * np.log(L)
    return _summary("power: T = a*L^b", {"a": a, "b": res.slope}, ci, np.log(T), pred, 2)


def fit_saturating(L, T) -> FitResult:
    L, T = _check(L, T)
    logT = np.log(T)

    def model(logL, log_tmax, log_lh):
        Lx = np.exp(logL)
        return log_tmax + logL - np.log(Lx + np.exp(log_lh))

    p0 = (math.log(T.max() * 1.2), math.log(float(np.median(L))))
    try:
        with warnings.catch_warnings():  # a perfect fit has no covariance estimate: keep quiet
            warnings.simplefilter("ignore", optimize.OptimizeWarning)
            popt, pcov = optimize.curve_fit(model, np.log(L), logT, p0=p0, maxfev=20000)
    except RuntimeError:
        popt, pcov = np.array(p0), np.full((2, 2), np.inf)
    se = np.sqrt(np.clip(np.diag(pcov), 0, None))
    tq = stats.t.ppf(0.975, len(L) - 2)
    ci = {"t_max": (_exp(popt[0] - tq * se[0]), _exp(popt[0] + tq * se[0])),
          "l_half_ms": (_exp(popt[1] - tq * se[1]), _exp(popt[1] + tq * se[1]))}
    pred = model(np.log(L), *popt)
    return _summary("saturating: T = Tmax*L/(L+L_half)",
                    {"t_max": _exp(popt[0]), "l_half_ms": _exp(popt[1])}, ci, logT, pred, 2)


def _exp(x: float) -> float:
    """exp that saturates to inf (a runaway parameter) instead of raising."""
    return math.exp(x) if x < 700 else math.inf


def verdict(spec: FitResult, alternatives: list[FitResult]) -> str:
    """A plain sentence on how well the spec's model fits, relative to the alternatives."""
    best = min([spec, *alternatives], key=lambda f: f.aic)
    runs = _sign_runs(spec.residuals_log)
    words = []
    if spec.r2_log >= 0.95 and spec.rmse_log < 0.1:
        words.append(f"the spec's model fits well (R² {spec.r2_log:.3f} in log space)")
    elif spec.r2_log >= 0.8:
        words.append(f"the spec's model fits only roughly (R² {spec.r2_log:.3f} in log space, "
                     f"typical error {100 * (math.exp(spec.rmse_log) - 1):.0f}%)")
    else:
        words.append(f"the spec's model fits BADLY (R² {spec.r2_log:.3f} in log space, typical error "
                     f"{100 * (math.exp(spec.rmse_log) - 1):.0f}%): do not use its α, β for planning")
    if runs is not None and runs < 0.35:
        words.append("its residuals run in long same-sign stretches, i.e. the curve has the wrong shape")
    if best is not spec:
        words.append(f"'{best.form}' describes these points better (AIC {best.aic:.1f} vs {spec.aic:.1f})")
    return "; ".join(words) + "."


def _sign_runs(resid: list[float]) -> float | None:
    """Observed sign runs / expected runs under independence (≪1: systematic misfit)."""
    s = np.sign(resid)
    s = s[s != 0]
    n_pos, n_neg = int((s > 0).sum()), int((s < 0).sum())
    if n_pos == 0 or n_neg == 0 or len(s) < 6:
        return None
    runs = 1 + int((s[1:] != s[:-1]).sum())
    expected = 1 + 2 * n_pos * n_neg / len(s)
    return runs / expected


def fit_all(L, T, block_size: float, bandwidth_gbps: float) -> dict:
    spec = fit_spec(L, T, block_size, bandwidth_gbps)
    alts = [fit_power(L, T), fit_saturating(L, T)]
    L, T = _check(L, T)
    return {"alpha": spec.params["alpha"], "beta": spec.params["beta"],
            "alpha_ci": list(spec.ci95["alpha"]), "beta_ci": list(spec.ci95["beta"]),
            "r2": spec.r2_log, "r2_linear": spec.r2, "rmse_log": spec.rmse_log,
            "residuals_log": spec.residuals_log, "num_points": len(L),
            "block_size": block_size, "bandwidth_gbps": bandwidth_gbps,
            "latency_ms": L.tolist(), "throughput_tok_s": T.tolist(),
            "verdict": verdict(spec, alts),
            "alternatives": [a.to_dict() for a in alts]}


def predict_spec(L, alpha: float, beta: float, block_size: float, bandwidth_gbps: float):
    L = np.asarray(L, dtype=np.float64)
    return alpha * L ** (-beta) * np.minimum(block_size, bandwidth_gbps / L)


def load_points(path: str | Path, latency_key: str = "ttft_ms", stat: str = "p50"):
    """(L, T) from a CSV `latency_ms,throughput_tok_s` or a sweep JSON ({"points": [run results]})."""
    path = Path(path)
    text = path.read_text()
    if text.lstrip().startswith(("{", "[")):
        doc = json.loads(text)
        pts = doc["points"] if isinstance(doc, dict) else doc
        L = [p[latency_key][stat] if isinstance(p[latency_key], dict) else p[latency_key] for p in pts]
        T = [p["output_throughput"] for p in pts]
        return np.array(L, dtype=np.float64), np.array(T, dtype=np.float64)
    rows = list(csv.DictReader(text.splitlines()))
    if not rows or "latency_ms" not in rows[0] or "throughput_tok_s" not in rows[0]:
        raise ValueError(f"{path}: expected a CSV with header latency_ms,throughput_tok_s")
    return (np.array([float(r["latency_ms"]) for r in rows]),
            np.array([float(r["throughput_tok_s"]) for r in rows]))
