"""Issue 31, tenth session: how chaotic is ttft placement under sub-millisecond timing changes,
with each near-tie rule? A prediction of the live-vs-replay placement agreement, made in the
simulator alone.

    .venv/bin/python bench/results/slo_tie_s10/jitter_sim.py RUN_DIR...

For each run's live arrivals (decisions_a.jsonl: times, classes, lengths) the ninth session's
"read" replay (20 ms step, gateway per-Batch time, 0.5 ms wire, distinct prompts, 1.1 ms read)
runs twice, each step's time drawn 20 ms + N(0, SIGMA_MS) (0.3 ms: less than the live timing
jitter, step end -> read p10-p90 0.2-2.6 ms) with two different seeds, once per tie-break. Side a plays live (free
replay, jitter seed 1), side b the replay of a's log (jitter seed 2): the share of a's admitted
requests b places where a did with admission forced to a's decisions (the ninth session's
"placed as live"), the same decisions of that forced replay ("forced") and of b's free replay
("free"), and each side's refusals. TOL=0.25 sets PlacementConfig.ttft_tolerance, TIES=hash
the tie-breaks compared, FOLLOW=1 side b's forced replay follow a's placement too (the
"forced + live placement" analog), ADM='{"field": value}' override AdmissionConfig fields on
both sides.
"""
import functools
import gzip
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from scheduler.batcher import BatcherConfig
from scheduler.decisions import parse_records
from scheduler.placement import PlacementConfig
from scheduler.slo import SLOTargets
from scheduler.ttft_placement import _mix
from sims.adapters import SimSchedulerConfig
from sims.cost import ConstantCost
from sims.decision_replay import refused_ids, replay_run
from sims.event_loop import EngineConfig

GW_US = {"15.9": 500, "31.9": 560, "47.8": 870}
SIGMA_MS = float(os.environ.get("SIGMA_MS", "0.3"))
TOL = float(os.environ.get("TOL", "0.1"))  # PlacementConfig.ttft_tolerance
TIES = os.environ.get("TIES", "load,hash").split(",")
FOLLOW = os.environ.get("FOLLOW") == "1"  # side b follows a's placement too
# ADM='{"arrival_quantile": null}': AdmissionConfig overrides on both sides (what-if studies)
ADM = json.loads(os.environ.get("ADM", "{}"))
if ADM:
    import sims.adapters
    sims.adapters.AdmissionConfig = functools.partial(sims.adapters.AdmissionConfig, **ADM)


class JitterCost(ConstantCost):
    """A constant step plus jitter: a function of the step's shape (decoding sequences, prefill
    and context tokens) and a seed, so that repeated calls for one step agree; uniform in
    +-sqrt(3) sigma."""

    def __init__(self, seconds: float, sigma: float, seed: int) -> None:
        super().__init__(seconds, num_blocks=1 << 14)
        self.sigma, self.seed = sigma, seed

    def _f(self, n: int, p: int, ctx: int) -> float:
        u = _mix((self.seed << 48) ^ (int(n) << 32) ^ (int(p) << 20) ^ int(ctx)) / 2.0 ** 64
        return self.seconds + self.sigma * 3 ** 0.5 * (2 * u - 1)

    def step_time(self, num_decode_seqs, num_prefill_tokens, num_context_tokens) -> float:
        if not num_decode_seqs + num_prefill_tokens:
            return 0.0
        return self._f(num_decode_seqs, num_prefill_tokens, num_context_tokens)

    def decode_times(self, num_decode_seqs, num_context_tokens, k):
        if not num_decode_seqs:
            return np.zeros(k)
        return np.array([self._f(num_decode_seqs, 0, num_context_tokens + j * num_decode_seqs)
                         for j in range(k)])

    def decode_span(self, num_decode_seqs, num_context_tokens, k) -> float:
        return float(self.decode_times(num_decode_seqs, num_context_tokens, k).sum()) if k > 0 else 0.0

    def decode_step_times(self, num_decode_seqs, num_context_tokens):
        return np.array([self._f(n, 0, c) if n > 0 else 0.0
                         for n, c in zip(num_decode_seqs, num_context_tokens)])


def main() -> None:
    print("| run | load | tie-break | tolerance | placed alike (forced) | same decisions forced | "
          "free | refused a / b (free) |")
    print("|---|---|---|---|---|---|---|---|")
    for run in map(Path, sys.argv[1:]):
        rate = (run / "rate.txt").read_text().split()[-2]
        path = run / "decisions_a.jsonl"
        opener, p = (open, path) if path.exists() else (gzip.open, Path(str(path) + ".gz"))
        with opener(p, "rt") as fh:
            arrivals, _ = parse_records(fh)
        slo = SLOTargets.parse("fast=750,normal=1000,slow=1600", None)
        sched = SimSchedulerConfig(batcher=BatcherConfig(64, 600, 1, 0.8, False), slo=slo,
                                   admission=True, waiting_by_class=True, slot_model=True,
                                   max_num_seqs=8, enable_prefix_caching=True)
        ordered = sorted(arrivals, key=lambda r: r.t)
        for tie in TIES:
            eng = EngineConfig(num_samples=1, num_backends=4,
                               placement=PlacementConfig(policy="ttft", ttft_tie_break=tie,
                                                         ttft_tolerance=TOL),
                               network_delay_s=0.5e-3, gateway_message_s=GW_US[rate] / 1e6,
                               gateway_read_delay_s=1.1e-3)
            # side a, the "live" run: free, one jitter draw
            free_a, _ = replay_run(arrivals, sched, JitterCost(0.020, SIGMA_MS / 1e3, 1), eng)
            ra = refused_ids(free_a, arrivals)
            ba = free_a.extra["backend_of"]
            log_a = [replace(r, refused=r.request_id in ra) for r in arrivals]
            # side b, the "replay": another draw, admission forced to a's decisions
            follow = ({r.request_id: int(ba[i]) for i, r in enumerate(ordered)}
                      if FOLLOW else None)
            forced_b, _ = replay_run(log_a, sched, JitterCost(0.020, SIGMA_MS / 1e3, 2), eng,
                                     forced=True, backends=follow)
            rb = refused_ids(forced_b, arrivals)
            bb = forced_b.extra["backend_of"]
            free_b, _ = replay_run(arrivals, sched, JitterCost(0.020, SIGMA_MS / 1e3, 2), eng)
            rfb = refused_ids(free_b, arrivals)
            n = len(ordered)
            adm = [i for i, r in enumerate(ordered) if r.request_id not in ra]
            placed = sum(1 for i in adm if ba[i] == bb[i])
            same_f = sum(1 for r in ordered if (r.request_id in ra) == (r.request_id in rb))
            same = sum(1 for r in ordered if (r.request_id in ra) == (r.request_id in rfb))
            print(f"| {run.name} | {rate} | {tie} | {TOL:g} | {100 * placed / len(adm):.0f}% | "
                  f"{100 * same_f / n:.1f}% | {100 * same / n:.1f}% | {len(ra)} / {len(rfb)} |",
                  flush=True)

if __name__ == "__main__":
    main()
