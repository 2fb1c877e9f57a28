"""The SLO control check (issue 31): the same schedule against a gateway that admits by its TTFT
deadlines and against a control gateway that admits everything, then request by request:

- Fast-class TTFT p90 (and every class's) with admission, against its target;
- each request refused with admission (429): its Retry-After (retry-after-ms) against the TTFT the
  same request had in the control run, the wait it would have had; the share within +-25%;
- each accepted request: by how much it missed its deadline; the share that missed by > 10%;
- SLO attainment per class (refused count as missed) in both runs;
- probes (`--probe-every K`): every K-th refused request of the admission run is sent again at
  once with its own `slo_ttft_ms` so large that it is admitted: its TTFT is the wait it would
  have had in that run, in the state its refusal was predicted in, which is what Retry-After
  predicts. The control run's TTFT of the same request is another system's wait: without
  admission, at 1.5x capacity the queue grows for the whole run, so late refusals' control
  waits are many times what the admission run would have made them wait (both are reported).

    python -m bench.serving.slo_control --url http://127.0.0.1:8001 \\
        --control-url http://127.0.0.1:8002 --slo-ttft-ms fast=300,normal=1500,slow=4000 \\
        --rate 12 --num-requests 600 --input-len 64 --output-len uniform:2:128 --json out.json

Start the two gateways with the same backends' flags and the targets on the first only (`tidegate
serve --slo-ttft-ms ...`); run the control first or second, but not at once (they share the CPU).

The two runs share the backends, so the control run sends prompts of the same lengths at the same
times but of other content (`control_prompts`; `--control-same-prompts`: the admission run's,
as before 2026-12-05): the run that went second was otherwise served from the prefix cache the
first had filled (the H200 run of 2026-12-04: 400 prompts of 512 tokens, 205k of the backend's
273k KV tokens; the second run's TPOT 22 ms against the first's 97, TTFT p90 64 ms against 5-8 s;
issue 31, fifteenth session). Every request of a run goes out at its time, whatever is in
flight: the client's connections are not capped (an aiohttp session's default is 100, which
held the admission run's requests in the client for up to 9 s while the gateway, which had not
seen them yet, predicted its own 0.3-0.5 s correctly).
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
from sims.metrics import RequestRecord, class_of, summarize
from sims.workload import LengthSpec, ScheduleConfig, make_prompts, make_schedule

WARMUP_S = 2.2  # the first seconds of a run, before a fresh gateway has measured its backends


def compare_runs(admitted_run: list, control_run: list, ttft_ms: tuple) -> dict:
    """Request-by-request comparison of the two runs' records (the same schedule, same order)."""
    ratios, misses, by_class = [], [], {}
    # per class: [admitted with a target, of them missing by > 10%, the same sent in the first
    # WARMUP_S s of the run, of them missing by > 10%]
    miss_counts = {name: [0, 0, 0, 0] for name in CLASS_NAMES}
    t0 = min((a.send_time for a in admitted_run), default=0.0)
    for a, c in zip(admitted_run, control_run, strict=True):
        cls = CLASS_NAMES.index(class_of(a.max_tokens))
        target = ttft_ms[cls]
        if a.error == "http_429" and c.ok and a.retry_after_s == a.retry_after_s:
            wait = c.first_token_time - c.send_time
            ratios.append(a.retry_after_s / wait if wait > 0 else math.inf)
        if a.ok and target is not None:
            ttft_ms_a = (a.first_token_time - a.send_time) * 1e3
            misses.append(ttft_ms_a / target - 1.0)
            counts, missed = miss_counts[CLASS_NAMES[cls]], ttft_ms_a > 1.1 * target
            counts[0] += 1
            counts[1] += missed
            if a.send_time - t0 < WARMUP_S:
                counts[2] += 1
                counts[3] += missed
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
        # per class: admitted, missing by > 10%, and the same for those sent in the first
        # WARMUP_S s (issue 31: the slot model's warm-up)
        "accepted_missing_by_10pct_counts": {
            k: {"admitted": v[0], "missed": v[1], "admitted_warmup": v[2], "missed_warmup": v[3]}
            for k, v in miss_counts.items() if v[0]},
    }


async def _run(url: str, schedule, prompts, concurrency):
    target = loadgen.HttpTarget(url)
    return await loadgen.run_http(target, schedule.offset, prompts, schedule.output_len,
                                  concurrency, False)


PROBE_TTFT_MS = 1e9  # a request's own target so large that admission never refuses it
CONTROL_PROMPT_SEED = 7919  # the control run's prompt content: make_prompts' seed + this


def run_prompts(schedule, seed: int, same: bool = False) -> tuple[list, list]:
    """(the admission run's prompts, the control run's): the same lengths, the control's of
    other content unless `same` (module doc: the second run would hit the first's prefix
    cache). The admission run's are `make_prompts(schedule, seed)`, as they always were."""
    prompts = make_prompts(schedule, seed, (0, 256))
    if same:
        return prompts, prompts
    return prompts, make_prompts(schedule, seed + CONTROL_PROMPT_SEED, (0, 256))


def probe_session(timeout_s: float):
    """The admission run's HTTP session: no cap on open connections (module doc), as
    `loadgen.run_http`'s without --max-concurrency."""
    import aiohttp
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                 timeout=aiohttp.ClientTimeout(total=timeout_s))


async def _run_with_probes(url: str, schedule, prompts, concurrency, probe_every: int):
    """`_run`, and every `probe_every`-th refusal re-sent at once as a probe (module doc):
    (records, t0, {index: probe record})."""
    target = loadgen.HttpTarget(url)
    n = len(prompts)
    probes: dict[int, object] = {}
    refused = [0]
    async with probe_session(target.timeout_s) as session:
        model = await loadgen.resolve_model(session, target)
        endpoint = target.url.rstrip("/") + target.endpoint
        bodies = [loadgen.request_body(target, model, prompts[i], int(schedule.output_len[i]))
                  for i in range(n)]
        records = [RequestRecord(i, len(prompts[i]), int(schedule.output_len[i])) for i in range(n)]

        async def send_one(i: int) -> None:
            await loadgen.send_http(session, target, endpoint,
                                    json.dumps(bodies[i]).encode(), records[i])
            if records[i].error == "http_429":
                refused[0] += 1
                if refused[0] % probe_every == 0:
                    probe = RequestRecord(i, len(prompts[i]), int(schedule.output_len[i]))
                    probes[i] = probe
                    body = dict(bodies[i], slo_ttft_ms=PROBE_TTFT_MS)
                    await loadgen.send_http(session, target, endpoint, json.dumps(body).encode(),
                                            probe)

        t0 = await loadgen.run_schedule(schedule.offset, send_one, records, concurrency)
    return records, t0, probes


def compare_probes(admitted_run: list, probes: dict) -> dict:
    """Retry-After of each probed refusal against its probe's TTFT (the wait it would have had)."""
    ratios, by_class = [], {}
    for i, probe in probes.items():
        a = admitted_run[i]
        if probe.ok and a.retry_after_s == a.retry_after_s:
            wait = probe.first_token_time - probe.send_time
            ratios.append(a.retry_after_s / wait if wait > 0 else math.inf)
            by_class.setdefault(class_of(a.max_tokens), []).append(ratios[-1])
    r = np.array(ratios)
    return {"num_probes": len(probes), "num_compared": len(ratios),
            "by_class": {name: {"n": len(v), "p50": float(np.median(v)),
                                "within_25pct": float(np.mean(np.abs(np.array(v) - 1.0) <= 0.25))}
                         for name, v in by_class.items()},
            "retry_after_over_probe_wait": {
                q: (float(np.percentile(r, int(q[1:]))) if len(r) else None)
                for q in ("p10", "p50", "p90")},
            "retry_after_within_25pct": float(np.mean(np.abs(r - 1.0) <= 0.25)) if len(r) else None}


def write_records(path: str, records: list, probes: dict) -> None:
    """`--records`: one JSON object per request of the admission run, in schedule order."""
    t0 = min((r.send_time for r in records), default=0.0)

    def ttft(r) -> float | None:
        return r.first_token_time - r.send_time if r is not None and r.ok else None
    with open(path, "w") as fh:
        fh.writelines(json.dumps({
                "i": r.index, "class": class_of(r.max_tokens), "max_tokens": r.max_tokens,
                "send_s": r.send_time - t0, "error": r.error, "ttft_s": ttft(r),
                "retry_after_s": None if math.isnan(r.retry_after_s) else r.retry_after_s,
                "probe_ttft_s": ttft(probes.get(r.index))}) + "\n" for r in records)


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
    p.add_argument("--control-same-prompts", action="store_true",
                   help="the control run sends the admission run's prompts (before 2026-12-05's "
                   "default; the second run then hits the first's prefix cache)")
    p.add_argument("--probe-every", type=int, default=0, metavar="K",
                   help="re-send every K-th refused request at once, admitted, to measure the "
                   "wait it would have had (module doc; 0: no probes)")
    p.add_argument("--json", default=None)
    p.add_argument("--records", default=None, metavar="JSONL",
                   help="the admission run's requests, one a line in schedule order (class, "
                   "send time from the first, outcome, TTFT, Retry-After, its probe's TTFT): to "
                   "join with the gateway's decision log")
    a = p.parse_args(argv)
    ttft = parse_targets(a.slo_ttft_ms)
    schedule = make_schedule(ScheduleConfig(num_requests=a.num_requests, rate=a.rate,
                                            input_len=LengthSpec.parse(a.input_len),
                                            output_len=LengthSpec.parse(a.output_len), seed=a.seed))
    prompts, control_prompts = run_prompts(schedule, a.seed, a.control_same_prompts)
    order = [("control", a.control_url), ("admission", a.url)]
    if not a.control_first:
        order.reverse()
    runs = {}
    probes: dict = {}
    for name, url in order:
        if name == "admission" and a.probe_every > 0:
            records, t0, probes = asyncio.run(_run_with_probes(url, schedule, prompts,
                                                               a.max_concurrency, a.probe_every))
        else:
            records, t0, _ = asyncio.run(_run(url, schedule, control_prompts if name == "control"
                                              else prompts, a.max_concurrency))
        runs[name] = (records, summarize(records, start_time=t0, slo_ttft_ms=a.slo_ttft_ms,
                                         slo_tpot_ms=a.slo_tpot_ms))
    out = {"config": vars(a),
           "compare": compare_runs(runs["admission"][0], runs["control"][0], ttft)
           | ({"probes": compare_probes(runs["admission"][0], probes)} if a.probe_every else {}),
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
    if a.records:
        write_records(a.records, runs["admission"][0], probes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
