"""`tidegate sim window`: the batching window's defaults, chosen by simulation across loads.

`sim search` ranks configurations for one workload; a default must serve every load a
deployment sees. This runs the same simulator over a grid of (target_throughput,
min_latency_ms) for several workloads (rates below, at and past a backend's capacity) with the
measured per-message cost (`--message-cost-us`: what a window saves), and picks the cell that

1. keeps goodput within `--goodput-tolerance` (default 1%) of the best cell at every workload, and
2. among those, has the lowest mean over workloads of TTFT p99 / the best cell's TTFT p99
   (ties: the larger mean window, then the larger target).

Every cell's figures (and the mean window size beside each) are printed and written as JSON,
so the choice can be re-derived; docs/window_defaults.md keeps the output the defaults came from.

One default serves every deployment, and the presets disagree (a CPU backend's steps are long and
its messages dear, so it wants long windows; an H200 serving 6.7B answers in tens of ms, where
10 ms of window shows in TTFT p99). `--combine A.json B.json ...` reads several searches' outputs
and picks, among the cells whose worst TTFT p99 / best over every workload stays within
`--p99-cap` (default 1.3), the one with the best worst-case goodput / best (ties: lower mean p99
ratio).

    tidegate sim window --profile PROFILE.json --workloads 40:32:16,80:32:16,110:32:16 \\
        --message-cost-us 350,250 --slo-ttft-ms 500 --json out.json
"""
from __future__ import annotations

import argparse
import itertools
import math
from dataclasses import replace

from sims.options import add_run_args, parse_list, parse_with_config, spec_from_args
from sims.runner import RunSpec
from sims.sweep import run_many
from sims.workload import LengthSpec


def parse_workloads(text: str) -> list[tuple[float, int, int]]:
    """'RATE:IN:OUT,...' -> [(rate, input tokens, output tokens)]."""
    out = []
    for part in text.split(","):
        rate, n_in, n_out = part.split(":")
        out.append((float(rate), int(n_in), int(n_out)))
    if not out:
        raise ValueError("--workloads needs at least one RATE:IN:OUT")
    return out


def build(base: RunSpec, workloads: list[tuple[float, int, int]], targets: list[float],
          latencies: list[float]) -> list[tuple[tuple, RunSpec]]:
    cells = []
    for (rate, n_in, n_out), target, ml in itertools.product(workloads, targets, latencies):
        w = replace(base.workload, rate=rate, input_len=LengthSpec.parse(str(n_in)),
                    output_len=LengthSpec.parse(str(n_out)))
        spec = replace(base, workload=w).with_batcher(target_throughput=target, min_latency_ms=ml)
        cells.append(((rate, n_in, n_out, target, ml), spec))
    return cells


def choose(rows: list[dict], tolerance: float) -> dict:
    """The rule in the module doc, over rows {workload, target, min_latency_ms, goodput,
    ttft_p99_ms, mean_window}; returns {"target_throughput", "min_latency_ms", "cells": ...}."""
    by_w: dict[tuple, list[dict]] = {}
    for r in rows:
        by_w.setdefault(r["workload"], []).append(r)
    best_good = {w: max(r["goodput"] for r in rs) for w, rs in by_w.items()}
    best_p99 = {w: min(r["ttft_p99_ms"] for r in rs) for w, rs in by_w.items()}
    cells: dict[tuple, dict] = {}
    for r in rows:
        key = (r["target_throughput"], r["min_latency_ms"])
        c = cells.setdefault(key, {"target_throughput": key[0], "min_latency_ms": key[1],
                                   "ok": True, "p99_ratio": 0.0, "mean_window": 0.0, "n": 0})
        w = r["workload"]
        if r["goodput"] < (1 - tolerance) * best_good[w]:
            c["ok"] = False
        c["p99_ratio"] += r["ttft_p99_ms"] / max(best_p99[w], 1e-9)
        c["mean_window"] += r["mean_window"]
        c["n"] += 1
    for c in cells.values():
        c["p99_ratio"] /= c["n"]
        c["mean_window"] /= c["n"]
    ranked = sorted(cells.values(), key=lambda c: (not c["ok"], round(c["p99_ratio"], 3),
                                                   -c["mean_window"], -c["target_throughput"]))
    return {**{k: ranked[0][k] for k in ("target_throughput", "min_latency_ms")},
            "ranked": ranked}


def choose_across(rows: list[dict], p99_cap: float) -> dict:
    """The `--combine` rule (module doc) over rows of several searches (workload names unique)."""
    by_w: dict[str, list[dict]] = {}
    for r in rows:
        by_w.setdefault(r["workload"], []).append(r)
    best_good = {w: max(r["goodput"] for r in rs) for w, rs in by_w.items()}
    best_p99 = {w: min(r["ttft_p99_ms"] for r in rs) for w, rs in by_w.items()}
    cells: dict[tuple, dict] = {}
    for r in rows:
        key = (r["target_throughput"], r["min_latency_ms"])
        c = cells.setdefault(key, {"target_throughput": key[0], "min_latency_ms": key[1],
                                   "worst_goodput": math.inf, "worst_p99": 0.0, "p99": []})
        w = r["workload"]
        c["worst_goodput"] = min(c["worst_goodput"], r["goodput"] / max(best_good[w], 1e-12))
        ratio = r["ttft_p99_ms"] / max(best_p99[w], 1e-9)
        c["worst_p99"] = max(c["worst_p99"], ratio)
        c["p99"].append(ratio)
    for c in cells.values():
        c["mean_p99"] = sum(c.pop("p99")) / len(by_w)
        c["ok"] = c["worst_p99"] <= p99_cap
    ranked = sorted(cells.values(), key=lambda c: (not c["ok"], -round(c["worst_goodput"], 3),
                                                   c["mean_p99"]))
    return {**{k: ranked[0][k] for k in ("target_throughput", "min_latency_ms")},
            "ranked": ranked}


def combine_main(paths: list[str], p99_cap: float) -> int:
    import json
    rows = []
    for path in paths:
        with open(path) as fh:
            for r in json.load(fh)["rows"]:
                rows.append({**r, "workload": f"{path}:{r['workload']}"})
    out = choose_across(rows, p99_cap)
    print(f"{'target':>8}{'win ms':>7}{'worst goodput':>14}{'worst p99':>10}{'mean p99':>9}"
          f"{'p99 ok':>7}   (ratios to the best cell of each workload, over {len(paths)} searches)")
    for c in out["ranked"]:
        print(f"{c['target_throughput']:>8g}{c['min_latency_ms']:>7g}{c['worst_goodput']:>14.3f}"
              f"{c['worst_p99']:>10.3f}{c['mean_p99']:>9.3f}{'yes' if c['ok'] else 'no':>7}")
    print(f"\nchosen: target_throughput={out['target_throughput']:g} "
          f"min_latency_ms={out['min_latency_ms']:g}")
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--combine":
        cap = 1.3
        paths = argv[1:]
        if "--p99-cap" in paths:
            i = paths.index("--p99-cap")
            cap, paths = float(paths[i + 1]), paths[:i] + paths[i + 2:]
        return combine_main(paths, cap)
    p = argparse.ArgumentParser(prog="tidegate sim window",
                                description="choose the batching window's defaults across loads")
    add_run_args(p, num_requests=2000)
    p.add_argument("--workloads", required=True, help="RATE:IN:OUT,... (one backend count: "
                   "--backends)")
    p.add_argument("--target-throughput-grid", default="8000,4000,2000,1000,500,250")
    p.add_argument("--min-latency-ms-grid", default="2,5,10")
    p.add_argument("--goodput-tolerance", type=float, default=0.01)
    p.add_argument("--jobs", type=int)
    a = parse_with_config(p, argv)
    base = spec_from_args(a)
    cells = build(base, parse_workloads(a.workloads), parse_list(a.target_throughput_grid),
                  parse_list(a.min_latency_ms_grid))
    reports = run_many([s for _, s in cells], a.jobs)
    rows = []
    for (key, _), rep in zip(cells, reports):
        rate, n_in, n_out, target, ml = key
        rows.append({"workload": f"{rate:g}:{n_in}:{n_out}", "target_throughput": target,
                     "min_latency_ms": ml, "goodput": rep["goodput"],
                     "request_throughput": rep["request_throughput"],
                     "ttft_p50_ms": rep["ttft_ms"]["p50"], "ttft_p99_ms": rep["ttft_ms"]["p99"],
                     "tpot_p50_ms": rep["tpot_ms"]["p50"],
                     "mean_window": rep["batch_size"]["mean"],
                     "num_windows": rep["batch_size"]["num_batches"]})
    out = choose(rows, a.goodput_tolerance)
    print(f"{'workload':>14}{'target':>8}{'win ms':>7}{'goodput':>9}{'TTFT p50':>10}"
          f"{'TTFT p99':>10}{'TPOT p50':>10}{'window':>8}")
    for r in rows:
        print(f"{r['workload']:>14}{r['target_throughput']:>8g}{r['min_latency_ms']:>7g}"
              f"{r['goodput']:>9.2f}{r['ttft_p50_ms']:>10.2f}{r['ttft_p99_ms']:>10.2f}"
              f"{r['tpot_p50_ms']:>10.2f}{r['mean_window']:>8.2f}")
    print(f"\n{'target':>8}{'win ms':>7}{'goodput ok':>11}{'TTFT p99 / best':>16}{'mean window':>12}")
    for c in out["ranked"]:
        print(f"{c['target_throughput']:>8g}{c['min_latency_ms']:>7g}{'yes' if c['ok'] else 'no':>11}"
              f"{c['p99_ratio']:>16.3f}{c['mean_window']:>12.2f}")
    print(f"\nchosen: target_throughput={out['target_throughput']:g} "
          f"min_latency_ms={out['min_latency_ms']:g}")
    if a.json_out:
        import json
        with open(a.json_out, "w") as fh:
            json.dump({"config": base.describe(), "rows": rows, **out}, fh, indent=2)
            fh.write("\n")
    return 0
