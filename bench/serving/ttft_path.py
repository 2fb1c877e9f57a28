"""Where a request's time to first token goes, live, across the three processes (issue 18).

The simulator models the batching window, the wait for the backend's step and the steps; the live
service adds the path around them. With the logs `tidegate sim validate` collects — the client's
records (`bench.serving.loadgen`, perf_counter), the gateway's decision log (monotonic) and the backend's
step log (its `mono` start) — one request's TTFT splits into:

    http_in   client send            -> gateway's HTTP stamp (`received`)
    front     HTTP stamp             -> push into the batcher (body, tokens, handle)
    window    push                   -> its window flushed                       (simulated)
    to_step   flush                  -> start of its first prefill step          (simulated: the
              wire to the backend, admission, the step in progress)            wait, not the wire)
    prefill   first prefill step     -> end of its last prefill step             (simulated)
    out       end of that step       -> the client's first token (read-back, wire, detokenizer,
                                        SSE, client)

perf_counter and monotonic are the same clock on Linux (CLOCK_MONOTONIC), so the times line up
across processes on one machine. Client records are matched to the log's arrivals in order (the
k-th send is the k-th HTTP stamp); a pair whose stamp precedes its send is reported as a mismatch.
"""
from __future__ import annotations

import math

import numpy as np

PARTS = ("http_in", "front", "window", "to_step", "prefill", "out")


def decompose(records, arrivals, batches, step_rows, per_request: bool = False) -> dict:
    """Median ms of each part over the requests found in all three logs, and their count.
    `records`: bench RequestRecords of one run (send_time, first_token_time); `arrivals`,
    `batches`: that run's decision-log records; `step_rows`: the backend's step-log rows (dicts).
    `per_request`: also each request's `out` and `to_step` (ms) and the sequences of the step that
    gave its first token (its decodes + prefill chunks: the streams whose tokens the gateway and the
    client handle beside it), as `per_request` lists: live, `out` grew with load (the H200 6.7B:
    1.55 / 2.67 / 3.93 / 6.25 ms median at 0.5 / 0.8 / 0.95 / 1.2x; issue 35) where the simulator
    charges one delivery delay measured at the lowest load."""
    flush = {rid: b.t for b in batches for rid in b.request_ids}
    first_start: dict[str, float] = {}
    last_end: dict[str, float] = {}
    last_seqs: dict[str, int] = {}
    for row in step_rows:
        if "mono" not in row:
            continue
        for rid, _, _ in row.get("prefill", ()):
            first_start.setdefault(rid, row["mono"])
            last_end[rid] = row["mono"] + row["ms"] / 1e3
            last_seqs[rid] = int(row.get("decodes", 0)) + len(row.get("prefill", ()))
    ok = sorted((r for r in records if r.ok and r.chunk_times), key=lambda r: r.send_time)
    arr = sorted((a for a in arrivals if a.received is not None), key=lambda a: a.received)
    parts: dict[str, list[float]] = {p: [] for p in PARTS}
    seqs: list[int] = []
    mismatched = 0
    for rec, a in zip(ok, arr, strict=False):
        rid = a.request_id
        if rid not in flush or rid not in first_start or a.received < rec.send_time:
            mismatched += 1
            continue
        first = rec.first_token_time
        vals = (a.received - rec.send_time, a.t - a.received, flush[rid] - a.t,
                first_start[rid] - flush[rid], last_end[rid] - first_start[rid], first - last_end[rid])
        for p, v in zip(PARTS, vals, strict=True):
            parts[p].append(1e3 * v)
        seqs.append(last_seqs[rid])
    out = {p: (float(np.median(v)) if v else math.nan) for p, v in parts.items()}
    out["ttft"] = float(np.median([sum(x) for x in zip(*parts.values(), strict=True)])) if parts["out"] else math.nan
    out["num_requests"] = len(parts["out"])
    out["mismatched"] = mismatched
    if per_request:
        out["per_request"] = {"out_ms": [round(v, 4) for v in parts["out"]],
                              "to_step_ms": [round(v, 4) for v in parts["to_step"]], "step_seqs": seqs}
    return out


def delivery_path(low: list[tuple[dict, dict]], runs: list[tuple[dict, dict]],
                  per_stream_ms: float | None = None) -> dict:
    """The simulator's delivery path (`EngineConfig.delivery_delay_s` + `delivery_per_stream_s` x
    the streams of a token's step) from the live path records (issue 35).

    `low`: the lowest load's runs, `runs`: every run (all loads), each as (its `decompose`
    medians: http_in, front, out; its `per_request` lists or None). `per_stream_ms` None: fitted as the slope of the
    runs' median `out` on the median streams of their requests' first-token steps (least squares
    over runs; the H200 runs: 0.073 ms on the 6.7B, 0.069 / 0.068 on the 33B, r >= 0.97, where a
    run's median is steadier than one request's `out`); 0 or a number: taken as given (e.g. the
    other model's). The base: the lowest load's http_in + front + out less k x its median
    streams, so that at the lowest load the path is what it was (`constant_ms`)."""
    pts = [(float(np.median(pr["step_seqs"])), float(np.median(pr["out_ms"])))
           for _, pr in runs if pr and pr.get("step_seqs")]
    fit = {"num_runs": len(pts)}
    if per_stream_ms is None:
        xs = np.array([p[0] for p in pts])
        ys = np.array([p[1] for p in pts])
        if len(pts) >= 3 and np.ptp(xs) > 0:
            slope, icpt = np.polyfit(xs, ys, 1)
            fit.update(slope_ms=float(slope), intercept_ms=float(icpt), r=float(np.corrcoef(xs, ys)[0, 1]))
            per_stream_ms = max(0.0, float(slope))
        else:
            per_stream_ms = 0.0
    const = [m["http_in"] + m["front"] + m["out"] for m, _ in low]
    base = [c - per_stream_ms * float(np.median(pr["step_seqs"])) if pr and pr.get("step_seqs") else c
            for c, (_, pr) in zip(const, low, strict=True)]
    return {"constant_ms": float(np.mean(const)), "base_ms": max(0.0, float(np.mean(base))),
            "per_stream_ms": float(per_stream_ms), "fit": fit}
