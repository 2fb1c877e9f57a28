"""Issue 31, seventh session: how the contested free slot's wait given the loss compares with
the simulator's outcome. In a run with the rule off (`compete_steps=0`: the decisions as
before), every Slow admission check that found a free slot also computes what the rule would
(`compete_steps=1`, phase on): the waits over the 64 futures given the loss. For the Slow
requests that then lost the slot (TTFT > 60 ms; a free slot starts in ~35 ms) it prints where
their wait (TTFT - 40 ms) falls among those futures (uniform if the model were calibrated) and
the medians. Run from the repository root:

    .venv/bin/python bench/results/slo_compete_s7/lost_slot_waits.py RATE NUM_SEEDS
"""
import argparse
import os
import sys
from dataclasses import replace

import numpy as np

sys.path.insert(0, os.getcwd())

from scheduler import admission as A
from sims.options import add_run_args, parse_with_config, spec_from_args
from sims.retry_after_bound import base_run

ARGS = ["--step-ms", "20", "--placement", "ttft", "--max-num-seqs", "8", "--waiting-by-class",
        "--slot-model", "--backends", "4", "--num-requests", "600", "--input-len", "32",
        "--output-len", "uniform:1:80", "--slo-ttft-ms", "fast=150,normal=400,slow=1000"]
futures: list[float] = []   # the current check's waits given the loss
capture = [False]
orig_run, orig_cw, orig_sw = A.WaitPredictor._slot_run, A.WaitPredictor._contested_wait, A.WaitPredictor._slot_wait


def slot_run(self, run, now, thr):
    w = orig_run(self, run, now, thr)
    if capture[0]:
        futures.append(w)
    return w


def contested(self, *a):
    capture[0] = True
    orig_cw(self, *a)
    capture[0] = False
    return 0.0  # the decision as with the rule off


def slot_wait(self, be, cls, extra, now, quantile=None):
    w = orig_sw(self, be, cls, extra, now, quantile)
    if quantile is not None and w == 0.0:
        cfg = self.config
        self.config = replace(cfg, compete_steps=1.0, compete_phase=True)
        orig_sw(self, be, cls, extra, now, quantile)
        self.config = cfg
    return w


def main() -> None:
    rate, n = sys.argv[1], int(sys.argv[2])
    A.WaitPredictor._slot_run = slot_run
    A.WaitPredictor._contested_wait = contested
    A.WaitPredictor._slot_wait = slot_wait
    orig_check = A.AdmissionControl.check
    rows = []
    for seed in range(n):
        p = argparse.ArgumentParser()
        add_run_args(p, num_requests=600)
        spec = spec_from_args(parse_with_config(p, ARGS + ["--rate", rate, "--seed", str(seed)]))
        spec = replace(spec, scheduler=replace(spec.scheduler, admission=True))
        info: dict = {}

        def check(self, cls, *a, _info=info, **kw):
            futures.clear()
            r = orig_check(self, cls, *a, **kw)
            _info[len(_info)] = (cls, r is None, sorted(futures))
            return r
        A.AdmissionControl.check = check
        base = base_run(spec, {"compete_steps": 0.0})
        A.AdmissionControl.check = orig_check
        ttft = base.result.first_token_time - base.workload.arrival_time
        rows += [(float(ttft[j]), w) for j, (c, adm, w) in info.items() if c == 2 and adm and len(w) == 64]
    lost = [(t, w) for t, w in rows if t > 0.06]
    print(f"rate {rate}, seeds 0-{n - 1}: admitted Slow checks with a free slot contested {len(rows)}, "
          f"lost the slot {len(lost)}")
    if lost:
        pit = [np.searchsorted(w, t - 0.04) / 64 for t, w in lost]
        print("where their wait falls among the futures given the loss, p10/p25/p50/p75/p90:",
              np.round(np.quantile(pit, [0.1, 0.25, 0.5, 0.75, 0.9]), 2))
        print(f"median wait given the loss: model {np.median([w[32] for _, w in lost]):.3f} s, "
              f"simulated {np.median([t - 0.04 for t, _ in lost]):.3f} s")


if __name__ == "__main__":
    main()
