"""Issue 31, fifteenth session: the simulator's prediction of how much a refused Slow request's
wait moves between repeated runs of the SAME schedule (same arrivals, same lengths: the future
is fixed), when only the backends' step times jitter by sub-millisecond amounts.

    .venv/bin/python bench/results/slo_cpu_s15/jitter_repeats.py SIGMA_MS SEEDS OUT.json \
        [retry-bound run flags; default: the issue's 4-echo-backend benchmark at seed 2]

For each jitter seed s (1..SEEDS) the base run of `tidegate sim retry-bound` (admission on, the
slot model, placement by predicted TTFT) runs with every step 20 ms + U(+-sqrt(3) SIGMA_MS)
(JitterCost of bench/results/slo_tie_s10/jitter_sim.py: a function of the step's shape and the
seed); every refused request is then sent anyway in that run's own future (`fork_wait(seed=None)`,
the simulated probe) and its Retry-After and wait recorded. Rows: (repeat = jitter seed, request
index, class, Retry-After, wait); `python -m bench.serving.slo_repeats sim OUT.json` scores them
exactly as the live repeats are scored. SIGMA_MS 0: one deterministic run (every repeat equal).
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import replace

import numpy as np

from scheduler.classes import CLASS_NAMES
from scheduler.ttft_placement import _mix
from sims.cost import ConstantCost
from sims.retry_after_bound import base_run, fork_wait

DEFAULT_FLAGS = ("--step-ms 20 --placement ttft --max-num-seqs 8 --waiting-by-class --slot-model "
                 "--backends 4 --rate 47.8 --num-requests 600 --input-len 32 "
                 "--output-len uniform:1:80 --slo-ttft-ms fast=150,normal=400,slow=1000 --seed 2")
DEFAULT = DEFAULT_FLAGS.split()


class JitterCost(ConstantCost):
    """20 ms +- jitter, uniform in +-sqrt(3) sigma, a function of the step's shape and a seed."""

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


class SwitchJitterCost(JitterCost):
    """JitterCost whose seed becomes `seed_after` from its `switch_at`-th draw on: a run whose
    history up to a chosen moment is another run's exactly, its later steps jittered anew."""

    def __init__(self, seconds, sigma, seed, switch_at=None, seed_after=None) -> None:
        super().__init__(seconds, sigma, seed)
        self.calls, self.switch_at, self.seed_after = 0, switch_at, seed_after

    def _f(self, n, p, ctx):
        self.calls += 1
        if self.switch_at is not None and self.calls > self.switch_at:
            self.seed, self.switch_at = self.seed_after, None
        return super()._f(n, p, ctx)


class JitterSpec:
    def __init__(self, base, sigma_s: float, seed: int, switch_at=None, seed_after=None) -> None:
        self.base, self.sigma_s, self.seed = base, sigma_s, seed
        self.switch_at, self.seed_after, self.last = switch_at, seed_after, None

    def build(self):
        self.last = SwitchJitterCost(self.base.step_ms / 1e3, self.sigma_s, self.seed,
                                     self.switch_at, self.seed_after)
        return self.last

    def __getattr__(self, name):
        return getattr(self.base, name)


def jitter_forks(spec, sigma_ms: float, seed: int, forks: int, classes=("slow",)) -> list[dict]:
    """The exact-state study: the base run with jitter seed `seed`; for each refused request of
    `classes`, `forks` worlds whose every step up to the request's admission check is the base
    run's (the same arrivals, the same step times: the same state, checked through every earlier
    admission prediction) and whose later steps draw their jitter from another seed; the request
    sent anyway. What is left to vary is only the sub-millisecond step jitter after the refusal:
    the ceiling `score(...)["best_loo"]` is what any rule that knows the state AND the future
    arrivals can reach."""
    from scheduler.admission import AdmissionControl
    from sims.retry_after_bound import score
    js = JitterSpec(spec.cost, sigma_ms / 1e3, seed)
    sp = replace(spec, cost=js)
    at_check: list[int] = []
    check = AdmissionControl.check

    def counting(self, *args, **kwargs):
        at_check.append(js.last.calls)
        return check(self, *args, **kwargs)
    AdmissionControl.check = counting
    try:
        base = base_run(sp)
    finally:
        AdmissionControl.check = check
    rows = []
    for i in sorted(base.retry_after_s):
        if CLASS_NAMES[base.classes[i]] not in classes:
            continue
        waits, same = [], True
        for k in range(forks):
            fk = replace(spec, cost=JitterSpec(spec.cost, sigma_ms / 1e3, seed, at_check[i],
                                               10_000 + 100 * seed + k))
            w, s = fork_wait(fk, base, i, None)
            waits.append(w)
            same = same and s
        r = base.retry_after_s[i]
        rows.append({"i": i, "class": CLASS_NAMES[base.classes[i]], "retry_after_s": r,
                     "waits_s": waits, "prefix_identical": same, **score(r, waits)})
    return rows


def main(argv: list[str]) -> int:
    import argparse

    from sims.options import add_run_args, parse_with_config, spec_from_args
    forks = 0
    if argv[0] == "--forks":  # the exact-state study (jitter_forks): SEEDS base runs, K worlds each
        forks, argv = int(argv[1]), argv[2:]
    sigma_ms, seeds, out = float(argv[0]), int(argv[1]), argv[2]
    p = argparse.ArgumentParser()
    add_run_args(p, num_requests=600)
    a = parse_with_config(p, argv[3:] or DEFAULT)
    spec = spec_from_args(a)
    spec = replace(spec, scheduler=replace(spec.scheduler, admission=True))
    rows, t0 = [], time.perf_counter()
    if forks:
        for s in range(1, seeds + 1):
            for r in jitter_forks(spec, sigma_ms, s, forks):
                rows.append({"base_seed": s, **r})
            print(f"jitter seed {s}: {len(rows)} refusals ({time.perf_counter() - t0:.0f} s)",
                  file=sys.stderr, flush=True)
        n = len(rows)
        summary = {k: float(np.mean([r[k] for r in rows])) for k in ("current", "median", "best_loo", "best_in")}
        summary["prefix_identical"] = all(r["prefix_identical"] for r in rows)
        summary["spread_p90_over_p10_p50"] = float(np.median([r["wait_p90_s"] / r["wait_p10_s"] for r in rows]))
        print(f"{n} Slow refusals x {forks} worlds: " + json.dumps(summary))
        with open(out, "w") as fh:
            json.dump({"sigma_ms": sigma_ms, "seeds": seeds, "forks": forks,
                       "argv": argv[3:] or DEFAULT, "summary": summary, "rows": rows}, fh)
            fh.write("\n")
        return 0
    for s in range(1, seeds + 1):
        sp = replace(spec, cost=JitterSpec(spec.cost, sigma_ms / 1e3, s))
        base = base_run(sp)
        for i in sorted(base.retry_after_s):
            w, _ = fork_wait(sp, base, i, None)
            rows.append({"repeat": s, "i": i, "class": CLASS_NAMES[base.classes[i]],
                         "retry_after_s": base.retry_after_s[i], "wait_s": w})
        print(f"jitter seed {s}: {len(base.retry_after_s)} refused ({time.perf_counter() - t0:.0f} s)",
              file=sys.stderr, flush=True)
    with open(out, "w") as fh:
        json.dump({"sigma_ms": sigma_ms, "seeds": seeds, "argv": argv[3:] or DEFAULT,
                   "rows": rows}, fh)
        fh.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
