"""Simulator speed: `python -m sims [--num-requests N] [--rate R] ...`.

Default: one million requests (prompt 512, output 128 tokens, Poisson) through 4 backends of
deepseek-coder-6.7b on H200 (roofline), the issue's speed target. Prefix caching is "auto": off
here, as no prompts share a prefix (`--prefix-caching on` to time the cache's bookkeeping). Prints wall time, events/s,
requests/s and the share of wall time spent inside the real scheduler objects.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time

from sims.adapters import SimSchedulerConfig
from sims.cost import RooflineCost
from sims.event_loop import EngineConfig, simulate
from sims.hardware import get_gpu
from sims.model_shape import load_model_shape
from sims.report import summarize
from sims.workload import LengthSpec, WorkloadConfig, generate


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sims", description=__doc__.splitlines()[0])
    p.add_argument("--num-requests", type=int, default=1_000_000)
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--backends", type=int, default=4)
    p.add_argument("--model", default="deepseek-coder-6.7b")
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--prefix-caching", choices=("auto", "on", "off"), default="auto",
                   help="auto (default): on only when the workload shares prefixes (this one "
                        "does not), see sims.adapters")
    p.add_argument("--no-prefix-caching", dest="prefix_caching", action="store_const", const="off")
    p.add_argument("--max-stretch-steps", type=int, default=1 << 30)
    p.add_argument("--max-stretch-finishes", type=int, default=EngineConfig.max_stretch_finishes,
                   help="finishing steps one stretch may pass (0: a finish ends it)")
    p.add_argument("--profile", action="store_true", help="cProfile: where the time goes")
    p.add_argument("--json", dest="json_out")
    a = p.parse_args(argv)
    w = generate(WorkloadConfig(num_requests=a.num_requests, rate=a.rate,
                                input_len=LengthSpec("fixed", a.input_len),
                                output_len=LengthSpec("fixed", a.output_len), seed=0))
    cost = RooflineCost(load_model_shape(a.model), get_gpu("h200"))
    sched = SimSchedulerConfig(enable_prefix_caching={"auto": None, "on": True,
                                                      "off": False}[a.prefix_caching])
    eng = EngineConfig(num_backends=a.backends, max_stretch_steps=a.max_stretch_steps,
                       max_stretch_finishes=a.max_stretch_finishes, progress=True)
    prof = cProfile.Profile() if a.profile else None
    t0, c0 = time.perf_counter(), time.process_time()
    if prof:
        prof.enable()
    r = simulate(w, cost, sched, eng)
    if prof:
        prof.disable()
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0  # on a shared machine wall time includes waiting for a core
    rep = summarize(r)
    out = {"num_requests": a.num_requests, "rate": a.rate, "backends": a.backends, "model": a.model,
           "wall_s": wall, "cpu_s": cpu, "events": r.events, "events_per_s": r.events / wall,
           "events_per_cpu_s": r.events / cpu, "requests_per_s": a.num_requests / wall,
           "requests_per_cpu_s": a.num_requests / cpu, "simulated_s": r.sim_end,
           "prefix_caching": sched.prefix_caching_for(w), "steps": rep["steps"]["num_steps"], "mean_decode_seqs": rep["steps"]["mean_decode_seqs"],
           "ttft_p50_ms": rep["ttft_ms"]["p50"], "output_throughput": rep["output_throughput"]}
    if prof:
        st = pstats.Stats(prof)
        sched_time = sum(v[2] for k, v in st.stats.items() if "/scheduler/" in k[0])
        out["scheduler_self_time_share"] = sched_time / st.total_tt
    print(json.dumps(out, indent=2))
    if a.json_out:
        with open(a.json_out, "w") as fh:
            json.dump(out, fh, indent=2)
    return 0
