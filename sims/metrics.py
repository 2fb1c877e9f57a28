"""Per-request metrics with the definitions of `vllm bench serve` (and our live `bench`).

TTFT  first token time − arrival            E2EL  last token time − arrival
TPOT  (E2EL − TTFT) / (output tokens − 1), over requests with more than one output token
ITL   time between consecutive tokens of a request, pooled over all requests; the simulator
      records each step's duration once per sequence that decoded in it (a weighted sample)
Throughput = completed requests (or their output tokens) / (last completion − first arrival).
Goodput    = requests meeting every given SLO (TTFT and TPOT) / the same duration.
"""
from __future__ import annotations

import numpy as np

PCTS = (50, 90, 99)


def stats_ms(values_s: np.ndarray) -> dict[str, float]:
    """{mean, p50, p90, p99} in milliseconds of an array in seconds (NaN-free; empty -> zeros)."""
    v = np.asarray(values_s, dtype=np.float64)
    if v.size == 0:
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
    p = np.percentile(v, PCTS)
    return {"mean": float(v.mean()) * 1e3, **{f"p{q}": float(x) * 1e3 for q, x in zip(PCTS, p)}}


def weighted_stats_ms(values_s: np.ndarray, weights: np.ndarray) -> dict[str, float]:
    """Like `stats_ms` for a sample where values_s[i] occurs weights[i] times (linear interpolation
    between order statistics, as np.percentile does on the expanded sample)."""
    v = np.asarray(values_s, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    keep = w > 0
    v, w = v[keep], w[keep]
    if v.size == 0:
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
    order = np.argsort(v, kind="stable")
    v, w = v[order], w[order]
    ends = np.cumsum(w) - 1.0          # position of each group's last copy in the expanded sample
    total = ends[-1] + 1.0
    out = {"mean": float((v * w).sum() / w.sum()) * 1e3}
    for q in PCTS:
        pos = q / 100.0 * (total - 1.0)
        lo, hi = np.floor(pos), np.ceil(pos)
        v_lo = v[np.searchsorted(ends, lo)]
        v_hi = v[np.searchsorted(ends, hi)]
        out[f"p{q}"] = float(v_lo + (v_hi - v_lo) * (pos - lo)) * 1e3
    return out


def request_metrics(arrival, first_token, finish, num_output, *, slo_ttft_s=None, slo_tpot_s=None):
    """Arrays per completed request -> (ttft, tpot, e2el, good mask)."""
    ttft = first_token - arrival
    e2el = finish - arrival
    multi = num_output > 1
    tpot = np.where(multi, (e2el - ttft) / np.maximum(num_output - 1, 1), 0.0)
    good = np.ones(len(arrival), dtype=bool)
    if slo_ttft_s is not None:
        good &= ttft <= slo_ttft_s
    if slo_tpot_s is not None:
        good &= tpot <= slo_tpot_s
    return ttft, tpot, e2el, good, multi
