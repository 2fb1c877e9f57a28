"""Issue 31, ninth session: AdmissionConfig.compete_window off / on in the simulator, 4 x 8 slots x
20 ms, placement by predicted TTFT, outputs uniform 1-80, 600 requests, workload seeds 0..N-1
(sims.retry_after_bound.outcomes_over_seeds: per class sent, refused, met, admitted missing by
> 10%).

    .venv/bin/python bench/results/slo_read_s9/compete_window_sim.py RATE default|600 [SEEDS]

"default": the default window (5 ms, idle flush), TTFT targets 150/400/1000 ms; "600": the
fidelity runs' 600 ms windows, no idle flush, targets 750/1000/1600 ms.
"""
import argparse
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.getcwd())
from sims.options import add_run_args, parse_with_config, spec_from_args
from sims.retry_after_bound import outcomes_over_seeds

rate, window = sys.argv[1], sys.argv[2]
seeds = range(int(sys.argv[3]) if len(sys.argv) > 3 else 10)
p = argparse.ArgumentParser()
add_run_args(p)
args = ["--step-ms", "20", "--max-num-seqs", "8", "--backends", "4", "--rate", rate,
        "--num-requests", "600", "--input-len", "32", "--output-len", "uniform:1:80",
        "--placement", "ttft", "--waiting-by-class", "--slot-model"]
if window == "600":
    args += ["--slo-ttft-ms", "fast=750,normal=1000,slow=1600", "--target-throughput", "1",
             "--min-latency-ms", "600", "--no-idle-flush"]
else:
    args += ["--slo-ttft-ms", "fast=150,normal=400,slow=1000"]
spec = spec_from_args(parse_with_config(p, args))
spec = replace(spec, scheduler=replace(spec.scheduler, admission=True))
for cw in (False, True):
    t = outcomes_over_seeds(spec, seeds, {"compete_window": cw})["total"]
    print(rate, window, "compete_window", cw, {c: t[c] for c in ("fast", "normal", "slow")})
