"""Run many configurations over the cores, with a progress bar; mark the Pareto frontier."""
from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time

import numpy as np

from sims.runner import RunSpec, run_spec


def run_many(specs: list[RunSpec], jobs: int | None = None, progress: bool = True) -> list[dict]:
    """Reports in the order of `specs`; parallel over `jobs` processes (default: all cores)."""
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(specs)))
    out: list[dict | None] = [None] * len(specs)
    t0 = time.perf_counter()
    done = 0

    def tick():
        if progress:
            width = 30
            k = int(width * done / len(specs))
            sys.stderr.write(f"\r[{'#' * k}{'-' * (width - k)}] {done}/{len(specs)} runs "
                             f"{time.perf_counter() - t0:.1f}s")
            sys.stderr.flush()

    tick()
    if jobs == 1:
        for i, spec in enumerate(specs):
            out[i] = run_spec(spec)
            done += 1
            tick()
    else:
        ctx = mp.get_context("fork" if sys.platform != "win32" else "spawn")
        with ctx.Pool(jobs) as pool:
            for i, rep in pool.imap_unordered(_indexed, list(enumerate(specs))):
                out[i] = rep
                done += 1
                tick()
    if progress:
        sys.stderr.write("\n")
    return out  # type: ignore[return-value]


def _indexed(item: tuple[int, RunSpec]) -> tuple[int, dict]:
    return item[0], run_spec(item[1])


def pareto_mask(latency: np.ndarray, throughput: np.ndarray) -> np.ndarray:
    """True where no other point has latency <= and throughput >= with one strictly better."""
    L, T = np.asarray(latency, dtype=float), np.asarray(throughput, dtype=float)
    keep = np.ones(len(L), dtype=bool)
    for i in range(len(L)):
        dominated = (L <= L[i]) & (T >= T[i]) & ((L < L[i]) | (T > T[i]))
        keep[i] = not dominated.any()
    return keep


def sweep_points(reports: list[dict], latency_key: str = "ttft_ms", stat: str = "p50") -> list[dict]:
    """Flatten reports into sweep points (config + headline metrics), Pareto-optimal ones marked."""
    L = np.array([r[latency_key][stat] for r in reports])
    T = np.array([r["output_throughput"] for r in reports])
    mask = pareto_mask(L, T)
    points = []
    for rep, on_front in zip(reports, mask):
        p = {**rep["config"]}
        for k in ("request_throughput", "output_throughput", "goodput", "goodput_fraction",
                  "ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "queue_wait_ms", "completed", "rejected",
                  "preemptions"):
            p[k] = rep[k]
        p["mean_batch_size"] = rep["batch_size"]["mean"]
        p["kv_mean_usage"] = rep["kv"]["mean_usage"]
        p["pareto"] = bool(on_front)
        points.append(p)
    return points


CSV_FIELDS = ("rate", "backends", "max_batch_size", "min_latency_ms", "idle_flush",
              "request_throughput", "output_throughput", "goodput", "ttft_p50_ms", "ttft_p99_ms",
              "tpot_p50_ms", "tpot_p99_ms", "mean_batch_size", "pareto")


def write_csv(points: list[dict], path: str, latency_stat: str = "p50") -> None:
    """CSV with `latency_ms,throughput_tok_s` first (what `sim fit` reads), then details."""
    import csv
    with open(path, "w", newline="") as fh:
        wr = csv.writer(fh)
        wr.writerow(("latency_ms", "throughput_tok_s") + CSV_FIELDS)
        for p in points:
            row = {**p, "ttft_p50_ms": p["ttft_ms"]["p50"], "ttft_p99_ms": p["ttft_ms"]["p99"],
                   "tpot_p50_ms": p["tpot_ms"]["p50"], "tpot_p99_ms": p["tpot_ms"]["p99"]}
            wr.writerow((p["ttft_ms"][latency_stat], p["output_throughput"])
                        + tuple(row[f] for f in CSV_FIELDS))
