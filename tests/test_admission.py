"""SLO targets per class and admission that predicts the wait (scheduler.slo, scheduler.admission),
in the scheduler alone and through the simulator, against closed forms."""
from __future__ import annotations

import math

import numpy as np
import pytest

from scheduler.admission import AdmissionConfig, AdmissionControl, WaitPredictor
from scheduler.batcher import BatcherConfig, DynamicWindowBatcher
from scheduler.clock import ManualClock
from scheduler.queues import ClassQueues, PendingRequest
from scheduler.slo import SLOTargets, format_targets, parse_targets
from sims.adapters import SimSchedulerConfig
from sims.cost import ConstantCost
from sims.event_loop import EngineConfig, simulate
from sims.report import summarize
from sims.workload import Workload

FAST, NORMAL, SLOW = 0, 1, 2


# ---- targets ---------------------------------------------------------------------------------
def test_targets_parse_one_value_or_per_class():
    assert parse_targets("500") == (500.0, 500.0, 500.0)
    assert parse_targets(250) == (250.0, 250.0, 250.0)
    assert parse_targets("fast=200,slow=4000") == (200.0, None, 4000.0)
    assert parse_targets(None) == (None, None, None)
    assert format_targets(parse_targets("fast=200,slow=4000")) == "fast=200,slow=4000"
    for bad in ("fast=0", "quick=20", "fast=-1", "fast=nan", "fast"):
        with pytest.raises(ValueError):
            parse_targets(bad)


def test_targets_met_by_class_and_own_override():
    slo = SLOTargets.parse("fast=100,normal=1000", "slow=50")
    assert slo.met(FAST, 0.099, None) and not slo.met(FAST, 0.101, None)
    assert slo.met(NORMAL, 0.9, 10.0)             # no TPOT target for normal
    assert not slo.met(SLOW, 5.0, 0.051)          # slow: TPOT only
    assert slo.met(SLOW, 5.0, None)               # one output token: no TPOT
    assert slo.met(FAST, 0.3, None, ttft_override_ms=400)  # its own target wins
    assert not slo.met(NORMAL, None, None)        # no first token: missed


# ---- the predictor against hand-made event sequences -----------------------------------------
def _paced(p: WaitPredictor, b: int, n: int, gap: float, t0: float = 0.0, service: float = 0.0):
    """n requests sent at t0 to an empty backend, started one every `gap` (the first after
    `service`): n - 1 paced gaps."""
    ahead = [p.dispatched(b, FAST) for _ in range(n)]
    for k in range(n):
        t = t0 + service + k * gap
        p.started(b, FAST, t, t - t0, ahead[k])
    return t0 + service + (n - 1) * gap


def test_gap_and_service_are_measured_from_paced_starts_only():
    p = WaitPredictor(AdmissionConfig(min_samples=4))
    end = _paced(p, 0, 10, gap=0.05, service=0.02)
    assert p.known(0)
    assert p.capacity(0) == pytest.approx(20.0)               # 1 / 0.05
    assert p.backends[0].service == pytest.approx(0.02)       # the one sent alone
    # an idle spell then a lone request: its gap measured the arrivals, not the backend
    a = p.dispatched(0, FAST)
    p.started(0, FAST, end + 10.0, 0.03, a)
    assert p.capacity(0) == pytest.approx(20.0)
    # ... and it was alone: service moves towards 0.03 by the weight
    assert p.backends[0].service == pytest.approx(0.02 + 0.1 * (0.03 - 0.02))


def test_prediction_is_the_closed_form_with_classes_ahead():
    p = WaitPredictor(AdmissionConfig(min_samples=4))
    _paced(p, 0, 10, gap=0.1, service=0.1)
    for _ in range(3):
        p.dispatched(0, FAST)
    for _ in range(5):
        p.dispatched(0, SLOW)
    # fast sees the 3 fast requests ahead, slow sees all 8
    assert p.backend_ttft(0, FAST) == pytest.approx(3 * 0.1 + 0.1)
    assert p.backend_ttft(0, SLOW) == pytest.approx(8 * 0.1 + 0.1)
    # 6 queued in the gateway (2 fast, 4 normal) at 10 starts/s, plus a 2 ms window
    ttft, b = p.predict(NORMAL, gateway_ahead=6, window_s=0.002)
    assert b == 0 and ttft == pytest.approx(0.002 + 6 / 10 + 3 * 0.1 + 0.1)


def test_prediction_picks_the_backend_that_starts_it_soonest():
    p = WaitPredictor(AdmissionConfig(min_samples=2))
    _paced(p, 0, 5, gap=0.1, service=0.05)
    _paced(p, 1, 5, gap=0.02, service=0.05)
    for _ in range(4):
        p.dispatched(1, FAST)  # backend 1: 4 ahead x 20 ms = 80 ms; backend 0: nothing ahead
    p.dispatched(0, FAST)      # backend 0: 1 ahead x 100 ms
    ttft, b = p.predict(FAST, 0, 0.0)
    assert b == 1 and ttft == pytest.approx(4 * 0.02 + 0.05)
    # the gateway's queue drains at both backends' rates together: 10 + 50 starts/s
    ttft, _ = p.predict(FAST, 12, 0.0)
    assert ttft == pytest.approx(12 / 60 + 4 * 0.02 + 0.05)


def test_unmeasured_backend_admits_and_gone_requests_leave_the_count():
    p = WaitPredictor(AdmissionConfig(min_samples=8))
    for _ in range(50):
        p.dispatched(0, SLOW)
    assert p.predict(SLOW, 100, 0.0)[0] == 0.0  # no evidence of a queue yet: admit
    _paced(p, 1, 10, gap=0.1)
    p.dispatched(1, FAST)
    p.dispatched(1, FAST)
    p.gone(1, FAST)  # aborted before its first token
    assert p.backend_ttft(1, FAST) == pytest.approx(0.1)


def test_admission_refuses_past_the_deadline_slow_first():
    ctl = AdmissionControl(AdmissionConfig(slo=SLOTargets.parse("fast=500,normal=500,slow=500", None),
                                           min_samples=4))
    p = ctl.predictor
    _paced(p, 0, 10, gap=0.1)
    for _ in range(2):
        p.dispatched(0, FAST)
    for _ in range(3):
        p.dispatched(0, SLOW)
    # fast: 2 ahead -> 0.2 s; slow: 5 ahead -> 0.5 s (at the deadline: admitted); one more slow
    assert ctl.check(FAST, [0, 0, 0], 0.0) is None
    assert ctl.check(SLOW, [0, 0, 0], 0.0) is None
    p.dispatched(0, SLOW)
    refusal = ctl.check(SLOW, [0, 0, 0], 0.0)
    assert refusal is not None and refusal.retry_after_s == pytest.approx(0.6)
    assert refusal.deadline_s == 0.5 and "slow" in refusal.message()
    assert ctl.check(FAST, [0, 0, 0], 0.0) is None  # the fast class is not shed yet
    # the request's own target wins over its class's
    assert ctl.check(SLOW, [0, 0, 0], 0.0, ttft_override_ms=700) is None
    assert ctl.num_refused == [0, 0, 1]


def test_no_ttft_target_never_refuses():
    ctl = AdmissionControl(AdmissionConfig(slo=SLOTargets.parse(None, "50")))
    assert not ctl.config.enabled
    _paced(ctl.predictor, 0, 20, gap=1.0)
    for _ in range(100):
        ctl.predictor.dispatched(0, SLOW)
    assert ctl.check(SLOW, [1000, 0, 0], 0.0) is None


def test_headroom_is_capacity_minus_recent_starts():
    p = WaitPredictor(AdmissionConfig(min_samples=4, rate_window_s=1.0))
    end = _paced(p, 0, 41, gap=0.05)   # 20 starts/s for 2 s: the decayed rate nears 20/s
    assert p.capacity(0) == pytest.approx(20.0)
    assert p.headroom(end)[0] == pytest.approx(20.0 - p.recent_rate(0, end))
    assert p.headroom(end)[0] < 3.0
    assert p.headroom(end + 10.0)[0] == pytest.approx(20.0, rel=1e-3)  # idle for 10 s


# ---- the batcher's share of the wait ---------------------------------------------------------
def test_batcher_predicted_wait_is_the_window_rule():
    clock = ManualClock(1.0)
    cfg = BatcherConfig(min_latency_ms=5.0, target_throughput=1000.0, hysteresis=0.5,
                        idle_flush=True)
    b = DynamicWindowBatcher(cfg, clock, ClassQueues())
    assert b.predicted_wait(1.0) == pytest.approx(1 / 500)   # alone: size 1 at 500/s
    b.push(PendingRequest("a", 4, 4, 1.0, 0))
    clock.set(1.001)
    # a second request would make the window due at start + 2 / 500 = 1.004
    assert b.predicted_wait(1.001) == pytest.approx(0.003)
    for k in range(5):
        b.push(PendingRequest(f"x{k}", 4, 4, 1.001, 0))
    assert b.predicted_wait(1.001) == pytest.approx(0.004)  # capped by min_latency: 1.005
    b.notify_idle(True)
    assert b.predicted_wait(1.001) == 0.0


# ---- the simulator runs the same admission ---------------------------------------------------
def _bursts(n1: int, n2: int, t2: float) -> Workload:
    n = n1 + n2
    return Workload(arrival_time=np.array([0.0] * n1 + [t2] * n2), prompt_len=np.full(n, 16),
                    output_len=np.full(n, 1), prefix_group=np.full(n, -1),
                    prefix_len=np.zeros(n, dtype=np.int64), queue_class=np.full(n, -1),
                    priority=np.zeros(n, dtype=np.int64))


@pytest.mark.parametrize("deadline_ms", [225, 475])  # off the 50 ms grid: no float ties
def test_simulator_admits_exactly_what_meets_the_deadline(deadline_ms):
    """One backend that starts one request per 50 ms step (max_num_seqs 1, one output token).
    The first burst of 20 teaches the predictor gap = service = 50 ms; in the second burst the
    k-th request (from 0) is predicted k * 50 + 50 ms, so exactly floor(D / 50) are admitted,
    each meets D, and every refused one is told to retry after the wait it would have had:
    (admitted) * 50 + 50 ms."""
    step = 0.05
    sched = SimSchedulerConfig(batcher=BatcherConfig(min_latency_ms=0.0), max_num_seqs=1,
                               max_num_batched_tokens=64, max_model_len=128,
                               slo=SLOTargets.parse(deadline_ms, None), admission=True)
    w = _bursts(20, 30, 10.0)
    r = simulate(w, ConstantCost(step), sched, EngineConfig())
    first = np.arange(20)
    assert not r.rejected[first].any()  # nothing measured yet: the first burst is admitted
    second = np.arange(20, 50)
    admitted = second[~r.rejected[second]]
    n_ok = math.floor(deadline_ms / 50 + 1e-9)
    assert len(admitted) == n_ok and list(admitted) == list(range(20, 20 + n_ok))
    ttft = r.first_token_time[admitted] - w.arrival_time[admitted]
    assert np.allclose(ttft, step * np.arange(1, n_ok + 1))
    assert (ttft <= deadline_ms / 1e3 + 1e-9).all()
    retry = r.extra["retry_after_s"]
    assert sorted(retry) == list(range(20 + n_ok, 50))
    assert np.allclose(list(retry.values()), step * (n_ok + 1))
    rep = summarize(r, slo=sched.slo)
    assert rep["admission"]["refused"] == 30 - n_ok
    assert rep["by_class"]["fast"]["refused"] == 30 - n_ok
    # completed: the first burst (its k-th waited (k + 1) * 50 ms: n_ok of them in time) and
    # the admitted n_ok of the second, all in time
    assert rep["completed"] == 20 + n_ok
    ttft_first = r.first_token_time[first] - w.arrival_time[first]
    assert np.allclose(ttft_first, step * np.arange(1, 21))
    assert int((ttft_first <= deadline_ms / 1e3).sum()) == n_ok
    assert rep["goodput_fraction"] == pytest.approx(2 * n_ok / (20 + n_ok))


def test_simulator_without_admission_refuses_nothing():
    sched = SimSchedulerConfig(batcher=BatcherConfig(min_latency_ms=0.0), max_num_seqs=1,
                               max_num_batched_tokens=64, max_model_len=128,
                               slo=SLOTargets.parse(225, None), admission=False)
    r = simulate(_bursts(20, 30, 10.0), ConstantCost(0.05), sched, EngineConfig())
    assert not r.rejected.any() and r.extra["retry_after_s"] == {}
    rep = summarize(r, slo=sched.slo)
    # each burst's k-th waits (k + 1) * 50 ms: 4 of each meet 225 ms
    assert rep["completed"] == 50 and rep["admission"]["refused"] == 0
    assert rep["goodput_fraction"] == pytest.approx(8 / 50)


# ---- bench serve's report: per-class targets, refusals and their Retry-After -----------------
def test_live_report_counts_attainment_per_class_with_refusals():
    from sims.metrics import RequestRecord
    from sims.metrics import summarize as live_summary

    def ok(i, max_tokens, ttft):
        return RequestRecord(i, 8, max_tokens, send_time=0.0, chunk_times=[ttft, ttft + 0.01],
                             chunk_tokens=[1, 1], output_tokens=2)
    refused = RequestRecord(1, 8, 4, send_time=0.0, error="http_429", retry_after_s=0.5)
    records = [ok(0, 4, 0.1), refused, ok(2, 100, 2.0), ok(3, 100, 0.5)]
    rep = live_summary(records, start_time=0.0, slo_ttft_ms="fast=200,slow=1000")
    fast, slow = rep["by_class"]["fast"], rep["by_class"]["slow"]
    assert fast["num_refused"] == 1 and fast["slo_attainment"] == 0.5
    assert fast["goodput_fraction"] == 1.0  # of those completed
    assert fast["retry_after_ms"]["p50"] == pytest.approx(500.0)
    assert slow["slo_attainment"] == 0.5 and slow["num_refused"] == 0
    assert rep["num_good"] == 2 and rep["slo_attainment"] == pytest.approx(2 / 4)
    assert rep["slo"]["ttft_ms"] == {"fast": 200.0, "normal": None, "slow": 1000.0}


def test_prediction_counts_only_the_live_backends():
    p = WaitPredictor(AdmissionConfig(min_samples=2))
    _paced(p, 0, 5, gap=0.1, service=0.05)
    _paced(p, 1, 5, gap=0.1, service=0.05)
    for _ in range(10):
        p.dispatched(0, FAST)
    # backend 1 (idle) would start it in 50 ms; when it is gone, backend 0's queue counts
    assert p.predict(FAST, 0, 0.0)[1] == 1
    ttft, b = p.predict(FAST, 0, 0.0, live=[0])
    assert b == 0 and ttft == pytest.approx(10 * 0.1 + 0.05)
    assert p.predict(FAST, 0, 0.0, live=[7]) == (0.0, -1)  # none known: no prediction


def test_service_follows_the_backend_under_load_not_only_lone_requests():
    """Under decode load every start is slower; requests that find others ahead still measure
    it (their time minus ahead x gap). Measured from lone requests only, the service stayed at
    its light-load value and admitted what then missed its deadline."""
    p = WaitPredictor(AdmissionConfig(min_samples=4))
    end = _paced(p, 0, 10, gap=0.1, service=0.05)
    assert p.backends[0].service == pytest.approx(0.05)
    # saturated: 5 always ahead, starts every 100 ms, each 300 ms beyond its queue
    t = end + 1.0
    for _ in range(5):
        p.dispatched(0, FAST)
    for k in range(60):
        ahead = p.dispatched(0, FAST)
        assert ahead == 5
        p.started(0, FAST, t, ahead * 0.1 + 0.3, ahead)
        t += 0.1
    assert p.backends[0].service == pytest.approx(0.3, rel=0.01)
    assert p.backend_ttft(0, FAST) == pytest.approx(5 * 0.1 + 0.3, rel=0.01)


def test_service_time_is_kept_per_class():
    p = WaitPredictor(AdmissionConfig(min_samples=2))
    _paced(p, 0, 5, gap=0.1, service=0.05)           # fast requests: 50 ms beyond their queue
    for _ in range(20):
        ahead = p.dispatched(0, SLOW)
        p.started(0, SLOW, 100.0 + _, 0.4, ahead)    # slow ones, alone: 400 ms
    assert p.backend_ttft(0, FAST) == pytest.approx(0.05)
    assert p.backend_ttft(0, SLOW) == pytest.approx(0.4, rel=0.15)
    assert p.backend_ttft(0, NORMAL) == pytest.approx(p.backends[0].service)  # no sample: all


def test_calibration_admits_by_the_high_error_and_answers_with_the_median():
    """Predictions that run low (measured service 20-60 ms over what was predicted at dispatch,
    with nothing ahead): admission refuses unless prediction + the 0.9 quantile of those
    errors meets the deadline, and the refusal's wait is prediction + their median. Errors
    are kept per class and per requests ahead (none / 1-3 / more), and expire."""
    from scheduler.admission import pool
    ctl = AdmissionControl(AdmissionConfig(slo=SLOTargets.parse("fast=1000", None),
                                           min_samples=2, calibration_min_samples=20,
                                           calibration_horizon_s=10.0))
    p = ctl.predictor
    _paced(p, 0, 5, gap=0.1, service=0.1)
    k = pool(FAST, 0)
    assert p.error_high[k] == p.error_mid[k] == 0.0  # no error measured yet
    errors = [0.02 + 0.04 * j / 39 for j in range(40)]
    for e in errors:  # alone each time: predicted 100 ms, measured 100 ms + e
        a = p.dispatched(0, FAST)
        p.started(0, FAST, 50.0, 0.1 + e, a, 0, 0, predicted_s=0.1)
    s = sorted(errors)
    assert p.error_high[k] == pytest.approx(s[int(0.9 * 40)])
    assert p.error_mid[k] == pytest.approx(s[20])
    assert p.error_high[pool(NORMAL, 0)] == p.error_high[pool(FAST, 1)] == 0.0  # other pools
    raw, _ = p.predict(FAST, 0, 0.0)
    deadline_ms = (raw + p.error_high[k] / 2) * 1000  # the raw prediction meets it...
    refusal = ctl.check(FAST, [0, 0, 0], 0.0, deadline_ms, now=51.0)
    assert refusal is not None  # ... the calibrated one does not
    assert refusal.retry_after_s == pytest.approx(raw + p.error_mid[k])
    assert ctl.check(FAST, [0, 0, 0], 0.0, (raw + p.error_high[k]) * 1000 + 1, now=51.0) is None
    # with 8 ahead, the lone starts' errors do not apply
    for _ in range(8):
        p.dispatched(0, FAST)
    queued, _ = p.predict(FAST, 0, 0.0)
    assert ctl.check(FAST, [0, 0, 0], 0.0, queued * 1000 + 1, now=51.0) is None
    # past the horizon the errors are gone: the raw prediction decides again
    for _ in range(8):
        p.gone(0, FAST)
    assert ctl.check(FAST, [0, 0, 0], 0.0, deadline_ms, now=61.0) is None
    assert not p.errors[k] and p.error_high[k] == 0.0
