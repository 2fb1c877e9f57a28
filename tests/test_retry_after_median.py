"""Issue 31, fourteenth session: `AdmissionConfig.retry_after_quantile` (opt-in): the slot
model's Retry-After is a quantile (0.5: the median) of the refused request's wait over the
futures admission's upper quantile reads, not the wait with the higher classes' arrivals at
their mean (the default). A closed form; the forked futures of the issue's simulated benchmark
(`tidegate sim retry-bound`, alternatives `point` and `quantile_0.5`) measure the difference."""
from __future__ import annotations

import pytest

from scheduler.admission import AdmissionConfig, AdmissionControl, sampled_arrivals
from scheduler.clock import ManualClock
from scheduler.slo import SLOTargets
from tests.slot_helpers import slot_backend

FAST, NORMAL, SLOW = 0, 1, 2
STEP = 0.010
SLO = SLOTargets.parse("fast=150,normal=400,slow=1000", None)


def _full_backend(normal_rate: float = 0.0, first: int = 3,
                  **config) -> tuple[AdmissionControl, ManualClock]:
    """One backend of 4 reported slots, all held by Slow requests whose last tokens are due
    `first`, + 3, + 6 and + 9 steps from now (4 x 10 ms steps measured), nothing queued there;
    Normal requests of 40 tokens sent there at `normal_rate` a second (a count over the 2 s
    window)."""
    p, clock = slot_backend(SLO, SLOW, [first + 3 * j for j in range(4)], **config)
    be, now = p.backends[0], clock.now()
    for j in range(round(2.0 * normal_rate)):
        p.dispatched(0, NORMAL, ("n", j), 40)
        p.gone(0, NORMAL, ("n", j))
    assert len(p._live_finishes(be, now)) == 4 and not be.queued
    return AdmissionControl(p.config, p), clock


def test_the_retry_after_is_the_median_wait_over_the_admission_futures():
    """The first slot frees 27 steps from now; Normal requests of 40 tokens arrive at 12 a
    second, 4.8 slots' worth of 4. With the arrivals evenly spaced (the mean projection) one
    is always waiting when a slot frees, so the Slow request gets none before the 5 s horizon
    and the Retry-After was 6.4 s; over the 64 fixed Poisson futures that admission's 0.99
    quantile reads (the longest of them refused it), the median one has a lull at ~1.5 s. The
    Retry-After is its window plus that median wait's first token."""
    adm, clock = _full_backend(12.0, first=27, retry_after_quantile=0.5)
    p = adm.predictor
    be, now = p.backends[0], clock.now()
    window = 0.004
    refusal = adm.check(SLOW, [0, 0, 0], window, now=now)
    assert refusal is not None
    rate_h, mt_h = p.higher_rate(be, SLOW, now)
    assert rate_h == pytest.approx(12.5, rel=0.02)  # and the warm-up request (Fast)
    heap = sorted(p._live_finishes(be, now))
    run = (heap, [], 0, 0, 1.0, rate_h, mt_h, STEP, 4)
    waits = sorted(p._slot_run(run, now, u) for u in sampled_arrivals(64, 32))
    median = waits[32]
    assert refusal.retry_after_s == pytest.approx(window + p.slot_ttft(0, SLOW, median))
    assert 1.0 < refusal.retry_after_s < 2.0
    assert p.backend_ttft(0, SLOW) > 5.0  # the mean projection's wait
    # the default: the point estimate (the mean projection's wait)
    point, clock = _full_backend(12.0, first=27)
    refusal = point.check(SLOW, [0, 0, 0], window, now=clock.now())
    assert refusal.retry_after_s == pytest.approx(window + point.predictor.backend_ttft(0, SLOW))
    with pytest.raises(ValueError):
        AdmissionConfig(retry_after_quantile=1.0)


def test_the_cli_flags_reach_admission():
    """`tidegate serve --retry-after-quantile` and `tidegate sim --retry-after-quantile` reach
    the admission both run (the gateway's config, the simulator's gateway adapter)."""
    import argparse

    from gateway.serve import build_parser, gateway_config
    from sims.options import add_run_args, parse_with_config, spec_from_args
    from sims.retry_after_bound import _loop
    from sims.workload import generate
    args = build_parser().parse_args(["--backend", "ipc:///tmp/x.sock", "--slot-model",
                                      "--retry-after-quantile", "0.5"])
    assert gateway_config(args, ["ipc:///tmp/x.sock"]).retry_after_quantile == 0.5
    args = build_parser().parse_args(["--backend", "ipc:///tmp/x.sock"])
    assert gateway_config(args, ["ipc:///tmp/x.sock"]).retry_after_quantile is None
    p = argparse.ArgumentParser()
    add_run_args(p)
    spec = spec_from_args(parse_with_config(p, ["--slot-model", "--retry-after-quantile", "0.5",
                                                "--num-requests", "4"]))
    assert spec.scheduler.retry_after_quantile == 0.5
    loop = _loop(spec, generate(spec.workload))
    assert loop.gateway.admission.config.retry_after_quantile == 0.5
