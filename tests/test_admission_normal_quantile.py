"""Issue 31, sixteenth session: a Normal request's admission at an upper quantile of the Fast
arrivals after it (AdmissionConfig.normal_overtake_quantile, opt-in). On a backend that starts
Fast first, every Fast request that arrives before a waiting Normal request's slot frees takes
that slot; the slot model's mean projection expects none within 1 / (their rate) and so admits
a Normal request whose slot frees just in time, which one early Fast arrival makes miss (the
s15 live benchmark's admitted misses: bench/results/slo_misses_s16)."""
from __future__ import annotations

import argparse

import pytest

from scheduler.admission import (
    AdmissionConfig,
    AdmissionControl,
    add_overtake_arguments,
)
from scheduler.clock import ManualClock
from scheduler.slo import SLOTargets
from tests.slot_helpers import slot_backend

FAST, NORMAL, SLOW = 0, 1, 2
STEP = 0.010


def _normal_check(fast_per_s: float, **config):
    """One backend of 4 slots whose running Normal requests end 3, 6, 9 and 12 steps after the
    set-up, Fast requests (4 tokens) sent there at `fast_per_s` over the last 2 s, a Normal
    request checked with a 70 ms deadline: (the check's Refusal or None, its point prediction)."""
    slo = SLOTargets.parse("fast=150,normal=70,slow=1000", None)
    p, clock = slot_backend(slo, NORMAL, [3, 6, 9, 12], **config)
    now = clock.now()
    for j in range(round(2.0 * fast_per_s)):
        p.dispatched(0, FAST, ("f", j), 4)
        p.gone(0, FAST, ("f", j))
    adm = AdmissionControl(p.config, p)
    point = p.backend_ttft(0, NORMAL)
    return adm.check(NORMAL, [0, 0, 0], 0.0, now=now), point


def test_normal_admission_takes_the_fast_arrivals_upper_quantile_when_asked():
    """The first slot frees 3 steps from now and the next 3 steps later: the point prediction
    (~40 ms) meets the 70 ms deadline and is admitted by default; at 20 Fast arrivals/s one
    arrives before the slot frees in more than 5% of the futures, which pushes the wait to the
    next slot: refused at the 0.95 quantile, with Retry-After the point prediction."""
    refusal, point = _normal_check(20.0)
    assert refusal is None and point < 0.07
    refusal, point = _normal_check(20.0, normal_overtake_quantile=0.95)
    assert refusal is not None and refusal.retry_after_s == pytest.approx(point)
    # few Fast arrivals: none before the slot frees in 95% of the futures: admitted
    refusal, _ = _normal_check(0.5, normal_overtake_quantile=0.95)
    assert refusal is None
    # Slow keeps its own quantile; arrival_quantile_from=1 put Normal on it (0.99) before
    refusal, _ = _normal_check(20.0, arrival_quantile_from=1)
    assert refusal is not None


def test_the_quantile_is_validated():
    for q in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError):
            AdmissionConfig(normal_overtake_quantile=q)
    assert AdmissionConfig().normal_overtake_quantile is None  # opt-in


def test_the_flag_reaches_the_gateway_the_simulator_and_the_replay():
    import numpy as np

    from gateway.serve import build_parser, gateway_config
    from sims.adapters import GatewayAdapter, SimSchedulerConfig
    from sims.options import add_run_args, parse_with_config, spec_from_args
    from sims.workload import Workload
    p = argparse.ArgumentParser()
    add_overtake_arguments(p)
    assert p.parse_args(["--normal-overtake-quantile", "0.95"]).normal_overtake_quantile == 0.95
    assert p.parse_args([]).normal_overtake_quantile is None
    args = build_parser().parse_args(["--backend", "ipc:///tmp/x.sock", "--slot-model",
                                      "--normal-overtake-quantile", "0.9"])
    assert gateway_config(args, ["ipc:///tmp/x.sock"]).normal_overtake_quantile == 0.9
    w = Workload(arrival_time=np.zeros(1), prompt_len=np.ones(1, dtype=np.int64),
                 output_len=np.ones(1, dtype=np.int64), prefix_group=np.full(1, -1),
                 prefix_len=np.zeros(1, dtype=np.int64), queue_class=np.full(1, -1),
                 priority=np.zeros(1, dtype=np.int64))
    g = GatewayAdapter(SimSchedulerConfig(normal_overtake_quantile=0.9), ManualClock(0.0), w)
    assert g.admission.config.normal_overtake_quantile == 0.9
    q = argparse.ArgumentParser()
    add_run_args(q)
    spec = spec_from_args(parse_with_config(q, ["--slot-model", "--normal-overtake-quantile", "0.9"]))
    assert spec.scheduler.normal_overtake_quantile == 0.9


def test_the_fleet_arrival_rate_is_every_backends_mean():
    """Fast requests sent at 2/s to backend 0 and none to backends 1-3 for 10 s: backend 1's
    slot model expects no Fast arrival by default, and a quarter of backend 0's rate (the
    fleet's mean) with `fleet_arrival_rate`; the mean max_tokens is the fleet's too."""
    from scheduler.admission import WaitPredictor as WP
    for fleet in (False, True):
        clock = ManualClock(0.0)
        p = WP(AdmissionConfig(slot_model=True, fleet_arrival_rate=fleet))
        p.clock = clock.now
        for b in range(4):
            p.add_backend(b)
            p.dispatched(b, SLOW, ("s", b), 70)  # every backend counting from t = 0
        for j in range(21):
            clock.set(j * 0.5)
            p.dispatched(0, FAST, ("f", j), 6)
        rate, mt = p.higher_rate(p.backends[1], NORMAL, clock.now())
        own, _ = p._higher_rate(p.backends[0], NORMAL, clock.now())
        assert own == pytest.approx(2.0, rel=0.15)
        assert rate == pytest.approx(own / 4 if fleet else 0.0, rel=1e-9, abs=1e-12)
        assert mt == pytest.approx(6.0 if fleet else 0.0)
    q = argparse.ArgumentParser()
    add_overtake_arguments(q)
    assert q.parse_args(["--fleet-arrival-rate"]).fleet_arrival_rate
    from gateway.serve import build_parser, gateway_config
    args = build_parser().parse_args(["--backend", "ipc:///tmp/x.sock", "--fleet-arrival-rate"])
    assert gateway_config(args, ["ipc:///tmp/x.sock"]).fleet_arrival_rate
