"""The simulated twin, workload seeds 0-9, unjittered: default vs normal_overtake_quantile
0.9 / 0.95 / 0.99 (sims.retry_after_bound.outcomes_over_seeds).

    python twin_seeds.py RATE OUT.json
"""
import argparse
import json
import sys
from dataclasses import replace

from sims.options import add_run_args, parse_with_config, spec_from_args
from sims.retry_after_bound import outcomes_over_seeds

rate, out_path = sys.argv[1], sys.argv[2]
p = argparse.ArgumentParser(); add_run_args(p)
a = parse_with_config(p, ["--step-ms", "20", "--max-num-seqs", "8", "--backends", "4", "--rate", rate,
    "--num-requests", "600", "--input-len", "32", "--output-len", "uniform:1:80",
    "--slo-ttft-ms", "fast=150,normal=400,slow=1000", "--placement", "ttft", "--waiting-by-class", "--slot-model"])
spec = spec_from_args(a); spec = replace(spec, scheduler=replace(spec.scheduler, admission=True))
out = {}
for name, adm in (("default", None), ("q0.9", {"normal_overtake_quantile": 0.9}),
                  ("q0.95", {"normal_overtake_quantile": 0.95}), ("q0.99", {"normal_overtake_quantile": 0.99})):
    o = outcomes_over_seeds(spec, range(10), adm)
    out[name] = o
    t = o["total"]
    print(rate, name, {c: (t[c]["refused"], t[c]["met"], t[c]["missed_by_10pct"]) for c in t},
          "per-seed normal misses", [o["per_seed"][s]["normal"]["missed_by_10pct"] for s in range(10)], flush=True)
with open(out_path, "w") as fh:
    json.dump(out, fh)
