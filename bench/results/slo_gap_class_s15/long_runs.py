"""Issue 31, s15 (H31C): the variants of `study.py` in longer overloads (1,200 requests: ~50-60 s
of arrivals, where the Fast and Normal arrivals do not stop while a Slow request waits), seeds
0-4 at 20 and 24.45 req/s; the same measures.

    .venv/bin/python bench/results/slo_gap_class_s15/long_runs.py --out long_runs.json > long_runs.txt
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("study", os.path.join(HERE, "study.py"))
st = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(st)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None)
    p.add_argument("--variants", default=",".join(st.VARIANTS))
    p.add_argument("--n", type=int, default=1200)
    a = p.parse_args(argv)
    variants = a.variants.split(",")
    runs = []
    print(st.HEAD)
    for rate in (20.0, 24.45):
        for seed in st.SEEDS:
            ctl = st.simulate(rate, a.n, seed, None, st.pn.PROFILE)
            for v in variants:
                r = st.measure(st.simulate(rate, a.n, seed, v, st.pn.PROFILE), ctl)
                r.update(variant=v, rate=rate, seed=seed, n=a.n)
                runs.append(r)
                print(st.row(v, rate, seed, r), flush=True)
    print(f"\n## totals over seeds 0-4 ({a.n} requests)\n")
    print("| variant | rate | Slow sent | Slow met (control met) | Slow refused (control met) | Slow admitted "
          "| Slow admitted missing > 10% | all admitted missing > 10% | Slow pred / actual p50 (median of runs) "
          "| Fast TTFT p90 max ms | Fast / Normal refused |")
    print("|---" * 11 + "|")
    for rate in (20.0, 24.45):
        for v in variants:
            rs = [r for r in runs if r["variant"] == v and r["rate"] == rate]
            s = [r["classes"]["slow"] for r in rs]
            sent = sum(x["sent"] for x in s)
            met = sum(round(x["attainment"] * x["sent"]) for x in s)
            cmet = sum(round(x["ctl_attainment"] * x["sent"]) for x in s)
            ref = sum(x["refused"] for x in s)
            po = np.median([x["pred_over_actual_p50"] for x in s if x["pred_over_actual_p50"] is not None])
            miss_all = sum(r["classes"][n]["missed_by_10pct"] for r in rs for n in st.NAMES)
            print(f"| {v} | {rate} | {sent} | {met} ({cmet}) | {ref} ({sum(x['refused_ctl_met'] for x in s)}) "
                  f"| {sent - ref} | {sum(x['missed_by_10pct'] for x in s)} | {miss_all} | {po:.2f} "
                  f"| {max(r['fast_ttft_p90_ms'] for r in rs):.0f} "
                  f"| {sum(r['classes']['fast']['refused'] for r in rs)} / "
                  f"{sum(r['classes']['normal']['refused'] for r in rs)} |")
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(runs, fh, indent=1)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
