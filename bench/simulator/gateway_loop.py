"""The gateway's event loop as the simulator models it (`sims.event_loop.EngineConfig.gateway_loop_*`,
issue 35), its terms measured from a `sim validate` session's own files.

Live, one asyncio loop does all of the gateway's work. Every engine step's outputs are read and
fanned out, and each running stream's task then writes its SSE chunk: a job on that loop of about
the path's per-stream cost times the step's streams. A window's timer that falls due meanwhile runs
after those callbacks (asyncio runs a due timer after the ready ones), so the window flushes late
by what is left of the job; a request arriving meanwhile is stamped and pushed late by the same
amount. The simulator charged neither (its window flushes at its deadline; its arrivals are the
live pushes), which is part of why, with every live step time fed back, its TTFT P50 was 3-16%
short on the H200 6.7B (BENCHMARKS, issue 35, session 14, "Outside the steps").

The terms, all from the session (no TTFT is fitted):

- `per_stream_ms`: the delivery path's slope (`bench.serving.ttft_path.delivery_path`: the runs'
  median `out` on the median streams of their requests' first-token steps) — a first token is
  written after the step's other streams (prefill chunks come last in a step's outputs), so its
  `out` grows by the loop's time per stream;
- `read_ms`: that fit's intercept: step end -> the first token at no other stream (the backend's
  send, the wire, the loop's read; the client's own read inside it: an upper bound);
- `timer_late_ms`: the window timer's lateness at idle: at the lowest load, the median of
  (flush - deadline) over the timer-fired windows whose deadline falls outside every busy period
  the model puts on the live step log (uvloop's timers run in whole milliseconds);
- `request_ms`: the lowest load's median `front` (HTTP stamp -> push: the request's own work).

`check` scores the model on the live logs directly: each timer-fired window's lateness, live
against the model's (`timer_late_ms` + what is left of the busy period its deadline falls in, the
busy periods built from the live steps), per load.

    python -m bench.simulator.gateway_loop VALIDATE.json DECISIONS.jsonl[.gz] STEPS.jsonl[.gz] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np


def busy_periods(step_rows: list[dict], read_s: float, per_stream_s: float,
                 arrivals: list[float] = (), request_s: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """The loop's jobs on the live step log as one FIFO server: each step's outputs from `read_s`
    after its end for `per_stream_s` x its streams (decodes + prefill chunks), each arrival
    `request_s` at its push. Returns (job start times, the loop's free time after each job),
    sorted by start."""
    jobs = [(float(r["mono"]) + float(r["ms"]) / 1e3 + read_s,
             per_stream_s * (int(r["decodes"]) + len(r["prefill"]))) for r in step_rows if "mono" in r]
    jobs += [(float(t), request_s) for t in arrivals]
    jobs.sort()
    starts = np.array([j[0] for j in jobs])
    ends = np.empty(len(jobs))
    free = -math.inf
    for i, (t, s) in enumerate(jobs):
        free = max(free, t) + s
        ends[i] = free
    return starts, ends


def residual_at(starts: np.ndarray, ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """What is left of the loop's work at times `t` (0 where it is free)."""
    j = np.searchsorted(starts, t, side="right") - 1
    out = np.where(j >= 0, ends[np.maximum(j, 0)] - t, 0.0)
    return np.maximum(out, 0.0)


def timer_windows(validate: dict, by_run: dict, load_index: int) -> tuple[np.ndarray, np.ndarray]:
    """The load's windows closed by their timer (open >= the minimum latency less 0.1 ms): their
    deadlines (window start + the minimum latency) and their lateness (flush - deadline), s."""
    lat = float(validate["config"]["batcher"]["min_latency_ms"]) / 1e3
    dl, late = [], []
    for (si, li), (arr, batches) in by_run.items():
        if li != load_index:
            continue
        push = {a.request_id: a.t for a in arr}
        for b in batches:
            ts = [push[r] for r in b.request_ids if r in push]
            if not ts:
                continue
            start = min(ts)
            if b.t - start >= lat - 1e-4:
                dl.append(start + lat)
                late.append(b.t - start - lat)
    return np.array(dl), np.array(late)


def window_lateness(arrivals, batches, min_latency_s: float) -> tuple[float, int]:
    """Mean lateness (ms) of the windows closed by their timer, and their count: one run's live
    windows (its decision log) or a replay's (the same records)."""
    push = {a.request_id: a.t for a in arrivals}
    late = []
    for b in batches:
        ts = [push[r] for r in b.request_ids if r in push]
        if ts and b.t - min(ts) >= min_latency_s - 1e-4:
            late.append(b.t - min(ts) - min_latency_s)
    return (1e3 * float(np.mean(late)) if late else math.nan), len(late)


def measure(validate: dict, by_run: dict, step_rows: list[dict], path: dict) -> dict:
    """The model's terms from the session (module doc). `by_run`: (seed index, load index) ->
    (arrivals, windows) (`session_records.run_arrivals`); `path`: its `delivery_path`."""
    k = float(path["per_stream_ms"])
    fit = path.get("fit") or {}
    read = fit.get("intercept_ms")
    if read is None:  # k given, not fitted: the lowest load's out less k x its streams
        outs = [r["ttft_path_ms"]["out"] for r in validate["loads"][0]["runs"] if r.get("ttft_path_ms")]
        read = path["constant_ms"] - path["base_ms"] if not outs else \
            float(np.mean(outs)) - (path["constant_ms"] - path["base_ms"])
    read = max(0.0, float(read))
    fronts = [r["ttft_path_ms"]["front"] for r in validate["loads"][0]["runs"] if r.get("ttft_path_ms")]
    request = float(np.median(fronts)) if fronts else 0.0
    starts, ends = busy_periods(step_rows, read / 1e3, k / 1e3)
    dl, late = timer_windows(validate, by_run, 0)
    outside = residual_at(starts, ends, dl) <= 0.0
    timer_late = float(np.median(late[outside])) * 1e3 if outside.any() else 0.0
    return {"per_stream_ms": k, "read_ms": read, "timer_late_ms": max(0.0, timer_late),
            "request_ms": request, "num_idle_windows": int(outside.sum()),
            "num_lowest_load_windows": len(late)}


def engine_fields(terms: dict, arrivals: str = "recorded") -> dict:
    """`EngineConfig` fields for these terms."""
    return {"gateway_loop_per_stream_s": terms["per_stream_ms"] / 1e3,
            "gateway_loop_read_s": terms["read_ms"] / 1e3,
            "gateway_loop_request_s": terms["request_ms"] / 1e3,
            "gateway_timer_late_s": terms["timer_late_ms"] / 1e3,
            "gateway_loop_arrivals": arrivals}


def check(validate: dict, by_run: dict, step_rows: list[dict], terms: dict) -> list[dict]:
    """Per load: the timer-fired windows' lateness live and as the model puts it on the live step
    log (mean, median, p90, ms; their correlation), and the share of deadlines inside a busy period."""
    pushes = [a.t for (arr, _b) in by_run.values() for a in arr]
    starts, ends = busy_periods(step_rows, terms["read_ms"] / 1e3, terms["per_stream_ms"] / 1e3,
                                pushes, terms["request_ms"] / 1e3)
    out = []
    for li, ld in enumerate(validate["loads"]):
        dl, late = timer_windows(validate, by_run, li)
        if not len(dl):
            continue
        res = residual_at(starts, ends, dl + terms["timer_late_ms"] / 1e3)
        pred = terms["timer_late_ms"] / 1e3 + res
        out.append({"load_label": ld["load_label"], "num_windows": len(dl),
                    "live_ms": {"mean": 1e3 * late.mean(), "p50": 1e3 * np.median(late),
                                "p90": 1e3 * np.percentile(late, 90)},
                    "model_ms": {"mean": 1e3 * pred.mean(), "p50": 1e3 * np.median(pred),
                                 "p90": 1e3 * np.percentile(pred, 90)},
                    "inside_busy": float((res > 0).mean()),
                    "corr": float(np.corrcoef(late, pred)[0, 1]) if np.ptp(pred) > 0 else math.nan})
    return out


def main(argv: list[str] | None = None) -> int:
    from bench.serving.ttft_path import delivery_path
    from bench.simulator.fidelity_steps import read_steps
    from bench.simulator.session_records import first_token_streams, path_records, run_arrivals
    from scheduler.decisions import read_log

    p = argparse.ArgumentParser(prog="python -m bench.simulator.gateway_loop", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("validate")
    p.add_argument("decisions")
    p.add_argument("steps")
    p.add_argument("--json", dest="json_out")
    a = p.parse_args(argv)
    validate = json.loads(Path(a.validate).read_text())
    arrivals, batches = read_log(a.decisions)
    rows = read_steps(a.steps)
    by_run = run_arrivals(validate, arrivals, batches)
    streams = first_token_streams(rows)
    recs = {(si, li): path_records(run, [x.request_id for x in by_run[(si, li)][0]], streams)
            for li, ld in enumerate(validate["loads"]) for si, run in enumerate(ld["runs"])}
    low = [recs[(si, 0)] for si in range(len(validate["loads"][0]["runs"]))
           if recs[(si, 0)][0].get("num_requests")]
    path = delivery_path(low, [v for v in recs.values() if v[0].get("num_requests")])
    terms = measure(validate, by_run, rows, path)
    rows_out = check(validate, by_run, rows, terms)
    print(f"gateway loop: {terms['per_stream_ms']:.4f} ms a stream from {terms['read_ms']:.3f} ms after a "
          f"step's end; timer late {terms['timer_late_ms']:.3f} ms at idle ({terms['num_idle_windows']} of "
          f"{terms['num_lowest_load_windows']} lowest-load windows outside busy periods); "
          f"{terms['request_ms']:.3f} ms a request")
    print("window timer lateness, ms (timer-fired windows): live vs the model on the live step log")
    print(f"{'load':>6} {'windows':>7} {'live mean':>9} {'model mean':>10} {'live p50':>8} {'model p50':>9} "
          f"{'live p90':>8} {'model p90':>9} {'in busy':>7} {'corr':>5}")
    for r in rows_out:
        lv, md = r["live_ms"], r["model_ms"]
        print(f"{r['load_label']:>6} {r['num_windows']:7d} {lv['mean']:9.2f} {md['mean']:10.2f} {lv['p50']:8.2f} "
              f"{md['p50']:9.2f} {lv['p90']:8.2f} {md['p90']:9.2f} {r['inside_busy']:7.2f} {r['corr']:5.2f}")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps({"terms": terms, "path": path, "timer_check": rows_out},
                                               indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
