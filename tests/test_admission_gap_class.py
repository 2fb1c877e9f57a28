"""Admission's gap model on a class-ordered backend (`AdmissionConfig.class_ordered`, module doc
"Overtaking"): the higher classes' requests that arrive while a lower-class one waits start
before it, so its wait is W = ahead x gap / (1 - rate_h x gap), against closed forms; FCFS
backends, the slot model and the Fast class unchanged; the wiring of `--overtake`."""
from __future__ import annotations

import argparse
import math

import pytest

from scheduler.admission import (
    AdmissionConfig,
    AdmissionControl,
    WaitPredictor,
    add_overtake_arguments,
)
from scheduler.clock import ManualClock
from scheduler.slo import SLOTargets

FAST, NORMAL, SLOW = 0, 1, 2
GAP = 0.1
# a window long enough that the arrival count barely decays over the test: the higher classes'
# rate is then their count over the time since the first request was sent (rate_from_start)
WINDOW = 1e4


def _predictor(**kw) -> tuple[WaitPredictor, ManualClock]:
    cfg = AdmissionConfig(min_samples=2, gap_weight=1.0, arrival_window_s=WINDOW, **kw)
    p = WaitPredictor(cfg)
    clock = ManualClock(0.0)
    p.clock = clock.now
    return p, clock


def _setup(p: WaitPredictor, clock: ManualClock, n_high: int = 5, n_slow: int = 3) -> None:
    """At t = 0, `n_high` Fast requests sent to backend 0; they start every GAP from 0.1 s (paced:
    gap = GAP); at 0.6 s, `n_slow` Slow requests sent (unstarted); the clock at 1.0 s."""
    for k in range(n_high):
        p.dispatched(0, FAST, key=("f", k), max_tokens=8)
    for k in range(n_high):
        t = GAP * (k + 1)
        clock.set(t)
        p.started(0, FAST, t, t, k, key=("f", k))
    clock.set(0.6)
    for k in range(n_slow):
        p.dispatched(0, SLOW, key=("s", k), max_tokens=8)
    clock.set(1.0)


def _rate(count: int, now: float) -> float:
    """`WaitPredictor.higher_rate` of `count` requests sent at t = 0, read at `now`: their
    count, decayed (to 0.6 s, the last dispatch there, then to `now`), over the decayed span
    since the first (rate_from_start)."""
    return count * math.exp(-0.6 / WINDOW) * math.exp(-(now - 0.6) / WINDOW) / (
        WINDOW * -math.expm1(-max(0.5, now) / WINDOW))


def test_overtaken_wait_is_the_closed_form():
    """3 Slow requests ahead at gap 0.1 s: w = 0.3 s; the Fast requests arrived at 5 / s
    there, rate_h x gap = 0.5: a new Slow request waits W = 0.3 / (1 - 0.5) = 0.6 s (not 0.3 s),
    plus its service."""
    p, clock = _predictor(class_ordered=True)
    _setup(p, clock)
    be = p.backends[0]
    assert p.known(0) and be.gap == pytest.approx(GAP)
    rate_h, _ = p.higher_rate(be, SLOW, 1.0)
    assert rate_h == pytest.approx(_rate(5, 1.0), rel=1e-9)
    assert rate_h == pytest.approx(5.0, rel=1e-3)
    service = p._service(be, SLOW, None, 0, None)
    ahead = 3
    want = ahead * GAP / (1.0 - rate_h * GAP)
    assert want == pytest.approx(0.6, rel=1e-3)
    assert p.backend_ttft(0, SLOW) - service == pytest.approx(want, rel=1e-9)
    # placed in the same window behind one more: ahead 4
    assert p.backend_ttft(0, SLOW, extra_ahead=1) - service == pytest.approx(
        4 * GAP / (1.0 - rate_h * GAP), rel=1e-9)
    # a Normal request: only the Fast arrivals pass it (the same 5 / s here), and no Slow
    # request is ahead of it: nothing to wait for
    assert p.backend_ttft(0, NORMAL) == pytest.approx(p._service(be, NORMAL, None, 0, None))
    # the predict() path (what admission and the Retry-After read)
    ttft, b = p.predict(SLOW, gateway_ahead=0, window_s=0.002)
    assert b == 0 and ttft == pytest.approx(0.002 + want + service, rel=1e-9)


def test_fcfs_backend_fast_class_and_slot_model_unchanged():
    """class_ordered off (an FCFS backend, the default): W = ahead x gap, as before; the Fast
    class is never overtaken; with the slot model the gap model's fallback is unchanged."""
    p, clock = _predictor()
    _setup(p, clock)
    be = p.backends[0]
    assert p.backend_ttft(0, SLOW) - p._service(be, SLOW, None, 0, None) == pytest.approx(3 * GAP)
    q, clock2 = _predictor(class_ordered=True)
    _setup(q, clock2)
    for k in range(2):
        p.dispatched(0, FAST, key=("g", k))
        q.dispatched(0, FAST, key=("g", k))
    assert q.backend_ttft(0, FAST) == pytest.approx(p.backend_ttft(0, FAST))
    s = WaitPredictor(AdmissionConfig(class_ordered=True, slot_model=True))
    assert not s.overtaking
    assert not WaitPredictor(AdmissionConfig()).overtaking
    assert WaitPredictor(AdmissionConfig(class_ordered=True)).overtaking


def test_saturated_and_horizon():
    """rate_h x gap >= 1: the higher classes alone fill the backend: max_wait_s (refused);
    with a horizon H, their arrivals over H at most: W = w + rate_h x gap x H past it
    (continuous at W = H)."""
    p, clock = _predictor(class_ordered=True)
    _setup(p, clock)
    be = p.backends[0]
    p.higher_rate = lambda be, cls, now: (12.0, 8.0)  # 12 / s x 0.1 s: saturated
    assert p.overtaken_wait(be, SLOW, 0.3) == p.config.max_wait_s
    h, clock_h = _predictor(class_ordered=True, overtake_horizon_s=2.0)
    _setup(h, clock_h)
    h.higher_rate = lambda be, cls, now: (12.0, 8.0)
    assert h.overtaken_wait(h.backends[0], SLOW, 0.3) == pytest.approx(0.3 + 1.2 * 2.0)
    h.higher_rate = lambda be, cls, now: (5.0, 8.0)  # rate_h x gap = 0.5
    assert h.overtaken_wait(h.backends[0], SLOW, 0.3) == pytest.approx(0.6)   # < H: closed form
    assert h.overtaken_wait(h.backends[0], SLOW, 1.0) == pytest.approx(2.0)   # = H
    assert h.overtaken_wait(h.backends[0], SLOW, 1.5) == pytest.approx(2.5)   # 1.5 + 0.5 x 2
    with pytest.raises(ValueError):
        AdmissionConfig(overtake_horizon_s=0.0)


def test_slow_class_service_leaves_out_the_requests_that_passed_it():
    """A Slow request s1 sent with 1 Slow ahead (s0), passed by 4 Fast requests sent after it,
    started 0.6 s after dispatch: its class's service is 0.6 - (1 + 4) x gap = 0.1 s
    (class-ordered), 0.6 - 1 x gap = 0.5 s as before (FCFS reading); s0 started before the Fast
    ones: nothing passed it; the all-class figure as before."""
    out = {}
    for ordered in (False, True):
        p, clock = _predictor(class_ordered=ordered)
        _setup(p, clock, n_slow=0)
        clock.set(2.0)
        p.dispatched(0, SLOW, key="s0")
        a = p.dispatched(0, SLOW, key="s1")
        assert a == 1
        for k in range(4):
            p.dispatched(0, FAST, key=("h", k))
        be = p.backends[0]
        before = be.service
        # s0 starts, then the 4 Fast (paced: the gap stays 0.1), then s1 at 2.9 s
        t = 2.0
        for key, cls in [("s0", SLOW)] + [(("h", k), FAST) for k in range(4)]:
            t += GAP
            p.started(0, cls, t, t - 2.0, 0, key=key)
        p.started(0, SLOW, 2.6, 0.6, a, key="s1")
        out[ordered] = be.class_service[SLOW]
        assert be.gap == pytest.approx(GAP)
        out[(ordered, "all")] = (before, be.service)
    # s0's own sample (nothing ahead, nothing passed: 0.1 s) first, then s1's
    w = AdmissionConfig().service_weight
    assert out[False] == pytest.approx(0.1 + w * ((0.6 - 1 * GAP) - 0.1))
    assert out[True] == pytest.approx(0.1 + w * ((0.6 - 5 * GAP) - 0.1))
    assert out[(True, "all")] == pytest.approx(out[(False, "all")])


def test_admission_refuses_what_the_projection_puts_past_the_deadline():
    """The same state, Slow deadline 0.5 s: FCFS reading 0.3 s + service admits; class-ordered
    0.6 s + service refuses, Retry-After = that prediction."""
    for ordered, refused in ((False, False), (True, True)):
        cfg = AdmissionConfig(min_samples=2, gap_weight=1.0, arrival_window_s=WINDOW,
                              class_ordered=ordered, slo=SLOTargets.parse("slow=500", None),
                              arrival_quantile=None)
        ctl = AdmissionControl(cfg)
        clock = ManualClock(0.0)
        ctl.predictor.clock = clock.now
        _setup(ctl.predictor, clock)
        r = ctl.check(SLOW, (0, 0, 0), 0.0, now=1.0)
        assert (r is not None) == refused
        if r is not None:
            assert r.retry_after_s == pytest.approx(ctl.last_predicted_s)
            assert r.retry_after_s > 0.6


def test_flags_reach_the_admission_config():
    from sims.adapters import GatewayAdapter, SimSchedulerConfig
    from sims.workload import Workload
    p = argparse.ArgumentParser()
    add_overtake_arguments(p)
    a = p.parse_args(["--overtake", "--overtake-horizon-s", "5"])
    assert a.overtake and a.overtake_horizon_s == 5.0
    assert not p.parse_args([]).overtake
    import numpy as np
    w = Workload(arrival_time=np.zeros(1), prompt_len=np.ones(1, dtype=np.int64),
                 output_len=np.ones(1, dtype=np.int64), prefix_group=np.full(1, -1),
                 prefix_len=np.zeros(1, dtype=np.int64), queue_class=np.full(1, -1),
                 priority=np.zeros(1, dtype=np.int64))
    from scheduler.clock import ManualClock as MC
    for by_class, want in ((True, True), (False, False)):
        sched = SimSchedulerConfig(overtake=True, waiting_by_class=by_class, overtake_horizon_s=5.0)
        g = GatewayAdapter(sched, MC(0.0), w)
        assert g.admission.config.class_ordered is want
        assert g.admission.config.overtake_horizon_s == 5.0
    from gateway.serve import build_parser, gateway_config
    args = build_parser().parse_args(["--backend", "ipc:///tmp/x.sock", "--overtake"])
    cfg = gateway_config(args, ["ipc:///tmp/x.sock"])
    assert cfg.overtake and cfg.overtake_horizon_s is None
