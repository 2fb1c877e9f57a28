"""`tidegate sim agent`: an agent-session trace through the simulator (issue 30).

    tidegate sim agent --profile bench/results/fidelity_h200_2/profile_33b.json --backends 4 \\
        --sessions 64 --loads 0.5,0.9 --policies least-tokens,prefix --json out.json
    tidegate sim agent --agent-trace trace.jsonl ...          # a trace file (sims.agent_trace)
    tidegate sim agent --write-trace trace.jsonl --sessions 64  # only write the generated trace

The trace is generated (`sims.agent_trace.generate`, flags below) or read. Its *capacity* is
found first: the largest rate factor (sessions arriving that many times as often, the times
within a session kept) at which the deployment keeps up with the ``prefix`` policy and session
keys — keeps up meaning the last quarter of the requests wait no longer for their first token
(p90) than ``--keep-up-ratio`` times the first quarter did (an overloaded open-loop run
queues without end) — by bisection over ``--capacity-steps`` runs. Then each load (a fraction
of that factor) is run with each policy, ``prefix`` twice: with the sessions' keys (what an
agent's session header gives the gateway) and without (the session found from the prompt).

Per run: the share of the available prefix reuse captured (prompt tokens found cached over
the tokens some earlier prompt shared, `agent_trace.available_reuse`), TTFT p50 of follow-up
turns (every turn but a session's first) and of all requests, busiest/idlest backend mean
in-flight tokens (the placement's outstanding tokens, sampled over the run), session stays and
moves, pins, preemptions.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

import numpy as np

from sims import agent_trace as at
from sims.event_loop import simulate
from sims.options import add_run_args, parse_list, parse_with_config, spec_from_args


def add_trace_args(p: argparse.ArgumentParser) -> None:
    d = at.AgentTraceConfig()
    g = p.add_argument_group("agent trace (sims.agent_trace)")
    g.add_argument("--agent-trace", help="a trace file; default: generate one")
    g.add_argument("--write-trace", help="write the (generated) trace here")
    g.add_argument("--sessions", type=int, default=d.num_sessions)
    g.add_argument("--session-rate", type=float, default=d.session_rate, help="sessions/s")
    g.add_argument("--max-context", type=int, default=d.max_context)
    g.add_argument("--system-prompt-tokens", type=int, default=d.system_prompt_tokens)
    g.add_argument("--first-message-tokens", type=float, default=d.first_message_tokens)
    g.add_argument("--turn-new-tokens", type=float, default=d.new_tokens)
    g.add_argument("--output-tokens", type=float, default=d.output_tokens)
    g.add_argument("--tool-latency-s", type=float, default=d.tool_latency_s)
    g.add_argument("--subagent-prob", type=float, default=d.subagent_prob)
    g.add_argument("--pin-fraction", type=float, default=d.pin_fraction)
    g.add_argument("--pin-ttl-s", type=float, default=d.pin_ttl_s)
    g.add_argument("--trace-seed", type=int, default=d.seed)


def trace_config_from_args(a: argparse.Namespace) -> at.AgentTraceConfig:
    return at.AgentTraceConfig(
        num_sessions=a.sessions, session_rate=a.session_rate, max_context=a.max_context,
        system_prompt_tokens=a.system_prompt_tokens, first_message_tokens=a.first_message_tokens,
        new_tokens=a.turn_new_tokens, output_tokens=a.output_tokens,
        tool_latency_s=a.tool_latency_s, subagent_prob=a.subagent_prob,
        pin_fraction=a.pin_fraction, pin_ttl_s=a.pin_ttl_s, seed=a.trace_seed)


def trace_from_args(a: argparse.Namespace) -> at.AgentTrace:
    if a.agent_trace:
        return at.load(a.agent_trace)
    return at.generate(trace_config_from_args(a))


def run_once(trace: at.AgentTrace, spec, policy: str, keys: bool) -> dict:
    """One simulation of the trace; the agent figures (module docstring)."""
    placement = replace(spec.engine.placement, policy=policy)
    engine = replace(spec.engine, placement=placement)
    sched = replace(spec.scheduler, enable_prefix_caching=True)
    w = at.to_workload(trace, session_keys=keys)
    res = simulate(w, spec.cost.build(), sched, engine)
    return agent_figures(trace, res)


def agent_figures(trace: at.AgentTrace, res) -> dict:
    reqs = trace.requests
    avail = np.array(at.available_reuse(trace), dtype=np.float64)
    cached = np.array(res.extra.get("cached_tokens", [0] * len(reqs)), dtype=np.float64)
    arrival = res.workload.arrival_time
    ttft = res.first_token_time - arrival
    done = np.isfinite(ttft)
    follow = np.array([r.turn > 0 or r.parent is not None for r in reqs])
    first = ~follow
    samples = np.array(res.extra.get("backend_load_samples") or [[0]], dtype=np.float64)
    mean_load = samples.mean(axis=0)
    q = len(reqs) // 4
    keep = (float(np.nanpercentile(ttft[-q:], 90)) / max(float(np.nanpercentile(ttft[:q], 90)), 1e-9)
            if q and done[-q:].all() else float("inf"))
    stats = res.backend_stats
    pl = res.extra["placement"]

    def p50(mask):
        m = mask & done
        return float(np.median(ttft[m]) * 1e3) if m.any() else None

    return {
        "requests": len(reqs), "finished": int(done.sum()),
        "reuse_captured": float(cached.sum() / avail.sum()) if avail.sum() else 0.0,
        "cached_tokens": int(cached.sum()), "available_reuse_tokens": int(avail.sum()),
        "ttft_p50_ms_followup": p50(follow), "ttft_p50_ms_first": p50(first),
        "ttft_p50_ms": p50(np.ones(len(reqs), dtype=bool)),
        "ttft_p99_ms": float(np.nanpercentile(ttft, 99) * 1e3) if done.any() else None,
        "busiest_idlest_inflight": (float(mean_load.max() / mean_load.min())
                                    if mean_load.min() > 0 else float("inf")),
        "mean_inflight_tokens": mean_load.round(0).tolist(),
        "keep_up_ratio": keep,
        "sessions": pl.get("sessions"), "backend_requests": pl.get("backend_requests"),
        "preemptions": sum(s.get("num_preemptions", 0) for s in stats),
        "pins": res.extra.get("pins"),
        "sim_end_s": res.sim_end, "last_arrival_s": float(arrival[-1]), "wall_s": res.wall_s,
    }


def find_capacity(trace: at.AgentTrace, spec, keep_up_ratio: float, steps: int,
                  lo: float = 0.25, hi: float = 16.0, log=print) -> tuple[float, list]:
    """The largest rate factor the deployment keeps up with (module docstring)."""
    tried = []

    def ok(f: float) -> bool:
        r = run_once(at.rescale(trace, f), spec, "prefix", True)
        good = r["finished"] == r["requests"] and r["keep_up_ratio"] <= keep_up_ratio
        tried.append({"factor": f, "keep_up_ratio": r["keep_up_ratio"], "ok": good,
                      "ttft_p50_ms": r["ttft_p50_ms"]})
        log(f"  capacity probe x{f:.3g}: keep-up ratio {r['keep_up_ratio']:.2f} "
            f"({'ok' if good else 'overloaded'})")
        return good

    while not ok(lo) and lo > 1e-3:
        hi, lo = lo, lo / 4
    while ok(hi) and hi < 1e4:
        lo, hi = hi, hi * 4
    for _ in range(steps):
        mid = (lo * hi) ** 0.5
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo, tried


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tidegate sim agent", description=__doc__.split("\n")[0])
    add_run_args(p)
    add_trace_args(p)
    p.add_argument("--loads", default="0.5,0.9", help="fractions of the capacity to run at")
    p.add_argument("--policies", default="least-tokens,prefix",
                   help="placement policies to compare (prefix runs with and without keys)")
    p.add_argument("--capacity-factor", type=float,
                   help="the capacity as a rate factor of the trace (skip the search)")
    p.add_argument("--capacity-steps", type=int, default=6)
    p.add_argument("--keep-up-ratio", type=float, default=2.0)
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parse_with_config(p, argv)
    trace = trace_from_args(a)
    if a.write_trace:
        at.write(trace, a.write_trace)
        print(f"wrote {len(trace)} requests to {a.write_trace}")
        if not a.json_out:
            print(json.dumps(at.trace_figures(trace), indent=1))
            return 0
    spec = spec_from_args(a)
    figures = at.trace_figures(trace)
    print(f"trace: {figures['requests']} requests, {figures['sessions']} sessions, "
          f"{figures['subagents']} sub-agents; median input {figures['median_input_tokens']:.0f}, "
          f"output {figures['median_output_tokens']:.0f}; input share {figures['input_share']:.3f}; "
          f"turns reusing >= 90%: {figures['turns_reusing_90pct']:.3f}")
    tried = []
    cap = a.capacity_factor
    if cap is None:
        cap, tried = find_capacity(trace, spec, a.keep_up_ratio, a.capacity_steps)
    span = figures["duration_s"]
    print(f"capacity: x{cap:.3g} of the trace's rate ({figures['requests'] * cap / max(span, 1e-9):.3g} "
          "requests/s over the trace at x1's span)")
    runs = []
    for load in parse_list(a.loads):
        t = at.rescale(trace, cap * load)
        for policy in parse_list(a.policies, str):
            for keys in ((True, False) if policy != "least-tokens" else (True,)):
                r = run_once(t, spec, policy, keys)
                r.update(load=load, policy=policy, session_keys=keys)
                runs.append(r)
                print(f"load {load:g} {policy:12s} keys={'on ' if keys else 'off'}: reuse "
                      f"{r['reuse_captured']:.3f}, follow-up TTFT p50 {r['ttft_p50_ms_followup']:.0f} ms, "
                      f"all p50 {r['ttft_p50_ms']:.0f} ms p99 {r['ttft_p99_ms']:.0f} ms, "
                      f"busiest/idlest {r['busiest_idlest_inflight']:.2f}, moves "
                      f"{(r['sessions'] or {}).get('session_moves', '-')}, preemptions {r['preemptions']}")
    for load in parse_list(a.loads):
        base = next((r for r in runs if r["load"] == load and r["policy"] == "least-tokens"), None)
        for r in runs:
            if base is not None and r["load"] == load and r is not base:
                r["followup_ttft_vs_least_tokens"] = (r["ttft_p50_ms_followup"]
                                                      / base["ttft_p50_ms_followup"])
    out = {"trace": figures, "capacity_factor": cap, "capacity_probes": tried, "runs": runs,
           "cost_model": getattr(spec.cost.build(), "describe", dict)(),
           "backends": spec.engine.num_backends, "argv": argv}
    if a.json_out:
        with open(a.json_out, "w") as fh:
            json.dump(out, fh, indent=1)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
