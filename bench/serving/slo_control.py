"""The SLO control check (issue 31): the same schedule against a gateway that admits by its TTFT
deadlines and against a control gateway that admits everything, then request by request:

- Fast-class TTFT p90 (and every class's) with admission, against its target;
- each request refused with admission (429): its Retry-After (retry-after-ms) against the TTFT the
  same request had in the control run, the wait it would have had; the share within +-25%;
- each accepted request: by how much it missed its deadline; the share that missed by > 10%;
- SLO attainment per class (refused count as missed) in both runs.

    python -m bench.serving.slo_control --url http://127.0.0.1:8001 \\
        --control-url http://127.0.0.1:8002 --slo-ttft-ms fast=300,normal=1500,slow=4000 \\
        --rate 12 --num-requests 600 --input-len 64 --output-len uniform:2:128 --json out.json

Start the two gateways with the same backends' flags and the targets on the first only (`tidegate
serve --slo-ttft-ms ...`); run the control first or second, but not at once (they share the CPU).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math

import numpy as np

from bench.serving import loadgen
from scheduler.classes import CLASS_NAMES
from scheduler.slo import parse_targets
from sims.metrics import class_of, summarize
from sims.workload import LengthSpec, ScheduleConfig, make_prompts, make_schedule


def compare_runs(admitted_run: list, control_run: list, ttft_ms: tuple) -> dict:
    """Request-by-request comparison of the two runs' records (the same schedule, same order)."""
    ratios, misses, by_class = [], [], {}
    for a, c in zip(admitted_run, control_run, strict=True):
        cls = CLASS_NAMES.index(class_of(a.max_tokens))
        target = ttft_ms[cls]
        if a.error == "http_429" and c.ok and a.retry_after_s == a.retry_after_s:
            wait = c.first_token_time - c.send_time
            ratios.append(a.retry_after_s / wait if wait > 0 else math.inf)
        if a.ok and target is not None:
            ttft_ms_a = (a.first_token_time - a.send_time) * 1e3
            misses.append(ttft_ms_a / target - 1.0)
        if a.ok:
            by_class.setdefault(class_of(a.max_tokens), []).append(
                (a.first_token_time - a.send_time) * 1e3)
    r = np.array(ratios)
    m = np.array(misses)
    return {
        "num_refused_compared": len(ratios),
        "retry_after_over_control_wait": {
            "p10": float(np.percentile(r, 10)) if len(r) else None,
            "p50": float(np.percentile(r, 50)) if len(r) else None,
            "p90": float(np.percentile(r, 90)) if len(r) else None},
        "retry_after_within_25pct": float(np.mean(np.abs(r - 1.0) <= 0.25)) if len(r) else None,
        "accepted_missing_deadline_by_10pct": float(np.mean(m > 0.10)) if len(m) else None,
        "accepted_missing_deadline": float(np.mean(m > 0.0)) if len(m) else None,
        "ttft_p90_ms_admitted": {k: float(np.percentile(v, 90)) for k, v in by_class.items()},
    }


async def _run(url: str, schedule, prompts, concurrency):
    target = loadgen.HttpTarget(url)
    return await loadgen.run_http(target, schedule.offset, prompts, schedule.output_len,
                                  concurrency, False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serving.slo_control", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="the gateway with --slo-ttft-ms")
    p.add_argument("--control-url", required=True, help="the same deployment without targets")
    p.add_argument("--slo-ttft-ms", required=True, help="the targets the first gateway runs with")
    p.add_argument("--slo-tpot-ms", default=None)
    p.add_argument("--rate", type=float, required=True)
    p.add_argument("--num-requests", type=int, default=600)
    p.add_argument("--input-len", default="64")
    p.add_argument("--output-len", default="uniform:2:128")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--control-first", action="store_true")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    ttft = parse_targets(a.slo_ttft_ms)
    schedule = make_schedule(ScheduleConfig(num_requests=a.num_requests, rate=a.rate,
                                            input_len=LengthSpec.parse(a.input_len),
                                            output_len=LengthSpec.parse(a.output_len), seed=a.seed))
    prompts = make_prompts(schedule, a.seed, (0, 256))
    order = [("control", a.control_url), ("admission", a.url)]
    if not a.control_first:
        order.reverse()
    runs = {}
    for name, url in order:
        records, t0, _ = asyncio.run(_run(url, schedule, prompts, a.max_concurrency))
        runs[name] = (records, summarize(records, start_time=t0, slo_ttft_ms=a.slo_ttft_ms,
                                         slo_tpot_ms=a.slo_tpot_ms))
    out = {"config": vars(a),
           "compare": compare_runs(runs["admission"][0], runs["control"][0], ttft),
           **{name: {k: v for k, v in rep.items() if k != "by_class"} | {
               "by_class": {c: {k: v for k, v in g.items()
                                if k in ("num_requests", "completed", "num_refused",
                                         "slo_attainment", "ttft_ms", "retry_after_ms")}
                            for c, g in rep["by_class"].items()}}
              for name, (_, rep) in runs.items()}}
    print(json.dumps(out["compare"], indent=2))
    for name in ("admission", "control"):
        rep = runs[name][1]
        print(name, {c: (g["num_requests"], g["num_refused"], round(g["slo_attainment"], 3),
                         round(g["ttft_ms"]["p90"], 1)) for c, g in rep["by_class"].items()})
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=2, default=float)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
