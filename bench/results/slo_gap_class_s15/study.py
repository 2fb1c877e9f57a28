"""Issue 31, fifteenth session (H31C): admission's gap model on a class-ordered backend, with
and without projecting the higher classes' arrivals that pass a waiting request
(`AdmissionConfig.class_ordered`: W = ahead x gap / (1 - rate_h x gap)).

The harness of `bench/results/slo_gpu_model_s15/predict_next.py` (s13 33B H200 profile, CUDA
prefill cap 256 while decoding, one backend, placement prefix, 512 in, uniform:2:128 out,
fast=600,normal=3000,slow=10000, the engine Fast first: `--waiting-by-class`), 400 requests,
seeds 0-4 x rates 18, 20, 21.75, 24.45, 27 req/s, each run with admission under every variant
and once without (the control: the same schedule, everything admitted). Per run and class:
refusals, attainment (refused = missed), Fast TTFT p90 of the admitted, admitted missing by >
10%, admission's prediction / actual TTFT p50 of the admitted, the refusals whose request the
control run served within its deadline, and the Retry-After of the refused / their control wait.
Also the step-time sensitivity (every profiled step x 1.1 at the same rate) and a 1,200-request
run (a longer overload).

    .venv/bin/python bench/results/slo_gap_class_s15/study.py --out study.json > study.txt

Variants: `base` (the gap model as at 8c65965), `overtake` (class_ordered=True),
`overtake_h5` (class_ordered=True, overtake_horizon_s=5). The variants are applied to the
simulator's AdmissionConfig (sims.adapters) by keyword, so the script runs on any commit that
has the fields.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.abspath(os.path.join(HERE, "..", "..", "..")))  # this tree's modules
_spec = importlib.util.spec_from_file_location(
    "predict_next", os.path.join(HERE, "..", "slo_gpu_model_s15", "predict_next.py"))
pn = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pn)

from scheduler.admission import AdmissionConfig
from sims import adapters
from sims.runner import simulate_spec

VARIANTS = {"base": {"class_ordered": False},
            "overtake": {"class_ordered": True},
            "overtake_h5": {"class_ordered": True, "overtake_horizon_s": 5.0}}
RATES = (18.0, 20.0, 21.75, 24.45, 27.0)
SEEDS = (0, 1, 2, 3, 4)
NAMES = ("fast", "normal", "slow")


def with_variant(overrides: dict):
    """The simulator's AdmissionConfig with `overrides` on top of what it is given."""
    def make(**kw):
        return dataclasses.replace(AdmissionConfig(**kw), **overrides)
    return make


def simulate(rate: float, n: int, seed: int, variant: str | None, profile: str):
    pn.BASE[1] = profile
    adapters.AdmissionConfig = with_variant(VARIANTS[variant or "base"])
    return simulate_spec(pn.spec(True, rate, n, seed, variant is not None))


def measure(res, ctl) -> dict:
    w = res.workload
    ttft = res.first_token_time - w.arrival_time
    tc = ctl.first_token_time - ctl.workload.arrival_time
    cls = res.queue_class
    preds = res.extra.get("admission_predictions", {})
    ra = res.extra.get("retry_after_s", {})
    out = {"fast_ttft_p90_ms": None, "classes": {}}
    for c, name in enumerate(NAMES):
        m = cls == c
        ok = m & ~res.rejected & np.isfinite(ttft)
        met = ok & (ttft <= pn.TARGETS_S[c])
        ks = [k for k in np.flatnonzero(ok) if k in preds and ttft[k] > 0]
        ratio = [preds[k][0] / ttft[k] for k in ks]
        refused = np.flatnonzero(m & res.rejected)
        ctl_ok = [k for k in refused if np.isfinite(tc[k]) and tc[k] <= pn.TARGETS_S[c]]
        ra_ratio = [ra[k] / tc[k] for k in refused if k in ra and np.isfinite(tc[k]) and tc[k] > 0]
        out["classes"][name] = {
            "sent": int(m.sum()), "refused": len(refused),
            "refused_ctl_met": len(ctl_ok),
            "attainment": float(met.sum() / m.sum()) if m.any() else None,
            "ttft_p90_ms": float(np.percentile(ttft[ok], 90) * 1e3) if ok.any() else None,
            "missed_by_10pct": int((ok & (ttft > 1.1 * pn.TARGETS_S[c])).sum()),
            "pred_over_actual_p50": float(np.median(ratio)) if ratio else None,
            "pred_over_actual_p10_p90": ([float(np.percentile(ratio, 10)), float(np.percentile(ratio, 90))]
                                         if ratio else None),
            "retry_after_over_ctl_p50": float(np.median(ra_ratio)) if ra_ratio else None,
            "retry_after_within_25pct": (float(np.mean([abs(x - 1) <= 0.25 for x in ra_ratio]))
                                         if ra_ratio else None),
            "ctl_attainment": float((m & (tc <= pn.TARGETS_S[c])).sum() / m.sum()) if m.any() else None}
    out["fast_ttft_p90_ms"] = out["classes"]["fast"]["ttft_p90_ms"]
    return out


def row(label: str, rate: float, seed: int, r: dict) -> str:
    c = r["classes"]

    def f(x, fmt):
        return "-" if x is None else format(x, fmt)
    return (f"| {label} | {rate:.2f} | {seed} | {f(r['fast_ttft_p90_ms'], '.0f')} | "
            + " / ".join(f(100 * c[n]["attainment"], ".1f") for n in NAMES) + " | "
            + " / ".join(str(c[n]["refused"]) for n in NAMES) + " | "
            + str(c["slow"]["refused_ctl_met"]) + " | "
            + " / ".join(str(c[n]["missed_by_10pct"]) for n in NAMES) + " | "
            + " / ".join(f(c[n]["pred_over_actual_p50"], ".2f") for n in NAMES) + " | "
            + f(c["slow"]["retry_after_over_ctl_p50"], ".2f") + " | "
            + f(None if c["slow"]["retry_after_within_25pct"] is None
                else 100 * c["slow"]["retry_after_within_25pct"], ".0f") + " |")


HEAD = ("| variant | rate | seed | Fast TTFT p90 ms | attainment % F / N / S | refused F / N / S "
        "| Slow refused, control met | admitted missing > 10% F / N / S | pred / actual p50 F / N / S "
        "| Slow Retry-After / control wait p50 | within +-25% % |\n" + "|---" * 11 + "|")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None)
    p.add_argument("--variants", default=",".join(VARIANTS))
    a = p.parse_args(argv)
    import scheduler.admission
    print(f"scheduler.admission: {scheduler.admission.__file__}", file=sys.stderr)
    variants = a.variants.split(",")
    profile = pn.PROFILE
    scaled = pn.scaled_profile(1.1)
    out: dict = {"runs": []}
    print(HEAD)
    for rate in RATES:
        for seed in SEEDS:
            ctl = simulate(rate, 400, seed, None, profile)
            for v in variants:
                r = measure(simulate(rate, 400, seed, v, profile), ctl)
                r.update(variant=v, rate=rate, seed=seed, step_scale=1.0, n=400)
                out["runs"].append(r)
                print(row(v, rate, seed, r), flush=True)
    # step-time sensitivity: the same schedules on a backend 10% slower than the profile
    print("\n## every profiled step x 1.1, the same rates and seeds\n")
    print(HEAD)
    for rate in RATES:
        for seed in SEEDS:
            ctl = simulate(rate, 400, seed, None, scaled)
            for v in variants:
                r = measure(simulate(rate, 400, seed, v, scaled), ctl)
                r.update(variant=v, rate=rate, seed=seed, step_scale=1.1, n=400)
                out["runs"].append(r)
                print(row(v, rate, seed, r), flush=True)
    # a longer overload: 1,200 requests (seed 2, 24.45 req/s)
    print("\n## 1,200 requests, 24.45 req/s, seed 2\n")
    print(HEAD)
    pn_n = 1200
    ctl = simulate(24.45, pn_n, 2, None, profile)
    for v in variants:
        r = measure(simulate(24.45, pn_n, 2, v, profile), ctl)
        r.update(variant=v, rate=24.45, seed=2, step_scale=1.0, n=pn_n)
        out["runs"].append(r)
        print(row(v, 24.45, 2, r), flush=True)
    summary(out["runs"], variants)
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(out, fh, indent=1)
            fh.write("\n")
    return 0


def summary(runs: list[dict], variants: list[str]) -> None:
    print("\n## summary over seeds 0-4 x rates 18-27 (400 requests)\n")
    print("| variant | step x | Slow attainment mean / min / max / sd % | Slow refused (control met) "
          "| Slow pred / actual p50 (median of runs) | admitted missing > 10% (all) | Fast TTFT p90 max ms "
          "| Slow Retry-After / control wait p50 (median of runs) | within +-25% (all refusals) "
          "| Slow attainment change at step x 1.1: mean abs / max abs points |")
    print("|---" * 10 + "|")
    for scale in (1.0, 1.1):
        for v in variants:
            rs = [r for r in runs if r["variant"] == v and r["step_scale"] == scale and r["n"] == 400]
            if not rs:
                continue
            att = np.array([100 * r["classes"]["slow"]["attainment"] for r in rs])
            ref = sum(r["classes"]["slow"]["refused"] for r in rs)
            ref_ok = sum(r["classes"]["slow"]["refused_ctl_met"] for r in rs)
            po = np.median([r["classes"]["slow"]["pred_over_actual_p50"] for r in rs
                            if r["classes"]["slow"]["pred_over_actual_p50"] is not None])
            miss = sum(r["classes"][n]["missed_by_10pct"] for r in rs for n in NAMES)
            fast = max(r["fast_ttft_p90_ms"] for r in rs)
            rao = [r["classes"]["slow"]["retry_after_over_ctl_p50"] for r in rs
                   if r["classes"]["slow"]["retry_after_over_ctl_p50"] is not None]
            w25 = [(r["classes"]["slow"]["retry_after_within_25pct"], r["classes"]["slow"]["refused"])
                   for r in rs if r["classes"]["slow"]["retry_after_within_25pct"] is not None]
            within = (sum(x * n for x, n in w25) / sum(n for _, n in w25)) if w25 else None
            sens = ""
            if scale == 1.0:
                other = {(r["rate"], r["seed"]): r for r in runs
                         if r["variant"] == v and r["step_scale"] == 1.1 and r["n"] == 400}
                d = [abs(100 * (other[(r["rate"], r["seed"])]["classes"]["slow"]["attainment"]
                                - r["classes"]["slow"]["attainment"]))
                     for r in rs if (r["rate"], r["seed"]) in other]
                if d:
                    sens = f"{np.mean(d):.1f} / {np.max(d):.1f}"
            print(f"| {v} | {scale} | {att.mean():.1f} / {att.min():.1f} / {att.max():.1f} / {att.std():.1f} "
                  f"| {ref} ({ref_ok}) | {po:.2f} | {miss} | {fast:.0f} | "
                  f"{np.median(rao) if rao else float('nan'):.2f} | "
                  f"{'-' if within is None else f'{100 * within:.0f}%'} | {sens} |")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
