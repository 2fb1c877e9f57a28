"""Re-simulate a whole `tidegate sim validate` session from its decision log, as one run (issue 18).

`sim validate` simulates each (load, seed) run on a fresh simulated backend, but the live backend is
one process for the whole session: its prefix cache keeps earlier runs' prompts. Before the fix in
`sim_validate.prompt_seed`, every load of one seed sent the *same* prompts (`make_prompts(schedule,
seed)`), so from a seed's second load on the live engine found 496 of each 512-token prompt in its
prefix cache (step log of the first H200 run: 17-18 prefill tokens per prefill step instead of ~550),
while the simulator prefilled them in full. This tool gives the simulator what the live service had:

- every recorded arrival of the session (warm-up included), at its recorded time, in one workload
  on one simulated backend, so the simulated prefix cache lives as long as the live one;
- the prompts' identity, which the log of that session does not carry, rebuilt from the order
  `sim validate` sends them in: warm-up (its own seed), then per seed and per load the same
  `num_requests` prompts, request i of every load of seed s being one prompt (a prefix group of the
  whole prompt length);

and compares each run's simulated TTFT/TPOT P50/P99 and output throughput with the live figures in
the `sim validate` JSON, per load as mean ± CI over the seeds (`sim_validate.summarize_load`).

    python -m bench.simulator.fidelity_resim VALIDATE.json DECISIONS.jsonl PROFILE.json [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

PER_RUN = (("ttft_p50", "ttft", 50), ("ttft_p99", "ttft", 99), ("tpot_p50", "tpot", 50),
           ("tpot_p99", "tpot", 99), ("throughput", "throughput", None))
# issue 18's bounds: P50 within 5%, P99 within 10%, throughput within 2%
BOUNDS = {"ttft_p50": 0.05, "ttft_p99": 0.10, "tpot_p50": 0.05, "tpot_p99": 0.10, "throughput": 0.02}


def prompt_identity(config: dict, num_arrivals: int) -> tuple[list[int], list[tuple[int, int]]]:
    """Per arrival (in push order): its prompt's group id, and the (seed, load index) run it
    belongs to ((-1, -1) for the warm-up). A session `sim validate` was interrupted in
    (`config["interrupted"]`) sent a prefix of its plan: its arrivals are that prefix's."""
    n, warm = int(config["num_requests"]), int(config["warmup_requests"])
    seeds = [int(x) for x in config["seeds"].split(",")]
    num_loads = len((config["rates"] or config["loads"]).split(","))
    want = warm + len(seeds) * num_loads * n
    if num_arrivals != want and not (config.get("interrupted") and num_arrivals < want):
        raise ValueError(f"the log has {num_arrivals} arrivals; this sim validate sent {want}")
    groups = list(range(warm))  # warm-up prompts: one group each
    runs = [(-1, -1)] * warm
    for si, _ in enumerate(seeds):
        for li in range(num_loads):
            groups += [warm + si * n + i for i in range(n)]  # the same n prompts at every load
            runs += [(si, li)] * n
    return groups[:num_arrivals], runs[:num_arrivals]


# the commit that gave a CUDA backend its prefill cap by default (d251018, 256 tokens a step while
# sequences decode and the backlog is small): sessions profiled before it ran uncapped
CUDA_PREFILL_CAP_SINCE = "2026-12-03T10:57:49+00:00"


def session_prefill_cap(validate: dict, how: str = "auto"):
    """The `PrefillCap` the live backend of a `sim validate` session ran with, or None (off).
    `how`: "auto" — the cap the validate JSON recorded (`config["prefill_cap"]`, since issue 35's
    grid), else, for a session profiled after the CUDA default came in, the cap its device and
    engine flags give (`live_config.live_prefill_cap`), else off; "live" — that cap whatever the
    date; "off"; or a number of tokens (the default backlog rule). Without it the replay of a
    capped engine planned whole 512-token prompts where the engine ran two 256-token chunks
    beside its decodes, and no prefill step matched (issue 35, the H200 grid's 33B part)."""
    from datetime import datetime

    from scheduler.capacity import PrefillCap

    cfg = validate["config"]
    if how == "off":
        return None
    if how not in ("auto", "live"):
        return PrefillCap(int(how))
    if how == "auto" and cfg.get("prefill_cap") is not None:
        cap = PrefillCap(**cfg["prefill_cap"])
        return cap if cap.max_tokens else None
    created = (validate.get("profile") or {}).get("created")
    if how == "auto" and (created is None or datetime.fromisoformat(created)
                          < datetime.fromisoformat(CUDA_PREFILL_CAP_SINCE)):
        return None
    from bench.simulator.live_config import live_prefill_cap

    cap = live_prefill_cap(str(cfg.get("device", "cpu")), list(cfg.get("engine_arg") or []))
    return cap if cap.max_tokens else None


def resimulate(validate: dict, arrivals, profile: str, prompt_identity_on: bool = True,
               delivery_delay_s: float = 0.0, async_plan_lead_s: float | None = None,
               hide_launch: bool = False, power_cap: bool = False,
               prefill_launch_deadline: bool = False, record_steps: bool = False,
               wrap_cost=None, network_delay_s: float = 0.0, prefill_cap=None,
               delivery_per_stream_s: float = 0.0) -> dict:
    """`prompt_identity_on=False`: every prompt distinct (what `sim validate` itself simulated,
    but in one continuous run): the control that isolates the prefix cache's part.
    `delivery_delay_s`: `EngineConfig.delivery_delay_s` (the path from the backend to the client,
    measured live, e.g. by bench/simulator/h200_path.py). `async_plan_lead_s`:
    `EngineConfig.async_plan_lead_s` (None: the synchronous loop). `hide_launch`: the profile's
    steps charged without the host's launch (`ProfileCost(hide_launch=True)`); `power_cap`: the
    profile's power-cap model (`ProfileCost(power_cap=True)`; "alike": with
    `cap_by_compute=False`). `prefill_launch_deadline`:
    `EngineConfig.prefill_launch_deadline`; False by default because the live runs this
    re-simulates (bench/results/fidelity_h200_2) were recorded on the engine before it.
    `record_steps`: every step simulated alone and kept (`result["steps"]`: StepRecords with the
    live ids and each step's simulated duration in `ms`; bench.simulator.fidelity_steps).
    `wrap_cost(cost, live_ids)`: replaces the profile's cost model (a diagnostic: the live step
    times fed back, `fidelity_steps.LiveTimedCost`). `network_delay_s`:
    `EngineConfig.network_delay_s` (gateway flush -> the backend's plan, measured live by
    `fidelity_steps.dispatch_delay`). `prefill_cap`: the live engine's `PrefillCap` (None: off,
    as the engines of the runs recorded before the CUDA default; `session_prefill_cap` reads it
    for a session). `delivery_per_stream_s`: `EngineConfig.delivery_per_stream_s` (the path's
    growth per stream of a token's step, issue 35; 0: the constant `delivery_delay_s` alone)."""
    from bench.simulator.fidelity_stats import compare, summarize_load
    from gateway.serve import build_parser as serve_parser
    from gateway.serve import gateway_config
    from sims.event_loop import EngineConfig, simulate
    from sims.profile_cost import ProfileCost
    from sims.workload import Workload

    cfg, live_be = validate["config"], validate["live_backend"]
    doc = json.loads(Path(profile).read_text())
    gw = gateway_config(serve_parser().parse_args(cfg["serve_argv"]), ["live"])
    if cfg.get("batcher"):
        # the live gateway's window as `sim validate` recorded it: the serve arguments give
        # today's defaults (target 250 req/s since issue 31; the H200 runs had 8,000), and a
        # 5 ms window in the replay against ~0.16 ms live parted the schedules (issue 35)
        from scheduler.batcher import BatcherConfig
        gw = replace(gw, batcher=BatcherConfig(**cfg["batcher"]))
    arrivals = sorted(arrivals, key=lambda a: a.t)
    groups, runs = prompt_identity(cfg, len(arrivals))
    plen = np.array([a.num_prompt_tokens for a in arrivals], dtype=np.int64)
    w = Workload(arrival_time=np.array([a.t for a in arrivals]), prompt_len=plen,
                 output_len=np.array([max(1, a.max_tokens) for a in arrivals], dtype=np.int64),
                 prefix_group=np.array(groups if prompt_identity_on else [-1] * len(groups),
                                       dtype=np.int64),
                 prefix_len=plen.copy() if prompt_identity_on else np.zeros_like(plen),
                 queue_class=np.array([a.queue_class for a in arrivals], dtype=np.int64),
                 priority=np.zeros(len(arrivals), dtype=np.int64))
    from sims.adapters import SimSchedulerConfig
    sched = SimSchedulerConfig(batcher=gw.batcher, queue=gw.queues,
                               max_num_seqs=int(doc["max_num_seqs"]),
                               max_num_batched_tokens=int(doc["max_num_batched_tokens"]),
                               block_size=int(live_be["block_size"]),
                               max_model_len=int(live_be["max_model_len"]), enable_prefix_caching=True,
                               **({} if prefill_cap is None else {"prefill_cap": prefill_cap}))
    # power_cap "alike": every step with prefill slowed by the pause check's factor (the model
    # before the compute share, issue 35's grid)
    cost = ProfileCost.from_json(profile, hide_launch=hide_launch, power_cap=bool(power_cap),
                                 cap_by_compute=power_cap != "alike")
    if wrap_cost is not None:
        cost = wrap_cost(cost, [a.request_id for a in arrivals])
    res = simulate(w, cost, sched, EngineConfig(num_backends=1, num_samples=1,
                                                delivery_delay_s=delivery_delay_s,
                                                delivery_per_stream_s=delivery_per_stream_s,
                                                network_delay_s=network_delay_s,
                                                async_plan_lead_s=async_plan_lead_s,
                                                prefill_launch_deadline=prefill_launch_deadline,
                                                record_steps=record_steps,
                                                max_stretch_steps=1 if record_steps else 1 << 30))
    run_of = np.array([si * 1000 + li if si >= 0 else -1 for si, li in runs])
    loads = []
    for li, ld in enumerate(validate["loads"]):
        per_run = []
        for si, run in enumerate(ld["runs"]):
            m = run_of == si * 1000 + li
            first, fin = res.first_token_time[m], res.finish_time[m]
            arr, nout = w.arrival_time[m], res.num_output[m]
            ttft, e2e = first - arr, fin - arr
            tpot = (e2e - ttft) / np.maximum(nout - 1, 1)
            dur = float(fin.max() - arr.min())
            sim = {"ttft_ms": {"p50": 1e3 * np.percentile(ttft, 50), "p99": 1e3 * np.percentile(ttft, 99)},
                   "tpot_ms": {"p50": 1e3 * np.percentile(tpot, 50), "p99": 1e3 * np.percentile(tpot, 99)},
                   "itl_ms": {"p50": math.nan}, "output_throughput": float(nout.sum()) / dur}
            live = dict(run["live"], itl_ms={"p50": math.nan})
            cmp_ = compare(live, sim)
            cmp_.pop("itl_p50")
            per_run.append({"seed": run["seed"], "compare": cmp_})
        summ = summarize_load([{"compare": {**r["compare"], "itl_p50": _nan()}} for r in per_run],
                              float(cfg["confidence"]))
        summ.pop("itl_p50")
        for name, s in summ.items():
            err, bound = s["rel_err"], BOUNDS[name]
            s["bound"] = bound
            s["within_goal"] = bool(abs(err["mean"]) <= bound)
            s["within_goal_ci"] = bool(np.isfinite(err["ci"]) and abs(err["mean"]) + err["ci"] <= bound)
        loads.append({"load_label": ld["load_label"], "rate": ld["rate"], "runs": per_run,
                      "summary": summ})
    steps_p = res.step_prefill[res.step_prefill > 0]
    terms = {"async_plan_lead_ms": None if async_plan_lead_s is None else 1e3 * async_plan_lead_s,
             "hide_launch": hide_launch, "power_cap": power_cap,
             "prefill_launch_deadline": prefill_launch_deadline, "delivery_ms": 1e3 * delivery_delay_s,
             "delivery_per_stream_ms": 1e3 * delivery_per_stream_s,
             "network_delay_ms": 1e3 * network_delay_s,
             "prefill_cap": None if prefill_cap is None else asdict(prefill_cap)}
    out = {"source": "bench.simulator.fidelity_resim", "num_arrivals": len(arrivals), "model_terms": terms,
           "sim_prefill_tokens_per_prefill_step": float(steps_p.mean()) if steps_p.size else 0.0,
           "loads": loads}
    if record_steps:
        from scheduler.decisions import StepRecord
        ids = [a.request_id for a in arrivals]
        # one row per step (stretches off), in start order: step_time is aligned with the log
        out["steps"] = [StepRecord(float(t), int(d), tuple((ids[i], int(n), int(p)) for i, n, p in ch),
                                   tuple(ids[i] for i in pre), 1e3 * float(dt))
                        for (t, _, d, ch, pre), dt in zip(res.extra["steps"], res.step_time, strict=True)]
        out["dispatch_time"] = dict(zip(ids, res.dispatch_time.tolist(), strict=True))
    return out


def _nan() -> dict:
    return {"live": math.nan, "sim": math.nan, "rel_err": math.nan}


def format_table(result: dict) -> str:
    header = (f"{'load':>6}  {'metric':<11}{'live':>12}{'sim':>12}{'rel err (95% CI)':>20}  bound  "
              "met (mean / with CI)")
    lines = [header]
    for ld in result["loads"]:
        for i, (name, _, _) in enumerate(PER_RUN):
            s = ld["summary"][name]
            err = s["rel_err"]
            ci = "" if not np.isfinite(err["ci"]) else f" ±{100 * err['ci']:.1f}"
            lines.append(f"{(ld['load_label'] if i == 0 else ''):>6}  {name:<11}"
                         f"{s['live']['mean']:>12.2f}{s['sim']['mean']:>12.2f}"
                         f"{format(100 * err['mean'], '+.1f') + '%' + ci:>20}  "
                         f"{100 * s['bound']:>4.0f}%  {'yes' if s['within_goal'] else 'no'} / "
                         f"{'yes' if s['within_goal_ci'] else 'no'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from scheduler.decisions import read_log

    p = argparse.ArgumentParser(prog="python -m bench.simulator.fidelity_resim", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("validate", help="the sim validate --json output")
    p.add_argument("decisions", help="its --decision-log")
    p.add_argument("profile", help="its --profile")
    p.add_argument("--json", dest="json_out")
    p.add_argument("--delivery-ms", type=float, default=0.0,
                   help="backend -> client delay of every token (EngineConfig.delivery_delay_s)")
    p.add_argument("--async-plan-lead-ms", type=float, default=None,
                   help="model the engine's async loop (EngineConfig.async_plan_lead_s; default: "
                        "the synchronous loop)")
    p.add_argument("--hide-launch", action="store_true",
                   help="charge the profile's steps without the host's launch, as the async loop "
                        "runs them back to back (sims.profile_cost)")
    p.add_argument("--power-cap", action="store_true",
                   help="slow prefill steps by the prefill share of the 100 ms before them, as the "
                        "profile's pause check measured (sims.profile_cost)")
    p.add_argument("--prefill-cap", default="auto",
                   help="the live engine's prefill cap while decoding: auto (recorded, or the "
                        "engine's default for sessions after it came in), live, off, or tokens "
                        "(session_prefill_cap)")
    p.add_argument("--no-prompt-identity", action="store_true",
                   help="control: treat every prompt as distinct (no prefix-cache hits across runs)")
    a = p.parse_args(argv)
    validate = json.loads(Path(a.validate).read_text())
    arrivals, _ = read_log(a.decisions)
    try:
        lead = None if a.async_plan_lead_ms is None else a.async_plan_lead_ms / 1e3
        result = resimulate(validate, arrivals, a.profile, not a.no_prompt_identity,
                            a.delivery_ms / 1e3, lead, a.hide_launch, a.power_cap,
                            prefill_cap=session_prefill_cap(validate, a.prefill_cap))
    except ValueError as exc:
        print(f"fidelity_resim: {exc}", file=sys.stderr)
        return 1
    print(format_table(result))
    print(f"simulated prefill tokens per prefill step: {result['sim_prefill_tokens_per_prefill_step']:.1f}")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(result, indent=2, default=float) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
