"""`tidegate sim slo`: an SLO planner. Given a workload (flags or a trace) and TTFT/TPOT targets
per class, how many backends does it need, and what attainment should one expect?

    tidegate sim slo --trace trace.jsonl --profile PROFILE.json \\
        --slo-ttft-ms fast=200,normal=1000,slow=4000 --attainment 0.99
    tidegate sim slo --rate 40 --input-len 512 --output-len lognormal:64:1 --model deepseek-coder-33b

It simulates the workload on 1, 2, ... `--max-backends` backends, with the gateway's admission on
(requests predicted to miss their TTFT deadline are refused, as `tidegate serve --slo-ttft-ms`
does) and the window and class settings given (the defaults unless set), and answers with the
smallest backend count whose every class reaches `--attainment` of its requests (refused ones
count as missed), each count's attainment per class beside it.

With no targets it proposes some from the trace first: the workload on as many backends as it
takes for TTFT p99 to stop falling by more than 10% from one count to the next (the latency the
work itself costs, without queueing), and per class `--headroom` times that run's TTFT p99 and
TPOT p99, rounded up to two significant figures. Users without formal SLOs (most, surveyed) get a
starting point that a deployment of reasonable size meets, which they can then tighten.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import replace

from scheduler.classes import CLASS_NAMES
from scheduler.slo import SLOTargets, format_targets
from sims.options import add_run_args, parse_with_config, spec_from_args
from sims.runner import RunSpec, run_spec


def round_up(x: float, digits: int = 2) -> float:
    """Up to `digits` significant figures: 123.4 -> 130, 0.0123 -> 0.013."""
    if x <= 0 or not math.isfinite(x):
        return x
    scale = 10 ** (math.floor(math.log10(x)) - digits + 1)
    return math.ceil(round(x / scale, 9)) * scale


def with_backends(spec: RunSpec, n: int, slo: SLOTargets | None, admission: bool) -> RunSpec:
    sched = spec.scheduler if slo is None else replace(spec.scheduler, slo=slo, admission=admission)
    return replace(spec, scheduler=sched, engine=replace(spec.engine, num_backends=n))


def attainment(rep: dict, sent: dict[str, int]) -> dict[str, float]:
    """Per class: requests that met their targets / requests sent (refused = missed)."""
    out = {}
    for name, n in sent.items():
        c = rep["by_class"].get(name)
        good = c["goodput_fraction"] * c["completed"] if c else 0.0
        out[name] = good / n if n else 1.0
    return out


def propose(spec: RunSpec, max_backends: int, headroom: float) -> tuple[SLOTargets, int, dict]:
    """Targets from the workload itself (module doc): (targets, backends of the run, its report)."""
    prev = None
    for n in range(1, max_backends + 1):
        rep = run_spec(with_backends(spec, n, None, False))
        p99 = rep["ttft_ms"]["p99"]
        if prev is not None and p99 > 0.9 * prev[1]:
            n, rep = prev[0], prev[2]
            break
        prev = (n, p99, rep)
    else:
        n, _, rep = prev
    ttft, tpot = [], []
    for name in CLASS_NAMES:
        c = rep["by_class"].get(name)
        ttft.append(round_up(headroom * c["ttft_ms"]["p99"]) if c else None)
        tpot.append(round_up(headroom * c["tpot_ms"]["p99"]) if c and c["tpot_ms"]["p99"] else None)
    return SLOTargets(tuple(ttft), tuple(tpot)), n, rep


def plan(spec: RunSpec, targets: SLOTargets, goal: float, max_backends: int) -> dict:
    rows = []
    classes = [int(c) for c in _classes_of(spec)]
    sent = {name: classes.count(i) for i, name in enumerate(CLASS_NAMES) if i in classes}
    for n in range(1, max_backends + 1):
        rep = run_spec(with_backends(spec, n, targets, True))
        att = attainment(rep, sent)
        rows.append({"backends": n, "attainment": att, "refused": rep["admission"]["refused"],
                     "ttft_p99_ms": {k: v["ttft_ms"]["p99"] for k, v in rep["by_class"].items()},
                     "mean_window": rep["batch_size"]["mean"],
                     "busy": rep["steps"]["backend_busy_fraction"]})
        if all(a >= goal for a in att.values()):
            break
    ok = [r for r in rows if all(a >= goal for a in r["attainment"].values())]
    return {"targets": targets.describe(), "goal": goal, "rows": rows,
            "backends": ok[0]["backends"] if ok else None}


def _classes_of(spec: RunSpec):
    from sims.adapters import _queue_classes
    from sims.workload import generate, load_trace
    w = generate(spec.workload, load_trace(spec.trace) if spec.trace else None)
    return _queue_classes(w, spec.scheduler.queue.class_bounds)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tidegate sim slo", description="SLO planner: backends "
                                "needed for per-class TTFT/TPOT targets (proposes targets when "
                                "none are given)")
    add_run_args(p, num_requests=2000)
    p.add_argument("--attainment", type=float, default=0.99,
                   help="share of each class's requests that must meet its targets")
    p.add_argument("--max-backends", type=int, default=16)
    p.add_argument("--headroom", type=float, default=2.0,
                   help="proposed target = this x the unqueued p99 (when no targets are given)")
    a = parse_with_config(p, argv)
    if not 0 < a.attainment <= 1:
        p.error("--attainment must be in (0, 1]")
    spec = spec_from_args(a)
    targets = spec.scheduler.slo
    out: dict = {}
    if not targets.any_ttft:
        proposed, n, _ = propose(spec, a.max_backends, a.headroom)
        if targets.any:  # TPOT given, TTFT proposed
            proposed = SLOTargets(proposed.ttft_ms, targets.tpot_ms)
        targets = proposed
        out["proposed"] = {"from_backends": n, "ttft_ms": format_targets(targets.ttft_ms),
                           "tpot_ms": format_targets(targets.tpot_ms)}
        print(f"proposed targets (x{a.headroom:g} the unqueued p99 on {n} backend(s)): "
              f"--slo-ttft-ms {format_targets(targets.ttft_ms)} "
              f"--slo-tpot-ms {format_targets(targets.tpot_ms)}")
    result = plan(spec, targets, a.attainment, a.max_backends)
    out.update(result)
    b = spec.scheduler.batcher
    out["settings"] = {"target_throughput": b.target_throughput, "min_latency_ms": b.min_latency_ms,
                       "max_batch_size": b.max_batch_size, "idle_flush": b.idle_flush,
                       "class_bounds": list(spec.scheduler.queue.class_bounds)}
    names = list(result["rows"][0]["attainment"])
    print(f"{'backends':>8}" + "".join(f"{n + ' %':>10}" for n in names)
          + f"{'refused':>9}{'window':>8}{'busy %':>8}")
    for r in result["rows"]:
        print(f"{r['backends']:>8}" + "".join(f"{100 * r['attainment'][n]:>10.1f}" for n in names)
              + f"{r['refused']:>9}{r['mean_window']:>8.2f}{100 * r['busy']:>8.0f}")
    if result["backends"] is None:
        print(f"no count up to {a.max_backends} reaches {100 * a.attainment:g}% in every class")
    else:
        print(f"answer: {result['backends']} backend(s) (window: target {b.target_throughput:g} "
              f"req/s, {b.min_latency_ms:g} ms; classes fast <= {spec.scheduler.queue.class_bounds[0]},"
              f" normal <= {spec.scheduler.queue.class_bounds[1]} tokens); serve with "
              f"--slo-ttft-ms {format_targets(targets.ttft_ms)}"
              + (f" --slo-tpot-ms {format_targets(targets.tpot_ms)}" if any(targets.tpot_ms) else ""))
    if a.json_out:
        import json
        with open(a.json_out, "w") as fh:
            json.dump(out, fh, indent=2)
            fh.write("\n")
    return 0
