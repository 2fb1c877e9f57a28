"""Issue 31, s17 (H31D): the simulated twin of the live benchmark (s16's simrun.py: 4 echo-like
backends x 8 slots x 20 ms, placement by predicted TTFT, Fast first, slot model, 47.8 req/s,
600 requests) with and without the backends' deadline order (scheduler.deadline_order): per
class sent / refused / admitted missing by > 10%, Fast TTFT p90 of the admitted, and
(--probes) every refusal sent anyway in its own world: Retry-After within +-25% of that wait.

    PYTHONPATH=. python bench/results/slo_deadline_s17/simrun.py OUT.json VARIANT ... \
        [--sigma-ms 0.3 --repeats 10 --seeds 2 --probes]
    VARIANT: name or name:FLAGS with FLAGS the simulator's flags joined by '+', e.g.
    default, do100:--deadline-order+--deadline-lead-ms+100
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "slo_cpu_s15"))
sys.path.insert(0, os.path.join(HERE, "..", "slo_misses_s16"))
from jitter_repeats import DEFAULT, JitterSpec
from simrun import one

from scheduler.classes import CLASS_NAMES
from sims.options import add_run_args, parse_with_config, spec_from_args


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("variants", nargs="+")
    ap.add_argument("--sigma-ms", type=float, default=0.3)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--seeds", default="2")
    ap.add_argument("--rate", type=float, default=47.8)
    ap.add_argument("--probes", action="store_true")
    a = ap.parse_args()
    base_args = list(DEFAULT)
    base_args[base_args.index("--rate") + 1] = str(a.rate)
    res = {"argv": base_args, "sigma_ms": a.sigma_ms, "repeats": a.repeats, "seeds": a.seeds,
           "variants": {}}
    t0 = time.perf_counter()
    for v in a.variants:
        name, _, flags = v.partition(":")
        extra = [f for f in flags.split("+") if f]
        p = argparse.ArgumentParser()
        add_run_args(p, num_requests=600)
        spec0 = spec_from_args(parse_with_config(p, base_args + extra))
        spec0 = replace(spec0, scheduler=replace(spec0.scheduler, admission=True))
        rows = []
        for seed in [int(s) for s in a.seeds.split(",")]:
            for rep in range(1, a.repeats + 1):
                sp = replace(spec0, workload=replace(spec0.workload, seed=seed))
                if a.sigma_ms > 0:
                    sp = replace(sp, cost=JitterSpec(sp.cost, a.sigma_ms / 1e3, rep))
                o = one(sp, {}, a.probes)
                o["seed"], o["repeat"] = seed, rep
                rows.append(o)
        tot = {}
        for c in CLASS_NAMES:
            tot[c] = {k: sum(r[c][k] for r in rows) for k in ("sent", "refused", "met", "missed_by_10pct")}
            tot[c]["ttft_p90_ms_runs"] = [round(r[c]["ttft_p90_ms"] or 0, 1) for r in rows]
            if a.probes:
                tot[c]["ra_hits"] = [sum(r["ra_hits"][c][0] for r in rows),
                                     sum(r["ra_hits"][c][1] for r in rows)]
        res["variants"][name] = {"flags": extra, "total": tot, "runs": rows}
        line = " | ".join(f"{c}: ref {tot[c]['refused']}/{tot[c]['sent']} miss {tot[c]['missed_by_10pct']}"
                          + (f" RA {tot[c]['ra_hits'][0]}/{tot[c]['ra_hits'][1]}" if a.probes else "")
                          for c in CLASS_NAMES)
        fp90 = tot["fast"]["ttft_p90_ms_runs"]
        print(f"{name}: {line} | Fast p90 max {max(fp90):.0f} mean {sum(fp90) / len(fp90):.0f} ms "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    with open(a.out, "w") as fh:
        json.dump(res, fh)


if __name__ == "__main__":
    main()
