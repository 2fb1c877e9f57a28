"""`sim validate`'s replay + delivery path, re-run from a committed session on the CPU (issue 35).

`tidegate sim validate` compares every live run with a replay of that run's recorded arrivals
through the simulator, with the live path outside the model put back: the way in (gateway flush ->
the backend's plan, `dispatch_delay`, measured on the requests that found the engine idle) and the
way out (`delivery_path`: the lowest load's constant, or base + k x the streams of a token's step).
That comparison is the fidelity table's (`fidelity_table --which replay_path`). This tool runs the
same comparison again from the session's files, with the validate's own functions (`sim_spec`,
`run_replay`, `compare`, `compare_steps`, `delivery_path`, `dispatch_delay`), so that

- the recorded figures can be reproduced (with the session's profile and k the validate's replay
  path is deterministic: the same numbers come back; tests/test_sims_validate.py checks it);
- a session recorded before a model change can be scored with today's simulator, with another
  profile (a what-if profile, or a re-measured one) or another per-stream cost, on chosen seeds.

Sessions recorded before the per-request path records (`ttft_path_requests`, 2026-12-04 night)
have each run's median `out` only: the streams of each request's first-token step are rebuilt from
the step log (the step of its last prefill chunk: decodes + chunks) and the run's median `out`
stands for its requests' (the fit is over run medians either way).

    python -m bench.simulator.validate_replay VALIDATE.json DECISIONS.jsonl[.gz] STEPS.jsonl[.gz] \\
        [--profile PROFILE.json] [--delivery-per-stream-ms auto|off|recorded|MS] [--seeds 2,3,4] \\
        [--json OUT.json]

OUT.json has the validate JSON's shape for what it re-ran (config, profile, delivery_path,
dispatch_delay_ms, loads[].runs[].compare_replay_path / steps_path / decisions,
loads[].summary_replay_path / steps_path / decisions), so `fidelity_table` reads it as it reads the
validate's: `python -m bench.simulator.fidelity_table OUT.json`.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench.simulator.plan_lead import engine_fields as lead_engine_fields

# a committed session's runs, windows and path records (shared with bench.simulator.gateway_loop,
# which `sim validate` imports: kept out of this module so that neither imports the other)
from bench.simulator.session_records import first_token_streams, path_records, run_arrivals


def replay_session(validate: dict, arrivals, batches, step_rows: list[dict], profile: str | None = None,
                   per_stream: str = "auto", seeds: set[int] | None = None,
                   live_steps=None, cost_scale=None, hide_launch: str | None = None,
                   power_cap: str | None = None, extra_dispatch_ms: float = 0.0,
                   cap_by_power: bool | str = "auto", decode_spread: str = "measured", mixed_spread: str = "measured",
                   mixed_tiles: str = "measured", decode_tiles: str = "measured",
                   decode_spells: bool | str = True, prefix_term: str = "twins", cap_onset: str = "slow",
                   cap_anchors: str = "sustained",
                   gateway_loop: bool | None = None, live_times: bool = False,
                   plan_lead: str | None = None,
                   gateway_loop_read_ms: float | None = None,
                   ceiling: int = 0, ceiling_noise: str = "both",
                   ceiling_prefill_scatter: str = "auto") -> dict:
    """Re-run the validate's replay + delivery path for every run (or the runs of `seeds`).
    `per_stream`: "auto" (fitted from the session's path records, as `sim validate` does),
    "recorded" (the k the validate used: its `delivery_path`, else 0), "off", or ms.
    `cost_scale(seed, load label)`: a diagnostic, every step time of that run multiplied by it
    (`validate.ScaledCost`; None or 1: the model as it is). `hide_launch`, `power_cap`: "auto" |
    "on" | "off" for the cost model's terms (`validate.model_terms`; None: as the validate had them).
    `extra_dispatch_ms`: added to the measured flush -> plan delay of every request (a what-if: the
    gateway's window firing late, measured at the lowest load). `gateway_loop`: the gateway's event
    loop modelled (`sims.event_loop.EngineConfig.gateway_loop_*`), its terms measured from the
    session (`bench.simulator.gateway_loop.measure`). `live_times`: a diagnostic, every step charged
    its live time where the schedules agree (`fidelity_steps.LiveTimedCost`): what is left is
    outside the steps. `plan_lead`: "profile" (the async loop's lead from the profile's launch, as
    the validate) or "live" (measured on the session's step log, after decode-only steps and after
    steps with prefill, their medians: `bench.simulator.plan_lead`; "live-mean": their means, a
    sensitivity; "live-line": each kind's lead as a line in the duration of the step it plans behind
    (`plan_lead.plan_lead_lines`, `EngineConfig.async_plan_lead_line`); "profile-kinds": the profile's two leads, its `plan_lead_ms`:
    `validate.profile_plan_leads`, ValueError without them). `gateway_loop_read_ms`: the loop's
    read term given instead of measured (a sensitivity). `gateway_loop` / `plan_lead` None: as
    the validate had them (its recorded loop terms and leads; `sim validate` models both by default
    since session 17, the command line here too). `ceiling`: that many draws of the engine's own
    noise per run (`bench.simulator.schedule_ceiling`: the gateway -> engine delays' variation and
    the steps' scatter, both measured on the session, or one of them: `ceiling_noise`; where
    prefill steps' scatter is drawn from: `ceiling_prefill_scatter`, `schedule_ceiling.noise_of`'s
    `prefill_source`), each draw's
    prefill steps compared with the run's replay: the same-chunks figure a model exact in every mean
    timing would reach against a live run,
    per run and per load ("ceiling"); 0: none (each draw costs one more replay)."""
    from bench.serving.ttft_path import delivery_path
    from bench.simulator.decision_fidelity import compare as decision_compare
    from bench.simulator.decision_fidelity import compare_steps
    from bench.simulator.fidelity_resim import session_prefill_cap
    from bench.simulator.fidelity_stats import compare, mean_ci, summarize_load
    from bench.simulator.fidelity_steps import dispatch_delay
    from bench.simulator.gateway_loop import window_lateness
    from bench.simulator.validate import (
        ScaledCost,
        decisions_summary,
        has_sustained_mixed,
        length_spec,
        model_terms,
        prefill_steps_of,
        run_replay,
        sim_spec,
        steps_summary,
    )
    from gateway.serve import build_parser as serve_parser
    from gateway.serve import gateway_config
    from scheduler.batcher import BatcherConfig
    from scheduler.decisions import step_from_json

    cfg, live_be = validate["config"], validate["live_backend"]
    profile = profile or validate["profile"]["path"]
    doc = json.loads(Path(profile).read_text())
    # the validate's model terms and async lead as recorded (the profile's own when another one
    # is given: its launch time and pause check)
    rec = validate["profile"]
    if profile == rec["path"] and hide_launch is None and power_cap is None:
        terms, lead_ms = dict(rec["model_terms"]), rec.get("async_plan_lead_ms")
    else:
        from bench.simulator.validate import async_plan_lead
        lead = async_plan_lead(doc, str(cfg.get("device", "cpu")))
        terms = model_terms(doc, lead, hide_launch or cfg.get("hide_launch", "auto"),
                            power_cap or cfg.get("power_cap", "auto"))
        lead_ms = None if lead is None else 1e3 * lead
    # the power cap by step kind (--cap-by-power; auto, the default since session 25: where the
    # profile has the mixed step's sustained run, as `model_terms`), whatever the validate recorded
    by_power = has_sustained_mixed(doc) if cap_by_power == "auto" else cap_by_power in (True, "on")
    terms = {k: v for k, v in terms.items() if k != "cap_by_power"}
    if by_power and terms.get("power_cap"):
        terms["cap_by_power"] = True
    if not decode_spells and terms.get("cap_by_power"):  # --decode-spells off (sims.profile_cost, "Decode spells")
        terms = {**terms, "decode_spells": False}
    if decode_spells == "spin" and terms.get("power_cap"):  # --decode-spells spin ("The busy level")
        terms = {**terms, "decode_spells": "spin"}
    if prefix_term != "twins":  # --prefix-term fit: the cached-prefix term as before session 26
        terms = {**terms, "prefix_term": prefix_term}
    if cap_onset != "slow" and terms.get("power_cap"):  # --cap-onset fast | delay (sims.profile_cost)
        terms = {**terms, "cap_onset": cap_onset}
    if cap_anchors != "sustained" and terms.get("power_cap"):  # --cap-anchors stream ("Anchors in device time")
        terms = {**terms, "cap_anchors": cap_anchors}
    if decode_spread != "measured":  # off, or a kappa: the unequal-contexts term (sims.decode_spread)
        terms = {**terms, "decode_spread": decode_spread if decode_spread == "off" else float(decode_spread)}
    if mixed_spread != "measured":  # off (their decodes' mean context), or a what-if kappa
        terms = {**terms, "mixed_spread": mixed_spread if mixed_spread == "off" else float(mixed_spread)}
    # the partial attention tiles (sims.profile_cost, "Whole tiles beside a chunk"): "measured", the
    # default since session 35, named only where a CUDA profile's tile-edge pairs measure them
    # (elsewhere it charges nothing); "on" / "off" / a what-if fraction always named
    from sims.profile_cost import charges_tile_pairs
    pairs = charges_tile_pairs(doc)
    terms = {k: v for k, v in terms.items() if k not in ("mixed_tiles", "decode_tiles")}
    if mixed_tiles != "measured" or pairs:
        terms["mixed_tiles"] = mixed_tiles
    if decode_tiles != "measured" or pairs:
        terms["decode_tiles"] = decode_tiles if decode_tiles in ("measured", "off") else float(decode_tiles)
    lead_s = None if lead_ms is None else lead_ms / 1e3
    gw = gateway_config(serve_parser().parse_args(cfg["serve_argv"]), ["live"])
    batcher = BatcherConfig(**cfg["batcher"]) if cfg.get("batcher") else gw.batcher
    cap = session_prefill_cap(validate)
    in_spec, out_spec = length_spec(cfg["input_len"]), length_spec(cfg["output_len"])
    by_run = run_arrivals(validate, arrivals, batches)
    streams = first_token_streams(step_rows)
    live_all = live_steps if live_steps is not None else [step_from_json(r) for r in step_rows]
    seed_list = [int(x) for x in str(cfg["seeds"]).split(",")]
    # the delivery path from every run's records (all seeds, as the validate fitted it)
    recs = {(si, li): path_records(run, [a.request_id for a in by_run[(si, li)][0]], streams)
            for li, ld in enumerate(validate["loads"]) for si, run in enumerate(ld["runs"])}
    low = [recs[(si, 0)] for si in range(len(validate["loads"][0]["runs"]))
           if recs[(si, 0)][0].get("num_requests")]
    have = [v for v in recs.values() if v[0].get("num_requests")]
    if per_stream == "recorded":
        k = (validate.get("delivery_path") or {}).get("per_stream_ms", 0.0)
    else:
        k = None if per_stream == "auto" else 0.0 if per_stream == "off" else float(per_stream)
    path = delivery_path(low, have, k)
    # on the runs' windows (the warm-up's are not measured: as sim validate)
    net_s, num_idle = dispatch_delay(step_rows, [b for (_, bs) in by_run.values() for b in bs])
    net_s += extra_dispatch_ms / 1e3
    # None: as the validate had them (it records the loop's terms and the leads it used)
    if gateway_loop is None:
        gateway_loop = validate.get("gateway_loop") is not None
    if plan_lead is None:
        recorded = validate.get("plan_leads")
        plan_lead = ("profile" if not recorded else "profile-kinds"
                     if "profile" in str(next(iter(recorded.values()), {}).get("source", "")) else "live")
    leads = None
    stat = "mean_ms" if plan_lead == "live-mean" else "median_ms"
    if plan_lead in ("live", "live-mean", "live-line") and lead_s is not None:
        from bench.simulator.plan_lead import plan_lead_lines, plan_leads
        leads = plan_leads(step_rows)
        if plan_lead == "live-line":
            leads["lines"] = plan_lead_lines(step_rows)
    elif plan_lead == "profile-kinds":  # the profile's two leads (its plan_lead_ms), else ValueError
        from bench.simulator.validate import profile_plan_leads
        leads = profile_plan_leads(doc, str(profile))
        if lead_s is None:  # no async loop (the CPU): no lead at all
            leads = None
    loop_terms = None
    if gateway_loop:
        from bench.simulator.gateway_loop import engine_fields, measure
        loop_terms = measure(validate, by_run, step_rows, path)
        if gateway_loop_read_ms is not None:
            loop_terms["read_ms"] = float(gateway_loop_read_ms)
    noise = None
    if ceiling:
        from bench.simulator.schedule_ceiling import noise_of, runs_half_widths
        noise = noise_of(step_rows, [b for (_, bs) in by_run.values() for b in bs], doc,
                         ceiling_prefill_scatter)
    out_loads = []
    for li, ld in enumerate(validate["loads"]):
        runs = []
        for si, run in enumerate(ld["runs"]):
            if seeds is not None and int(run["seed"]) not in seeds:
                continue
            arr, live_b = by_run[(si, li)]
            spec = sim_spec(Path(profile), int(live_be["num_kv_blocks"] or doc["num_kv_blocks"]),
                            int(live_be["block_size"] or doc["block_size"]),
                            int(live_be["max_model_len"] or doc["max_model_len"]), int(doc["max_num_seqs"]),
                            int(doc["max_num_batched_tokens"]), batcher, gw.queues, int(cfg["num_requests"]),
                            float(run["rate"]), in_spec, out_spec,
                            int(run["seed"]), float(cfg.get("burstiness", 1.0)), lead_s, cap, terms)
            spec = replace(spec, engine=replace(spec.engine, delivery_delay_s=path["base_ms"] / 1e3,
                                                delivery_per_stream_s=path["per_stream_ms"] / 1e3,
                                                network_delay_s=net_s))
            if loop_terms is not None:
                spec = replace(spec, engine=replace(spec.engine, **engine_fields(loop_terms)))
            if leads is not None:
                spec = replace(spec, engine=replace(spec.engine, **lead_engine_fields(leads, stat)))
            scale = 1.0 if cost_scale is None else float(cost_scale(int(run["seed"]), ld["load_label"]))
            loop_sim = None

            def build_cost(spec=spec, arr=arr, scale=scale):
                cost = spec.cost.build()
                if live_times:
                    from bench.simulator.fidelity_steps import LiveTimedCost
                    cost = LiveTimedCost(cost, [x.request_id for x in sorted(arr, key=lambda x: x.t)], step_rows)
                if scale != 1.0:
                    cost = ScaledCost(cost, scale)
                return cost
            if scale == 1.0 and not live_times and loop_terms is None:
                sim, sim_b, sim_steps = run_replay(spec, arr)
            else:
                from sims.decision_replay import replay_run, step_records
                from sims.report import summarize
                res_, sim_b = replay_run(arr, spec.scheduler, build_cost(), spec.engine, record_steps=True)
                sim, sim_steps = summarize(res_), step_records(res_, arr)
                loop_sim = res_.extra.get("gateway_loop")
            ceil = None
            if ceiling:
                from bench.simulator.schedule_ceiling import ceiling_draws
                ceil = ceiling_draws(arr, spec.scheduler, spec.engine, build_cost, sim_steps, noise,
                                     int(ceiling), ceiling_noise, seed=int(run["seed"]))
                # each drawn run's figures against the undrawn replay's (what the noise moves)
                base = compare(run["live"], sim)
                drawn = [compare(run["live"], d) for d in ceil.pop("summaries")]
                ceil["figure_moves"] = {k_: [d[k_]["sim"] / base[k_]["sim"] - 1 if base[k_]["sim"] else math.nan
                                             for d in drawn] for k_ in base}
            ids = {a.request_id for a in arr}
            live_pre = prefill_steps_of(live_all, ids)
            runs.append({"seed": run["seed"], "rate": run.get("rate", ld.get("rate")), "cost_scale": scale,
                         "live": run["live"], "compare_replay_path": compare(run["live"], sim),
                         "recorded_replay_path": run.get("compare_replay_path"),
                         "steps_path": compare_steps(live_pre, prefill_steps_of(sim_steps, ids)),
                         "decisions": decision_compare(live_b, sim_b),
                         "frontend_ms": run.get("frontend_ms", {"mean": math.nan}),
                         "ttft_path_ms": run.get("ttft_path_ms"),
                         "window_late_ms": {side: window_lateness(arr, bs, batcher.min_latency_ms / 1e3)[0]
                                            for side, bs in (("live", live_b), ("sim", sim_b))},
                         **({"gateway_loop_sim": loop_sim} if loop_sim is not None else {}),
                         **({"ceiling": ceil} if ceil is not None else {})})
        if not runs:
            continue
        conf = float(cfg.get("confidence", 0.95))
        out_loads.append({"load_label": ld["load_label"], "rate": ld.get("rate"),
                          "load_fraction": ld.get("load_fraction"), "runs": runs,
                          "summary_replay_path": summarize_load(
                              [{"compare": r["compare_replay_path"]} for r in runs], conf),
                          "steps_path": steps_summary([{"steps": r["steps_path"]} for r in runs], conf),
                          **({"ceiling": {"same_prefill_step_share": mean_ci(
                              [r["ceiling"]["same_prefill_step_share"] for r in runs], conf),
                              "noise": ceiling_noise, "draws_per_run": int(ceiling),
                              "half_width": runs_half_widths([r["ceiling"] for r in runs], conf)}}
                             if ceiling else {}),
                          "decisions": decisions_summary(runs, conf),
                          "ttft_path_ms_mean": {k_: float(np.mean([r["ttft_path_ms"][k_] for r in runs]))
                                                for k_ in ("http_in", "front", "window", "to_step",
                                                           "prefill", "out", "ttft")
                                                if all((r.get("ttft_path_ms") or {}).get(k_) is not None
                                                       for r in runs)}})
    return {"source": "bench.simulator.validate_replay",
            "config": cfg, "live_backend": live_be,
            "profile": {**{k_: v for k_, v in doc.items() if k_ != "points"}, "path": str(profile),
                        "num_points": len(doc["points"]), "model_terms": terms,
                        "async_plan_lead_ms": lead_ms, "recorded_path": rec["path"]},
            "delivery_path": path, "delivery_delay_ms": path["base_ms"],
            "dispatch_delay_ms": {"median": 1e3 * net_s, "num_requests": num_idle},
            "gateway_loop": loop_terms, "live_times": live_times, "plan_leads": leads,
            "plan_lead": plan_lead,
            **({"noise": {k_: v for k_, v in noise.items() if k_ not in ("delays_s", "scatter", "prefill_scatter")}}
               if noise is not None else {}),
            "seeds": sorted(seeds) if seeds is not None else seed_list, "loads": out_loads}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.simulator.validate_replay", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("validate", help="the sim validate --json output")
    p.add_argument("decisions", help="its decision log (.jsonl or .jsonl.gz)")
    p.add_argument("steps", help="its step log (.jsonl or .jsonl.gz)")
    p.add_argument("--profile", help="the cost model's profile (default: the session's, as recorded, "
                                     "or under its name beside VALIDATE.json)")
    p.add_argument("--delivery-per-stream-ms", default="auto", metavar="auto|recorded|off|MS",
                   help="the path's cost per stream of a token's step: fitted from the session's "
                        "path records (auto, as sim validate), the validate's, none, or given")
    p.add_argument("--seeds", help="score these seeds only (e.g. the ones a what-if profile was not "
                                   "built from); the delivery path is fitted from every run")
    p.add_argument("--hide-launch", choices=("auto", "on", "off"),
                   help="the cost model's hidden launch (default: as the validate had it)")
    p.add_argument("--power-cap", choices=("auto", "on", "off"),
                   help="the cost model's power cap (default: as the validate had it)")
    p.add_argument("--cap-by-power", nargs="?", const="on", default="auto", choices=("auto", "on", "off"),
                   help="with the power cap: each prefill step weighs in the busy share by its kind's "
                        "power, from the profile's capped mixed step run (sims.profile_cost, \"Power by "
                        "step kind\"; auto, the default since session 25: where the profile has that run; "
                        "the bare flag: on; a profile without that run: unchanged either way)")
    p.add_argument("--decode-spells", choices=("on", "off", "spin"), default="on",
                   help="with --cap-by-power: a step with prefill counts the decode-only share before it "
                        "at its own weight (sims.profile_cost, \"Decode spells\"; default on); off: through "
                        "the pause check's after-decode run only; spin: no spell, and a step with prefill "
                        "launched behind another pays the profile's no-pause level, where its sustained_mixed "
                        "run measured one (\"The busy level\"; elsewhere as on)")
    p.add_argument("--cap-onset", choices=("slow", "fast", "delay"), default="slow",
                   help="with the power cap: slow (default) reads the busy shares at the sustained trace's "
                        "one time constant; fast splits the factor between the limiter's fast onset and its "
                        "slow drift and counts no decode spell (sims.profile_cost, \"The limiter's onset\"); "
                        "delay charges a step with prefill its kind's streamed level once its run of such steps "
                        "has lasted the card's delay, and nothing else (\"The delayed onset\"; where the profile "
                        "measured it, else slow)")
    p.add_argument("--cap-anchors", choices=("sustained", "stream"), default="sustained",
                   help="with the power cap: the cap's ratios from the sustained runs' wall times (default) or "
                        "from the pause check's stream_kind runs in device time, where the profile has them "
                        "(sims.profile_cost, \"Anchors in device time\")")
    p.add_argument("--prefix-term", choices=("twins", "fit"), default="twins",
                   help="the cached-prefix chunks' term: from the profile's prefix points against their "
                        "start-0 twins (the default since session 26) or fit: one coefficient of the "
                        "regression with Σp·s a residual axis, as before (sims.profile_cost, \"The prefix "
                        "term from twins\")")
    p.add_argument("--mixed-spread", default="measured",
                   help="steps with prefill charged for their decodes' spread at the kappa of the "
                        "profile's mixed spread points (sims.profile_cost, 'Unequal contexts beside a "
                        "chunk'; none without them); off: at their decodes' total context; a kappa: "
                        "a what-if at that kappa (where the profile has the decode term's plan)")
    p.add_argument("--mixed-tiles", choices=("on", "off", "measured"), default="measured",
                   help="measured (default since session 35): steps with prefill charged for the fraction of "
                        "their decodes' last attention tiles the profile's tile-edge pairs measure (none "
                        "without them: every profile before 2026-12-07; sims.profile_cost, 'Whole tiles "
                        "beside a chunk'); on: their whole tiles (64 context tokens each); off: their contexts")
    p.add_argument("--decode-tiles", default="measured",
                   help="decode-only steps charged for their decodes' partial attention tiles, c + phi x (the "
                        "tokens to the tile's end): measured (default since session 35: phi from the "
                        "profile's tile-edge pairs; none without them), a fraction phi in [0, 1] (a what-if), "
                        "or off (sims.profile_cost, 'Whole tiles beside a chunk')")
    p.add_argument("--decode-spread", default="measured",
                   help="decode-only steps charged for their contexts' spread (sims.decode_spread): "
                        "'measured' (the default: at the kappa the profile's spread points give; none "
                        "without them), 'off', or a kappa (a what-if on any profile)")
    p.add_argument("--extra-dispatch-ms", type=float, default=0.0,
                   help="what-if: added to the measured gateway flush -> backend plan delay")
    p.add_argument("--gateway-loop", choices=("off", "on"), default="on",
                   help="model the gateway's event loop (timers and arrivals wait for its token "
                        "writes; bench.simulator.gateway_loop), its terms measured from the session "
                        "(default on since session 17; off: the form before)")
    p.add_argument("--plan-lead", choices=("profile", "live", "live-mean", "live-line", "profile-kinds"),
                   default="live",
                   help="the async loop's plan lead: the profile's (as sim validate) or measured on "
                        "the session's step log after decode-only and prefill steps (plan_lead: "
                        "their medians; live-mean: their means, a sensitivity; live-line: each kind's lead as a "
                        "line in the duration of the step it plans behind), or the profile's two "
                        "leads by kind of step (profile-kinds: its plan_lead_ms, an error without it); "
                        "default live since session 17 (profile: the form before)")
    p.add_argument("--gateway-loop-read-ms", type=float,
                   help="sensitivity: the gateway loop's read term (step end -> its outputs on the "
                        "loop) given instead of the delivery path's intercept")
    p.add_argument("--live-times", action="store_true",
                   help="diagnostic: the live step times fed back (fidelity_steps.LiveTimedCost)")
    p.add_argument("--ceiling", type=int, default=0, metavar="DRAWS",
                   help="per run, DRAWS re-runs with the engine's own noise drawn (the delays' "
                        "variation and the steps' scatter, measured on the session: "
                        "bench.simulator.schedule_ceiling), each compared with the run's replay: "
                        "the same-chunks figure a model exact in every mean timing would reach "
                        "against a live run (default 0: none)")
    p.add_argument("--ceiling-noise", choices=("both", "delays", "scatter"), default="both",
                   help="which noise --ceiling draws (default both)")
    p.add_argument("--ceiling-prefill-scatter", choices=("auto", "live", "sustained", "decode"),
                   default="auto",
                   help="where --ceiling draws prefill steps' scatter from: live prefill steps against "
                        "the last of their exact shape, the profile's sustained runs, or the decode-"
                        "only steps' sample (as session 22 did); auto (default): live where it has "
                        ">= 100 pairs, else sustained, else decode")
    p.add_argument("--json", dest="json_out")
    return p


def _mean_pm(m: dict) -> str:
    """A share's mean ± its interval over the runs, in % (the interval left out for one run)."""
    ci = m.get("ci", math.nan)
    return f"{100 * m['mean']:.1f}%" + (f" ± {100 * ci:.1f}" if math.isfinite(ci) else "")


def main(argv: list[str] | None = None) -> int:
    from bench.simulator.fidelity_steps import read_steps
    from scheduler.decisions import read_log

    p = parser()
    a = p.parse_args(argv)
    validate = json.loads(Path(a.validate).read_text())
    arrivals, batches = read_log(a.decisions)
    rows = read_steps(a.steps)
    seeds = None if not a.seeds else {int(x) for x in a.seeds.split(",")}
    profile = a.profile
    if profile is None and not Path(validate["profile"]["path"]).exists():
        # a committed session: its profile beside the validate JSON, under the recorded name
        profile = str(Path(a.validate).parent / Path(validate["profile"]["path"]).name)
    if a.plan_lead == "profile-kinds":  # a clear error before the replays when the profile lacks the leads
        from bench.simulator.validate import profile_plan_leads
        prof = profile or validate["profile"]["path"]
        try:
            profile_plan_leads(json.loads(Path(prof).read_text()), prof)
        except ValueError as e:
            p.error(str(e))
    res = replay_session(validate, arrivals, batches, rows, profile, a.delivery_per_stream_ms, seeds,
                         hide_launch=a.hide_launch, power_cap=a.power_cap, cap_by_power=a.cap_by_power,
                         decode_spread=a.decode_spread, mixed_spread=a.mixed_spread, mixed_tiles=a.mixed_tiles, decode_tiles=a.decode_tiles,
                         decode_spells={"on": True, "off": False}.get(a.decode_spells, a.decode_spells), prefix_term=a.prefix_term, cap_onset=a.cap_onset, cap_anchors=a.cap_anchors, extra_dispatch_ms=a.extra_dispatch_ms, gateway_loop=a.gateway_loop == "on",
                         live_times=a.live_times, plan_lead=a.plan_lead,
                         gateway_loop_read_ms=a.gateway_loop_read_ms,
                         ceiling=a.ceiling, ceiling_noise=a.ceiling_noise,
                         ceiling_prefill_scatter=a.ceiling_prefill_scatter)
    dp = res["delivery_path"]
    print(f"profile {res['profile']['path']} ({res['profile']['num_points']} points), terms "
          f"{res['profile']['model_terms']}, lead {res['profile']['async_plan_lead_ms']} ms; delivery path "
          f"{dp['base_ms']:.3f} ms + {dp['per_stream_ms']:.4f} ms x streams (constant {dp['constant_ms']:.3f}; "
          f"fit {dp['fit']}); dispatch {res['dispatch_delay_ms']['median']:.3f} ms"
          + ("; live step times" if a.live_times else ""))
    if res["plan_leads"] is not None:
        pl = res["plan_leads"]
        st = "mean_ms" if res["plan_lead"] == "live-mean" else "median_ms"
        print(f"plan lead ({res['plan_lead']}): {pl['decode'][st]:.3f} ms after decode-only steps, "
              f"{pl['prefill'][st]:.3f} ms after steps with prefill" + ("" if "lines" not in pl else "; lines "
              + ", ".join(f"{k} {v['a_ms']:.2f} ms + {v['b']:.3f} x ms" for k, v in pl["lines"].items())))
    if "noise" in res:
        nz = res["noise"]
        p5, p95 = nz["delay_p5_p95_ms"] or (math.nan, math.nan)
        print(f"ceiling ({a.ceiling} draws a run, {a.ceiling_noise}): the delay's p5 / p95 {p5:.3f} / "
              f"{p95:.3f} ms over {nz['num_delays']} idle requests; step scatter robust sd "
              f"{100 * (nz['scatter_robust_sd'] or math.nan):.2f}% over {nz['num_scatter']} pairs"
              + (f", prefill steps' {100 * nz['prefill_scatter_robust_sd']:.2f}% over "
                 f"{nz['num_prefill_scatter']} {nz['prefill_scatter_source']} pairs"
                 if nz.get("num_prefill_scatter") else ", prefill steps' the same"))
    gl = res["gateway_loop"]
    if gl is not None:
        print(f"gateway loop: {gl['per_stream_ms']:.4f} ms a stream from {gl['read_ms']:.3f} ms after a step's "
              f"end, timer late {gl['timer_late_ms']:.3f} ms at idle, {gl['request_ms']:.3f} ms a request")
    for ld in res["loads"]:
        s = ld["summary_replay_path"]
        sc = ld["steps_path"].get("same_prefill_step_share", {})
        print(f"{ld['load_label']:>6}: " + ", ".join(
            f"{m} {100 * s[m]['rel_err']['mean']:+.1f} ± {100 * s[m]['rel_err']['ci']:.1f}%"
            for m in ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "throughput"))
            + f"; same chunks {100 * sc.get('mean', math.nan):.1f}%"
            + (f" (ceiling {_mean_pm(ld['ceiling']['same_prefill_step_share'])})" if "ceiling" in ld else "")
            + "; window late live / sim {:.2f} / {:.2f} ms".format(
                *(float(np.nanmean([r["window_late_ms"][k_] for r in ld["runs"]])) for k_ in ("live", "sim")))
            + ("; loop residual {:.3f} ms".format(1e3 * float(np.mean(
                [r["gateway_loop_sim"]["residual_mean_s"] for r in ld["runs"]])))
               if all("gateway_loop_sim" in r for r in ld["runs"]) else ""))
    if a.json_out:
        from bench.simulator.validate import _default
        Path(a.json_out).write_text(json.dumps(res, indent=1, default=_default) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
