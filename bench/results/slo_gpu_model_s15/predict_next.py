"""Issue 31, fifteenth session: what the next H200 call of `scripts/gpu_slo_run.sh` (33B preset,
one backend, as prepared at this session's HEAD) should measure, simulated before it runs, and
admission's predicted vs actual TTFT on the simulated 33B engine, FCFS against Fast first.

The call's steps, each simulated with the s13 33B H200 profile and the CUDA backend's default
prefill cap (256 tokens while decoding, small backlog), one backend, placement prefix:
1. capacity: a burst of 64 (seed 1) for the scale C0, then 120 requests at each of
   0.5, 0.75, 1.0, 1.15, 1.3, 1.45, 1.6, 1.8, 2 x C0 (seeds 11, 12, ...) up to the first rate whose TTFT
   p90 passes 2x the lowest's + 50 ms (bench.serving.rate_knee) -> C; rate 1.5 C
2. the admission run at that rate (400 requests, seed 2, targets fast=600,normal=3000,slow=10000)
   and the control run (the same schedule, no admission): Fast TTFT p90 of the admitted,
   attainment per class (refused = missed), refusals, admission's prediction / actual TTFT
Both with the engine FCFS (as on 2026-12-04) and Fast first (`--waiting-by-class`, the script's
default now); then the admission run at several rates and seeds (the live knee will differ from
the simulated one: the simulator ran the s14 call's capacity burst 12% faster than live).

    .venv/bin/python bench/results/slo_gpu_model_s15/predict_next.py --out predict_next.json
    .venv/bin/python bench/results/slo_gpu_model_s15/predict_next.py --step-scale 1.124 \
        --out predict_next_slow.json   # every profiled step 12.4% longer: the s14 call's burst
        # ran 14.55 req/s live against the simulator's 16.35 (repro_s14.py)
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from bench.serving.rate_knee import knee
from sims.options import add_run_args, parse_with_config, spec_from_args
from sims.runner import simulate_spec

PROFILE = "bench/results/fidelity_grid_h200_s13/33b-seeds/profile_33b-seeds.json"
BASE = ["--profile", PROFILE, "--max-prefill-tokens-while-decoding", "256", "--backends", "1",
        "--placement", "prefix", "--input-len", "512", "--output-len", "uniform:2:128"]
SLO = "fast=600,normal=3000,slow=10000"
TARGETS_S = (0.6, 3.0, 10.0)
SWEEP = (0.5, 0.75, 1.0, 1.15, 1.3, 1.45, 1.6, 1.8, 2.0)


def scaled_profile(scale: float) -> str:
    """The profile with every step time x `scale` (a temporary file)."""
    import tempfile
    with open(PROFILE) as fh:
        prof = json.load(fh)
    for point in prof["points"]:
        for k in list(point):
            if k.startswith("step_ms"):
                point[k] *= scale
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(prof, f)
    return f.name


def spec(by_class: bool, rate: float, n: int, seed: int, admission: bool):
    p = argparse.ArgumentParser()
    add_run_args(p)
    argv = BASE + ["--rate", str(rate), "--num-requests", str(n), "--seed", str(seed)]
    if by_class:
        argv.append("--waiting-by-class")
    if admission:
        argv += ["--slo-ttft-ms", SLO, "--admission"]
    return spec_from_args(parse_with_config(p, argv))


def run(by_class: bool, rate: float, n: int, seed: int, admission: bool) -> dict:
    res = simulate_spec(spec(by_class, rate, n, seed, admission))
    w = res.workload
    ttft = res.first_token_time - w.arrival_time
    cls = res.queue_class
    preds = res.extra.get("admission_predictions", {})
    out = {"rate": rate, "seed": seed, "ttft_p90_ms": float(np.nanpercentile(ttft, 90) * 1e3),
           "throughput": float(np.isfinite(res.finish_time).sum()
                               / (np.nanmax(res.finish_time) - w.arrival_time[0])),
           "classes": {}}
    for c, name in enumerate(("fast", "normal", "slow")):
        m = cls == c
        ok = m & ~res.rejected & np.isfinite(ttft)
        met = ok & (ttft <= TARGETS_S[c])
        ks = [k for k in np.flatnonzero(ok) if k in preds and ttft[k] > 0]
        ratio = [preds[k][0] / ttft[k] for k in ks]
        out["classes"][name] = {
            "sent": int(m.sum()), "refused": int((m & res.rejected).sum()),
            "ttft_p90_ms_admitted": float(np.percentile(ttft[ok], 90) * 1e3) if ok.any() else None,
            "attainment": float(met.sum() / m.sum()) if m.any() else None,
            "missed_by_10pct": int((ok & (ttft > 1.1 * TARGETS_S[c])).sum()),
            "pred_over_actual_p50": float(np.median(ratio)) if ratio else None,
            "abs_err_p50_s": float(np.median([abs(preds[k][0] - ttft[k]) for k in ks])) if ks else None}
    return out


def capacity(by_class: bool) -> tuple[float, list]:
    c0 = run(by_class, float("inf"), 64, 1, False)["throughput"]
    rows = []
    for k, f in enumerate(SWEEP):
        r = round(f * c0, 3)
        rows.append((r, run(by_class, r, 120, 11 + k, False)["ttft_p90_ms"]))
        cap, go_on = knee(rows)
        if not go_on:
            break
    return (cap if cap else round(0.5 * c0, 3)), [("burst64", c0)] + rows


def line(label: str, r: dict) -> str:
    c = r["classes"]
    return (f"| {label} | {r['rate']:.2f} | {r['seed']} | "
            + " | ".join(f"{c[n]['ttft_p90_ms_admitted']:.0f}" if c[n]["ttft_p90_ms_admitted"] else "-"
                         for n in ("fast", "normal", "slow"))
            + " | " + " / ".join(f"{100 * c[n]['attainment']:.1f}" for n in ("fast", "normal", "slow"))
            + " | " + " / ".join(str(c[n]["refused"]) for n in ("fast", "normal", "slow"))
            + " | " + " / ".join(str(c[n]["missed_by_10pct"]) for n in ("fast", "normal", "slow"))
            + " | " + " / ".join(f"{c[n]['pred_over_actual_p50']:.2f}" if c[n]["pred_over_actual_p50"] else "-"
                                 for n in ("fast", "normal", "slow")) + " |")


HEAD = ("| engine, run | rate | seed | Fast TTFT p90 ms | Normal p90 | Slow p90 | attainment % F / N / S "
        "| refused F / N / S | admitted missing by >10% F / N / S | admission pred / actual TTFT p50 F / N / S |\n"
        "|---|---|---|---|---|---|---|---|---|---|")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None)
    p.add_argument("--step-scale", type=float, default=1.0,
                   help="every profiled step time x this (a slower or faster backend)")
    a = p.parse_args(argv)
    if a.step_scale != 1.0:
        BASE[1] = scaled_profile(a.step_scale)
    out: dict = {}
    for by_class in (False, True):
        eng = "Fast first" if by_class else "FCFS"
        cap, rows = capacity(by_class)
        rate = round(1.5 * cap, 3)
        print(f"\n## engine {eng}: sweep " + ", ".join(f"{r}: {v:.0f} ms" if r != "burst64" else f"burst of 64: {v:.2f} req/s"
                                                       for r, v in rows) + f" -> capacity {cap} -> rate {rate}")
        print(HEAD)
        adm = run(by_class, rate, 400, 2, True)
        ctl = run(by_class, rate, 400, 2, False)
        print(line(f"{eng}, admission", adm))
        print(line(f"{eng}, control", ctl))
        out[eng] = {"sweep": rows, "capacity": cap, "rate": rate, "admission": adm, "control": ctl}
    # the admission run, Fast first, over rates around the predicted one and seeds 0-4
    print("\n## Fast first, admission on, by rate (seed 2) and seeds 0-4 at the predicted rate")
    print(HEAD)
    grid = []
    for rate in (18.0, 20.0, 21.822, 24.0, 27.0):
        r = run(True, rate, 400, 2, True)
        grid.append(r)
        print(line("Fast first, admission", r))
    for seed in (0, 1, 3, 4):
        r = run(True, out["Fast first"]["rate"], 400, seed, True)
        grid.append(r)
        print(line("Fast first, admission", r))
    out["grid"] = grid
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(out, fh, indent=2)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
