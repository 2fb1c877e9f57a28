"""Placement policies side by side in the simulator: latency against rate per policy, the goodput
knee, and per-backend load — the measurements of issue 14 §4.

    python -m sims.placement_study --workloads a,b,c --json out/placement.json --plot docs/placement

Workloads (4 backends of deepseek-coder-6.7b on H200 by default):
  a  multi-tenant: `--tenants` system prompts of 2,048 tokens + a 256-token question, 64 out
  b  one hot prefix shared by all traffic (the same shapes, one tenant)
  c  no shared prefixes, long outputs: 512-token prompts, 512..1,536 output tokens

Goodput is the fraction of requests with TTFT <= 500 ms and TPOT <= 50 ms; the *knee* is the
rate at which it falls to 90%, interpolated linearly between the swept rates. Every run uses the
same policy objects as the gateway (`scheduler.placement`), only the policy name changes.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace

from scheduler.placement import POLICIES, PlacementConfig
from sims.runner import CostSpec, RunSpec
from sims.sweep import run_many
from sims.workload import LengthSpec, WorkloadConfig

SLO_TTFT_MS, SLO_TPOT_MS, GOOD_FRACTION = 500.0, 50.0, 0.9

DEFAULT_RATES = {"a": "40,80,120,160,200,240,280,320,400",
                 "b": "40,80,120,160,200,240,280,320,400",
                 "c": "4,8,12,16,20,24,28,32"}


def workload(name: str, num_requests: int, tenants: int, seed: int) -> WorkloadConfig:
    if name in ("a", "b"):
        return WorkloadConfig(num_requests=num_requests, input_len=LengthSpec("fixed", 2048 + 256),
                              output_len=LengthSpec("fixed", 64), shared_prefix_fraction=1.0,
                              shared_prefix_len=2048,
                              num_prefix_groups=tenants if name == "a" else 1, seed=seed)
    if name == "c":
        return WorkloadConfig(num_requests=num_requests, input_len=LengthSpec("fixed", 512),
                              output_len=LengthSpec("uniform", low=512, high=1536), seed=seed)
    raise ValueError(f"unknown workload {name!r} (a | b | c)")


def knee(rates: list[float], fractions: list[float], level: float = GOOD_FRACTION) -> float | None:
    """The rate where the goodput fraction crosses `level` (linear between swept rates); None if
    it never falls below (the knee lies past the last rate); 0 if the first rate already fails."""
    prev = None
    for r, f in zip(rates, fractions):
        if f < level:
            if prev is None:
                return 0.0
            r0, f0 = prev
            return r0 + (r - r0) * (f0 - level) / (f0 - f)
        prev = (r, f)
    return None


def point(rep: dict) -> dict:
    p = rep["placement"]
    return {"rate": rep["config"]["rate"], "policy": rep["config"]["placement"],
            "ttft_ms": rep["ttft_ms"], "tpot_ms": rep["tpot_ms"], "e2el_ms": rep["e2el_ms"],
            "goodput_fraction": rep["goodput_fraction"],
            "request_throughput": rep["request_throughput"],
            "output_throughput": rep["output_throughput"],
            "prefix_hit_rate": rep["kv"]["prefix_hit_rate"],
            "backend_busy_s": p["backend_busy_s"], "busy_max_over_min": p.get("busy_max_over_min"),
            "backend_requests": p["backend_requests"], "backend_tokens": p["backend_tokens"],
            "backend_prefix_hit_rate": p["backend_prefix_hit_rate"],
            "preemptions": rep["preemptions"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sims.placement_study", description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="a,b,c")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--rates-a", default=DEFAULT_RATES["a"])
    ap.add_argument("--rates-b", default=DEFAULT_RATES["b"])
    ap.add_argument("--rates-c", default=DEFAULT_RATES["c"])
    ap.add_argument("--num-requests", type=int, default=3000)
    ap.add_argument("--tenants", type=int, default=32)
    ap.add_argument("--backends", type=int, default=4)
    ap.add_argument("--model", default="deepseek-coder-6.7b")
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--num-blocks", type=int, default=None,
                    help="KV blocks per backend (default: what the model leaves on the GPU); "
                         "smaller pools test how much affinity saves when prefixes do not fit")
    ap.add_argument("--load-factor", type=float, default=PlacementConfig.load_factor)
    ap.add_argument("--slack-tokens", type=int, default=None,
                    help="a fixed slack for the load bound (default: a fraction of each "
                         "backend's KV tokens, scheduler.placement)")
    ap.add_argument("--prefix-caching", choices=("auto", "on"), default="auto",
                    help="auto: on when the workload shares prefixes (c: off, so every policy "
                         "places as least-tokens); on: as live backends run, prompts are hashed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int)
    ap.add_argument("--json", dest="json_out")
    ap.add_argument("--plot", metavar="DIR")
    a = ap.parse_args(argv)
    policies = a.policies.split(",")
    base = RunSpec(cost=CostSpec(model=a.model, gpu=a.gpu, num_blocks=a.num_blocks), slo_ttft_ms=SLO_TTFT_MS,
                   slo_tpot_ms=SLO_TPOT_MS)
    if a.prefix_caching == "on":
        base = replace(base, scheduler=replace(base.scheduler, enable_prefix_caching=True))
    specs, keys = [], []
    for wname in a.workloads.split(","):
        wl = workload(wname, a.num_requests, a.tenants, a.seed)
        for rate in (float(x) for x in getattr(a, f"rates_{wname}").split(",")):
            for pol in policies:
                pc = PlacementConfig(policy=pol, load_factor=a.load_factor,
                                     **({} if a.slack_tokens is None else
                                        {"load_slack_tokens": a.slack_tokens,
                                         "fixed_slack": True}))
                specs.append(replace(base, workload=replace(wl, rate=rate),
                                     engine=replace(base.engine, num_backends=a.backends,
                                                    placement=pc)))
                keys.append(wname)
    reports = run_many(specs, a.jobs)
    out: dict = {"config": {"backends": a.backends, "model": a.model, "gpu": a.gpu,
                            "num_requests": a.num_requests, "tenants": a.tenants,
                            "num_blocks": a.num_blocks, "prefix_caching": a.prefix_caching,
                            "load_factor": a.load_factor, "slack_tokens": a.slack_tokens,
                            "slo_ttft_ms": SLO_TTFT_MS, "slo_tpot_ms": SLO_TPOT_MS},
                 "workloads": {}}
    for wname, rep in zip(keys, reports):
        out["workloads"].setdefault(wname, {"points": []})["points"].append(point(rep))
    for wname, w in out["workloads"].items():
        w["knee"] = {}
        for pol in policies:
            pts = sorted((p for p in w["points"] if p["policy"] == pol), key=lambda p: p["rate"])
            w["knee"][pol] = knee([p["rate"] for p in pts], [p["goodput_fraction"] for p in pts])
        print_table(wname, w, policies)
    if a.json_out:
        with open(a.json_out, "w") as fh:
            json.dump(out, fh, indent=1)
    if a.plot:
        from sims.plots import placement_latency
        for wname, w in out["workloads"].items():
            print("plots:", ", ".join(placement_latency(w["points"], a.plot, f"placement_{wname}",
                                                        title=f"workload {wname}")))
    return 0


def print_table(wname: str, w: dict, policies: list[str]) -> None:
    print(f"\nworkload {wname}: knee (rate at {GOOD_FRACTION:.0%} goodput) " + ", ".join(
        f"{p} {w['knee'][p]:.1f}" if w["knee"][p] is not None else f"{p} >max" for p in policies))
    print(f"{'rate':>6} {'policy':<13}{'TTFT p50':>9}{'TTFT p99':>9}{'TPOT p50':>9}{'good':>6}"
          f"{'hit':>6}{'busy max/min':>13}")
    for p in sorted(w["points"], key=lambda p: (p["rate"], policies.index(p["policy"]))):
        print(f"{p['rate']:>6g} {p['policy']:<13}{p['ttft_ms']['p50']:>9.1f}{p['ttft_ms']['p99']:>9.1f}"
              f"{p['tpot_ms']['p50']:>9.1f}{p['goodput_fraction']:>6.2f}{p['prefix_hit_rate']:>6.2f}"
              f"{p['busy_max_over_min'] or 0:>13.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
