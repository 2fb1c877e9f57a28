"""Issue 31, s15 (H31C): the next H200 call of `scripts/gpu_slo_run.sh` (one 33B backend, Fast first,
400 requests, seed 2, fast=600,normal=3000,slow=10000) simulated with admission's gap model as
prepared (OVERTAKE=0, the default), with `--overtake` (OVERTAKE=1) and with a 5 s horizon
(OVERTAKE=1 OVERTAKE_HORIZON_S=5), at the profile as measured and x 1.124 (the s14 call's
burst: 14.55 req/s live against 16.35 simulated; the call now measures its own scale), at the
rates the live knee may give (1.5 x the knee: ~21.75 req/s predicted).

    .venv/bin/python bench/results/slo_gap_class_s15/next_call.py --out next_call.json > next_call.txt
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("study", os.path.join(HERE, "study.py"))
st = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(st)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    runs = []
    for scale in (1.124, 1.0):
        prof = st.pn.PROFILE if scale == 1.0 else st.pn.scaled_profile(scale)
        print(f"\n## profile x {scale}, seed 2, 400 requests\n")
        print(st.HEAD)
        for rate in (18.0, 20.0, 21.752, 24.0, 27.0):
            ctl = st.simulate(rate, 400, 2, None, prof)
            for v in st.VARIANTS:
                r = st.measure(st.simulate(rate, 400, 2, v, prof), ctl)
                r.update(variant=v, rate=rate, seed=2, step_scale=scale, n=400)
                runs.append(r)
                print(st.row(v, rate, 2, r), flush=True)
            c = st.measure(ctl, ctl)
            print(f"| control (no admission) | {rate:.2f} | 2 | {c['fast_ttft_p90_ms']:.0f} | "
                  + " / ".join(f"{100 * c['classes'][n]['attainment']:.1f}" for n in st.NAMES)
                  + " | | | | | | |")
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(runs, fh, indent=1)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
