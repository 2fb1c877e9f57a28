"""Issue 31, s16 (H31M): the simulator's twin of the live benchmark (4 echo-like backends x 8
slots x 20 ms, placement by predicted TTFT, Fast first, slot model, 47.8 req/s, 600 requests,
seed 2) under admission variants: per class sent / refused / admitted missing by > 10%, Fast
TTFT p90 of the admitted, and (--probes) every refusal sent anyway in its own world (the
simulated probe): Retry-After within +-25% of that wait, per class.

    python simrun.py OUT.json VARIANT ... [--sigma-ms 0.3 --repeats 10 --seeds 2 --probes]
    VARIANT: name or name:field=value,field=value (AdmissionConfig fields)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "slo_cpu_s15"))
from jitter_repeats import DEFAULT, JitterSpec

from scheduler.classes import CLASS_NAMES
from sims.options import add_run_args, parse_with_config, spec_from_args
from sims.retry_after_bound import (
    admission_outcome,
    base_run,
    fork_wait,
    parse_admission,
)


def one(spec, adm, probes):
    base = base_run(spec, adm)
    out = admission_outcome(spec, base)
    res = base.result
    miss_idx = []
    for j, c in enumerate(base.classes):
        if j in base.retry_after_s:
            continue
        t = float(res.first_token_time[j] - base.workload.arrival_time[j])
        tgt = spec.scheduler.slo.ttft_s(c, None)
        if t > 1.1 * tgt:
            miss_idx.append((j, c, round(t / tgt, 3)))
    out["misses"] = miss_idx
    if probes:
        hits = {n: [] for n in CLASS_NAMES}
        for i in sorted(base.retry_after_s):
            w, _ = fork_wait(spec, base, i, None, adm)
            r = base.retry_after_s[i]
            hits[CLASS_NAMES[base.classes[i]]].append(abs(r / w - 1) <= 0.25 + 1e-12)
        out["ra_hits"] = {n: [int(sum(v)), len(v)] for n, v in hits.items()}
    return out


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
    p = argparse.ArgumentParser()
    add_run_args(p, num_requests=600)
    base_args = [x for x in DEFAULT]
    base_args[base_args.index("--rate") + 1] = str(a.rate)
    spec0 = spec_from_args(parse_with_config(p, base_args))
    spec0 = replace(spec0, scheduler=replace(spec0.scheduler, admission=True))
    res = {"argv": base_args, "sigma_ms": a.sigma_ms, "repeats": a.repeats, "seeds": a.seeds,
           "variants": {}}
    t0 = time.perf_counter()
    for v in a.variants:
        name, _, cfg = v.partition(":")
        # "qn=Q": AdmissionConfig.normal_overtake_quantile = Q; "fleet=1": fleet_arrival_rate
        # (first run as a monkeypatch of WaitPredictor.higher_rate, the same figures)
        cfg = cfg.replace("qn=", "normal_overtake_quantile=").replace("fleet=1", "fleet_arrival_rate=true")
        adm = parse_admission(cfg)
        rows = []
        for seed in [int(s) for s in a.seeds.split(",")]:
            for rep in range(1, a.repeats + 1):
                sp = replace(spec0, workload=replace(spec0.workload, seed=seed))
                if a.sigma_ms > 0:
                    sp = replace(sp, cost=JitterSpec(sp.cost, a.sigma_ms / 1e3, rep))
                o = one(sp, adm, a.probes)
                o["seed"], o["repeat"] = seed, rep
                rows.append(o)
        tot = {}
        for c in CLASS_NAMES:
            tot[c] = {k: sum(r[c][k] for r in rows) for k in ("sent", "refused", "met", "missed_by_10pct")}
            tot[c]["ttft_p90_ms_runs"] = [round(r[c]["ttft_p90_ms"] or 0, 1) for r in rows]
            if a.probes:
                tot[c]["ra_hits"] = [sum(r["ra_hits"][c][0] for r in rows), sum(r["ra_hits"][c][1] for r in rows)]
        res["variants"][name] = {"admission": adm, "total": tot, "runs": rows}
        line = " | ".join(f"{c}: ref {tot[c]['refused']}/{tot[c]['sent']} miss {tot[c]['missed_by_10pct']}"
                          + (f" RA {tot[c]['ra_hits'][0]}/{tot[c]['ra_hits'][1]}" if a.probes else "")
                          for c in CLASS_NAMES)
        fp90 = tot["fast"]["ttft_p90_ms_runs"]
        print(f"{name}: {line} | Fast p90 max {max(fp90):.0f} ms ({time.perf_counter() - t0:.0f} s)", flush=True)
    with open(a.out, "w") as fh:
        json.dump(res, fh)


if __name__ == "__main__":
    main()
