"""Issue 31, sixth session: the admitted misses by > 10% in the warm-up (arrived in the first
2.2 s) and after, per class, over workload seeds, for the tree in the current directory (run it
from the repository root, or from a `git archive` of another commit, for before/after):

    .venv/bin/python bench/results/slo_slots_known_s6/warmup.py [--seeds 0-9] [--rate 47.8]
        [--admission-config FIELD=V,...] [--json OUT]

The workload and settings are the fifth session's benchmark (BENCHMARKS, issue 31), the
simulated twin of `scripts/gpu_slo_run.sh` with RATE=47.8 MODEL=echo ECHO_STEP_MS=20
MAX_NUM_SEQS=8 BACKENDS=4.
"""
import argparse
import json
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.getcwd())

from scheduler.classes import CLASS_NAMES
from sims.options import add_run_args, parse_with_config, spec_from_args
from sims.retry_after_bound import base_run, parse_admission

ARGS = ["--step-ms", "20", "--placement", "ttft", "--max-num-seqs", "8", "--waiting-by-class",
        "--slot-model", "--backends", "4", "--num-requests", "600", "--input-len", "32",
        "--output-len", "uniform:1:80", "--slo-ttft-ms", "fast=150,normal=400,slow=1000"]
WARMUP_S = 2.2


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0-9")
    ap.add_argument("--rate", default="47.8")
    ap.add_argument("--admission-config", default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    lo, _, hi = a.seeds.partition("-")
    seeds = range(int(lo), int(hi or lo) + 1)
    adm = parse_admission(a.admission_config) if a.admission_config else None
    p = argparse.ArgumentParser()
    add_run_args(p, num_requests=600)
    tot = {name: {"sent": 0, "refused": 0, "met": 0, "admitted": 0, "miss": 0, "miss_warm": 0,
                  "admitted_warm": 0} for name in CLASS_NAMES}
    rows = []
    for seed in seeds:
        spec = spec_from_args(parse_with_config(p, ARGS + ["--rate", a.rate, "--seed", str(seed)]))
        spec = replace(spec, scheduler=replace(spec.scheduler, admission=True))
        base = base_run(spec, adm)
        arr, ft = base.workload.arrival_time, base.result.first_token_time
        for j, c in enumerate(base.classes):
            t = tot[CLASS_NAMES[c]]
            t["sent"] += 1
            if j in base.retry_after_s:
                t["refused"] += 1
                continue
            target = spec.scheduler.slo.ttft_s(c, None)
            ttft = float(ft[j] - arr[j])
            warm = float(arr[j]) < WARMUP_S
            t["admitted"] += 1
            t["admitted_warm"] += warm
            t["met"] += ttft <= target
            if ttft > 1.1 * target:
                t["miss"] += 1
                t["miss_warm"] += warm
                rows.append({"seed": seed, "i": j, "cls": CLASS_NAMES[c], "arrival_s": float(arr[j]),
                             "ttft_s": ttft, "target_s": target})
    all_adm = sum(t["admitted"] for t in tot.values())
    all_miss = sum(t["miss"] for t in tot.values())
    warm_adm = sum(t["admitted_warm"] for t in tot.values())
    warm_miss = sum(t["miss_warm"] for t in tot.values())
    print(f"seeds {a.seeds} rate {a.rate} admission {a.admission_config or 'default'}")
    for name, t in tot.items():
        print(f"{name:7s} sent {t['sent']:5d} refused {t['refused']:4d} met {t['met']:5d} "
              f"({100 * t['met'] / t['sent']:.1f}%)  admitted missing > 10% {t['miss']}/{t['admitted']}"
              f"  of them arrived < {WARMUP_S} s: {t['miss_warm']}/{t['admitted_warm']}")
    print(f"all     admitted missing > 10% {all_miss}/{all_adm} ({100 * all_miss / all_adm:.2f}%); "
          f"arrived < {WARMUP_S} s {warm_miss}/{warm_adm}; after {all_miss - warm_miss}/{all_adm - warm_adm}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"seeds": a.seeds, "rate": a.rate, "admission": a.admission_config,
                       "total": tot, "misses": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
