"""Configuration search: batcher settings × backend count maximizing goodput per GPU under a
P99 SLO, and what the gateway window costs or buys against no window (min_latency_ms = 0: every
request is flushed the moment it arrives)."""
from __future__ import annotations

import itertools
from dataclasses import replace

from sims.runner import RunSpec
from sims.sweep import run_many


def build_grid(base: RunSpec, backends: list[int], max_batch_size: list[int],
               min_latency_ms: list[float], target_throughput: list[float],
               idle_flush: list[bool]) -> list[RunSpec]:
    specs, seen = [], set()
    for nb, mb, ml, tt, idle in itertools.product(backends, max_batch_size, min_latency_ms,
                                                  target_throughput, idle_flush):
        if ml == 0:  # no window: the other batcher knobs do nothing, keep one representative
            mb, tt, idle = max(max_batch_size), max(target_throughput), True
        key = (nb, mb, ml, tt, idle)
        if key in seen:
            continue
        seen.add(key)
        spec = replace(base, engine=replace(base.engine, num_backends=nb))
        specs.append(spec.with_batcher(max_batch_size=mb, min_latency_ms=ml, target_throughput=tt,
                                       idle_flush=idle))
    return specs


def _row(rep: dict, slo_ttft: float | None, slo_tpot: float | None) -> dict:
    cfg = rep["config"]
    gpus = cfg["backends"] * cfg["tp"]
    ok = ((slo_ttft is None or rep["ttft_ms"]["p99"] <= slo_ttft)
          and (slo_tpot is None or rep["tpot_ms"]["p99"] <= slo_tpot))
    return {"backends": cfg["backends"], "gpus": gpus, "max_batch_size": cfg["max_batch_size"],
            "min_latency_ms": cfg["min_latency_ms"], "target_throughput": cfg["target_throughput"],
            "idle_flush": cfg["idle_flush"], "meets_p99_slo": ok,
            "goodput": rep["goodput"], "goodput_per_gpu": rep["goodput"] / gpus,
            "goodput_fraction": rep["goodput_fraction"],
            "ttft_p99_ms": rep["ttft_ms"]["p99"], "tpot_p99_ms": rep["tpot_ms"]["p99"],
            "ttft_p50_ms": rep["ttft_ms"]["p50"], "mean_batch_size": rep["batch_size"]["mean"],
            "batches_per_s": rep["batch_size"]["num_batches"] / max(rep["duration_s"], 1e-12),
            "output_throughput": rep["output_throughput"]}


def _key(r: dict):
    return (r["meets_p99_slo"], r["goodput_per_gpu"], -r["gpus"], -r["ttft_p99_ms"])


def search(specs: list[RunSpec], jobs: int | None = None, progress: bool = True) -> dict:
    base = specs[0]
    reports = run_many(specs, jobs, progress)
    rows = [_row(r, base.slo_ttft_ms, base.slo_tpot_ms) for r in reports]
    rows.sort(key=_key, reverse=True)
    best = rows[0]
    windowed = [r for r in rows if r["min_latency_ms"] > 0]
    no_window = [r for r in rows if r["min_latency_ms"] == 0]
    comparison = None
    if windowed and no_window:
        bw = windowed[0]
        same = [r for r in no_window if r["backends"] == bw["backends"]] or no_window
        nw = same[0]
        comparison = {
            "best_window": bw, "no_window": nw,
            "goodput_per_gpu_gain": bw["goodput_per_gpu"] - nw["goodput_per_gpu"],
            "ttft_p99_cost_ms": bw["ttft_p99_ms"] - nw["ttft_p99_ms"],
            "tpot_p99_change_ms": bw["tpot_p99_ms"] - nw["tpot_p99_ms"],
            "batches_per_s_saved": nw["batches_per_s"] - bw["batches_per_s"],
            "mean_batch_size": (bw["mean_batch_size"], nw["mean_batch_size"]),
        }
    return {"best": best, "feasible": any(r["meets_p99_slo"] for r in rows),
            "slo": {"ttft_p99_ms": base.slo_ttft_ms, "tpot_p99_ms": base.slo_tpot_ms},
            "window_vs_no_window": comparison, "candidates": rows}
