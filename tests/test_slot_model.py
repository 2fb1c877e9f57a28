"""Issue 31: the wait predictor's slot model (scheduler.admission, "Slots"): when each running
request sends its last token is known from its first token, its max_tokens and the measured step,
so a request that finds every slot taken waits for the slot that frees first (requests of its
class or a higher one ahead of it take the earlier ones). Closed forms, then the simulator's
4 echo-like backends at 1.5x capacity (the issue's live check), where the gap-based queue term
alone left the Fast class's TTFT p90 at 150-330 ms."""
from __future__ import annotations

import argparse

import numpy as np
import pytest

from scheduler.admission import AdmissionConfig, WaitPredictor
from scheduler.clock import ManualClock

FAST, NORMAL, SLOW = 0, 1, 2
STEP = 0.010


def _warm(p: WaitPredictor, clock: ManualClock, b: int = 0) -> None:
    """Measure the step (a 5-token request over 4 steps) on backend `b`."""
    p.add_backend(b)
    k = ("warm", b)
    p.dispatched(b, FAST, k, 5)
    clock.set(clock.now() + 2 * STEP)
    p.started(b, FAST, clock.now(), 2 * STEP, 0, key=k)
    clock.set(clock.now() + 4 * STEP)
    p.finished(b, k, clock.now(), 5)


def _predictor(slots_full: int) -> tuple[WaitPredictor, ManualClock]:
    """One backend running `slots_full` requests that end 3, 6, 9, ... steps from now, and
    known to be full at that count (a request waited more than two steps there)."""
    clock = ManualClock(100.0)
    p = WaitPredictor(AdmissionConfig(slot_model=True))
    p.clock = clock.now
    _warm(p, clock)
    assert p.backends[0].step == pytest.approx(STEP)
    now = clock.now()
    for j in range(slots_full):
        k = ("run", j)
        p.dispatched(0, NORMAL, k, 40)
        # its first token came so that its last is due 3 * (j + 1) steps from now
        t0 = now + 3 * (j + 1) * STEP - 39 * STEP
        p.started(0, NORMAL, t0, 0.0, 0, key=k)
    p.dispatched(0, SLOW, "stuck", 50)  # waits: the backend is full ...
    clock.set(now + 2.2 * STEP)
    p.backend_ttft(0, FAST)  # ... which the next prediction sees (sent > 2 steps ago)
    return p, clock


def test_step_time_is_measured_from_finished_requests():
    clock = ManualClock(5.0)
    p = WaitPredictor(AdmissionConfig(slot_model=True))
    p.clock = clock.now
    _warm(p, clock)
    be = p.backends[0]
    assert be.step == pytest.approx(STEP) and not be.running and not be.queued


def test_a_full_backend_learns_its_slots_and_a_fast_request_waits_for_the_first_to_free():
    p, clock = _predictor(4)
    be = p.backends[0]
    assert be.slots == 4
    now = clock.now()
    # the first running request ends at +3 steps from the set-up (0.8 steps from now); the
    # queued slow request ("stuck") is behind a fast one, which gets that slot: its first token
    # one step after it
    first_free = 100.0 + 6 * STEP + 3 * STEP  # _warm took 6 steps
    assert p._slot_wait(be, FAST, 0, now) == pytest.approx(first_free - now)
    assert p.backend_ttft(0, FAST) == pytest.approx(first_free - now + STEP)
    # the slow one queued first takes that slot from a new slow request, which gets the next
    assert p._slot_wait(be, SLOW, 0, now) == pytest.approx(first_free + 3 * STEP - now)
    # two fast requests already placed ahead of it in the same window: the third slot
    assert p._slot_wait(be, FAST, 2, now) == pytest.approx(first_free + 6 * STEP - now)


def test_a_free_slot_goes_first_to_what_was_sent_before():
    p, clock = _predictor(4)
    be = p.backends[0]
    p.finished(0, ("run", 3), clock.now(), 0)  # a slot frees (it was aborted)
    now = clock.now()
    # the queued slow request takes the free slot; a fast one waits for the next to free
    assert p._slot_wait(be, FAST, 0, now) == pytest.approx(100.0 + 9 * STEP - now)
    p.gone(0, SLOW, "stuck")  # the slow one left: the free slot is the fast request's
    assert p._slot_wait(be, FAST, 0, now) == 0.0
    assert p.backend_ttft(0, FAST) == pytest.approx(1.5 * STEP)  # no free start measured yet


def test_higher_classes_expected_meanwhile_take_slots_ahead_of_a_slow_request():
    p, clock = _predictor(4)
    be = p.backends[0]
    now = clock.now()
    base = p._slot_wait(be, SLOW, 0, now)
    # fast requests were being sent here at ~100/s (200 in the rate's 2 s window): during its
    # wait a few arrive, and each takes a slot ahead of it
    for j in range(200):
        p.dispatched(0, FAST, ("f", j), 2)
        p.gone(0, FAST, ("f", j))
    assert p._slot_wait(be, SLOW, 0, now) > base + 2 * STEP
    assert p._slot_wait(be, FAST, 0, now) == pytest.approx(100.0 + 9 * STEP - now)


def test_without_a_clock_or_the_option_the_gap_model_alone():
    p = WaitPredictor(AdmissionConfig(slot_model=True))
    p.add_backend(0)
    a = p.dispatched(0, FAST, "x", 10)  # no clock: not followed
    assert not p.backends[0].queued and a == 0
    clock = ManualClock(5.0)
    p = WaitPredictor(AdmissionConfig())  # off by default (opt-in: tidegate serve --slot-model)
    p.clock = clock.now
    _warm(p, clock)
    p.backends[0].slots = 4
    assert p._slot_wait(p.backends[0], FAST, 0, clock.now()) is None


def _sim(slot_model: bool, seed: int) -> tuple[float, float]:
    """4 backends x 8 slots x 20 ms steps, prompts 32, outputs uniform 1-80, at 47.8 req/s
    (1.5x the live capacity), admission by fast 150 / normal 400 / slow 1000 ms, placement by
    predicted TTFT: (Fast TTFT p90 of the admitted, share of the admitted missing by > 10%)."""
    from sims.options import add_run_args, parse_with_config, spec_from_args
    from sims.runner import simulate_spec
    p = argparse.ArgumentParser()
    add_run_args(p)
    a = parse_with_config(p, [
        "--step-ms", "20", "--max-num-seqs", "8", "--backends", "4", "--rate", "47.8",
        "--num-requests", "600", "--input-len", "32", "--output-len", "uniform:1:80",
        "--slo-ttft-ms", "fast=150,normal=400,slow=1000", "--admission", "--placement", "ttft",
        "--waiting-by-class", "--seed", str(seed)] + (["--slot-model"] if slot_model else []))
    r = simulate_spec(spec_from_args(a))
    ttft = r.first_token_time - r.workload.arrival_time
    ok = ~r.rejected & ~np.isnan(ttft)
    deadline = np.array([0.15, 0.4, 1.0])[r.queue_class]
    fast = ttft[ok & (r.queue_class == 0)]
    return float(np.percentile(fast, 90)), float((ttft[ok] > 1.1 * deadline[ok]).mean())


@pytest.mark.parametrize("seed", [0, 1])
def test_fast_class_meets_its_target_at_one_and_a_half_times_capacity(seed):
    fast_p90, missing = _sim(True, seed)
    assert fast_p90 < 0.150 and missing < 0.08  # the misses: Slow requests (module doc)
    # the gap-based queue term alone (the slot model off) does not
    assert _sim(False, seed)[0] > 0.150


def test_slot_model_errors_are_calibrated_apart_from_the_gap_models():
    from scheduler.admission import SLOT_POOLS, pool, slot_pool
    p, clock = _predictor(4)
    be = p.backends[0]
    # a gap-model prediction (made on a fresh backend) missed by 300 ms: its own pool
    p.add_backend(1)
    p.dispatched(1, NORMAL)
    p.started(1, NORMAL, clock.now(), 0.35, 0, predicted_s=0.05)
    assert [e for _, e in p.errors[pool(NORMAL, 0)]] == [pytest.approx(0.3)]
    # a slot-model prediction on the full backend: the slot pool of its predicted wait
    predicted = p.backend_ttft(0, NORMAL)
    wait = p._slot_wait(be, NORMAL, 0, clock.now())
    assert wait > 0 and predicted == pytest.approx(wait + STEP)  # the step after the slot
    p.dispatched(0, NORMAL, "n", 30)
    k = p.pool_at(NORMAL, 0)
    clock.set(clock.now() + predicted + 0.004)
    p.started(0, NORMAL, clock.now(), predicted + 0.004, 1, predicted_s=predicted, key="n")
    assert k >= SLOT_POOLS and k == slot_pool(NORMAL, wait, be.step)
    assert [e for _, e in p.errors[k]] == [pytest.approx(0.004)]
    assert len(p.errors[pool(NORMAL, 1)]) == 0


# ---- issue 31, fourth session: the slot model's Retry-After and its pools' fallback ---------
def _pools(fallback: str) -> tuple[WaitPredictor, int, int, int]:
    """Slow's long-wait pool full of large errors (Slow requests admitted, then passed by Fast
    and Normal arrivals), Fast's free-slot pool full of small ones, Slow's other pools empty."""
    from scheduler.admission import slot_pool
    p = WaitPredictor(AdmissionConfig(slot_model=True, slot_fallback=fallback))
    long_ = slot_pool(SLOW, 1.0, STEP)
    for j in range(24):
        p._calibrate(long_, 2.0 + 0.01 * j, 1.0)
    for j in range(32):
        p._calibrate(slot_pool(FAST, 0.0, STEP), 0.005, 1.0)
    return p, slot_pool(SLOW, 0.0, STEP), slot_pool(SLOW, 0.1, STEP), long_


def test_a_short_pool_borrows_only_shorter_waits():
    """A Slow request with a free slot is not charged the margin of Slow requests that waited
    for slots ("shorter"); the third session's rule ("class") charged it (2 s and more)."""
    p, free, short, long_ = _pools("shorter")
    assert p.error_high[free] == p.error_high[short] == pytest.approx(0.005)
    assert p.error_high[long_] > 2.0 and p.error_mid[long_] > 2.0
    p, free, short, long_ = _pools("class")
    assert p.error_high[free] > 2.0 and p.error_high[short] > 2.0


def test_retry_after_of_the_slot_model_is_its_prediction():
    from scheduler.admission import SLOT_POOLS
    p = WaitPredictor(AdmissionConfig(slot_model=True))
    p.error_mid[SLOT_POOLS + 7] = p.error_mid[4] = 1.5
    assert p.retry_after_error(SLOT_POOLS + 7) == 0.0   # the slot model's: the prediction
    assert p.retry_after_error(4) == 1.5                # the gap model's: calibrated
    p.config = AdmissionConfig(slot_model=True, retry_after_calibrated=True)
    assert p.retry_after_error(SLOT_POOLS + 7) == 1.5
    p.config = AdmissionConfig(slot_model=True, retry_after_calibrated=False)
    assert p.retry_after_error(4) == 0.0
    with pytest.raises(ValueError):
        AdmissionConfig(slot_fallback="all")


@pytest.mark.parametrize("window, from_start, expect", [
    (None, False, 10.0 * (1 - np.exp(-1.5))), (None, True, 10.0), (20.0, False, 10.0),
    (20.0, True, 10.0)])
def test_higher_rate_over_a_long_window_is_the_arrival_rate(window, from_start, expect):
    """Fast requests sent at 10/s for 3 s: the 2 s decayed count reads 7.8/s (it has not filled
    yet); over the time it has counted (`rate_from_start`, the default, or a longer
    `arrival_window_s`): 10/s."""
    clock = ManualClock(0.0)
    p = WaitPredictor(AdmissionConfig(slot_model=True, arrival_window_s=window,
                                      rate_from_start=from_start))
    p.clock = clock.now
    p.add_backend(0)
    for j in range(31):
        clock.set(j * 0.1)
        p.dispatched(0, FAST, ("f", j), 4)
    rate, mt = p.higher_rate(p.backends[0], SLOW, clock.now())
    assert rate == pytest.approx(expect, rel=0.06) and mt == pytest.approx(4.0)


def _busy_slow_check(rate_per_s: float, **config) -> tuple[object, float]:
    """One backend of 4 slots (`_predictor`), Normal requests of 40 tokens (0.4 s a slot) sent
    there at `rate_per_s` over the last 2 s, a Slow request checked with a 1 s deadline:
    (the check's Refusal or None, the Slow request's point prediction)."""
    from scheduler.admission import AdmissionControl
    from scheduler.slo import SLOTargets
    p, clock = _predictor(4)
    slo = SLOTargets.parse("fast=150,normal=400,slow=1000", None)
    p.config = AdmissionConfig(slot_model=True, slo=slo, **config)
    now = clock.now()
    p.backends[0].arr_t0 = now - 60.0  # counting for long: the count is over the 2 s window
    for j in range(round(2.0 * rate_per_s)):  # the rate: a count over the 2 s window
        p.dispatched(0, NORMAL, ("n", j), 40)
        p.gone(0, NORMAL, ("n", j))
    adm = AdmissionControl(p.config, p)
    point = p.backend_ttft(0, SLOW)
    return adm.check(SLOW, [0, 0, 0], 0.0, now=now), point


def test_slow_admission_takes_the_arrivals_upper_quantile_and_retry_after_the_point():
    """Issue 31, fifth session: a Slow request's slot goes to every Fast and Normal arrival
    while it waits. At ~9 Normal arrivals/s on 4 slots of 0.4 s (10 starts/s), the mean
    projection (no arrival within the ~40 ms until its slot frees) admits it; in the longest of
    64 Poisson futures the arrivals keep every slot past 1 s: refused, with Retry-After the
    point prediction."""
    refusal, point = _busy_slow_check(9.0, arrival_quantile=None)
    assert refusal is None and point < 0.1
    refusal, point = _busy_slow_check(9.0)  # the default: sampled, 0.99
    assert refusal is not None and refusal.retry_after_s == pytest.approx(point)
    # "path": the arrivals at the Poisson count's 0.99 quantile at every time: refused too
    refusal, _ = _busy_slow_check(9.0, arrival_quantile_mode="path")
    assert refusal is not None
    # few arrivals: a slot frees well before 1 s in every future: admitted
    refusal, _ = _busy_slow_check(1.0)
    assert refusal is None


def test_poisson_thresholds_are_the_counts_quantiles():
    from scheduler.admission import poisson_thresholds, sampled_arrivals
    thr = poisson_thresholds(0.9)
    assert thr[0] == pytest.approx(-np.log(0.9), rel=1e-6)  # P(N = 0) = 0.9
    m = thr[3]  # P(N <= 3) = 0.9 at mean m
    assert sum(np.exp(-m) * m ** j / np.prod(range(1, j + 1)) for j in range(4)) == pytest.approx(0.9)
    assert bool(np.all(np.diff(thr) > 0))
    paths = sampled_arrivals(64, 32)  # fixed: the gateway's and the simulator's the same
    assert paths is sampled_arrivals(64, 32) and len(paths) == 64
    assert np.mean([p[-1] for p in paths]) == pytest.approx(32, rel=0.1)


def test_slow_misses_fall_with_the_quantile_at_one_and_a_half_times_capacity():
    """The benchmark's simulated twin (the module doc's 4 x 8 slots at 47.8 req/s), workload
    seeds 0-2: the admitted Slow requests missing by > 10% fall by more than half, and no more
    Slow, Normal or Fast requests miss their target of all sent, with admission taking the
    upper quantile of the higher classes' arrivals (the default) than with their mean."""
    from dataclasses import replace

    from sims.options import add_run_args, parse_with_config, spec_from_args
    from sims.retry_after_bound import outcomes_over_seeds
    p = argparse.ArgumentParser()
    add_run_args(p)
    a = parse_with_config(p, [
        "--step-ms", "20", "--max-num-seqs", "8", "--backends", "4", "--rate", "47.8",
        "--num-requests", "600", "--input-len", "32", "--output-len", "uniform:1:80",
        "--slo-ttft-ms", "fast=150,normal=400,slow=1000", "--placement", "ttft",
        "--waiting-by-class", "--slot-model"])
    spec = spec_from_args(a)
    spec = replace(spec, scheduler=replace(spec.scheduler, admission=True))
    new = outcomes_over_seeds(spec, range(3))["total"]
    old = outcomes_over_seeds(spec, range(3), {"arrival_quantile": None})["total"]
    assert new["slow"]["missed_by_10pct"] * 2 < old["slow"]["missed_by_10pct"]
    for c in ("fast", "normal", "slow"):
        assert new[c]["met"] >= old[c]["met"], c


# ---- the concurrency and the step known at start (issue 31, sixth session) -------------------
def _fresh(report: int | None, config: AdmissionConfig | None = None,
           running: int = 4) -> tuple[WaitPredictor, ManualClock]:
    """Backend 0 reported `report` slots (None: no report) and runs `running` requests that end
    3, 6, 9, ... steps from now; nothing has waited there yet (never seen full). The step is
    measured on backend 1 (backend 0's own finishes have not come)."""
    clock = ManualClock(100.0)
    p = WaitPredictor(config or AdmissionConfig(slot_model=True))
    p.clock = clock.now
    if report is not None:
        p.set_slots(0, report)  # the gateway, at its BackendInfo; the simulator, at start
    p.add_backend(0)
    _warm(p, clock, b=1)
    now = clock.now()
    for j in range(running):
        k = ("run", j)
        p.dispatched(0, NORMAL, k, 40)
        p.started(0, NORMAL, now + 3 * (j + 1) * STEP - 39 * STEP, 0.0, 0, key=k)
    return p, clock


def test_a_request_before_any_queue_was_seen_is_predicted_from_the_reported_slots():
    """The warm-up: every reported slot taken and no request has waited there yet. With the
    backend's max_num_seqs the slot model predicts the wait for the first slot to free; without
    it there is no concurrency to predict from and the gap model gives the bare service (the
    fifth session's warm-up misses: predicted ~40 ms, waited 0.45-0.9 s)."""
    p, clock = _fresh(4)
    be, now = p.backends[0], clock.now()
    assert be.slots == 4 and be.seen_slots == 0
    first_free = now + 3 * STEP
    assert p._slot_wait(be, FAST, 0, now) == pytest.approx(first_free - now)
    assert p.backend_ttft(0, FAST) == pytest.approx(first_free - now + STEP)
    # one free slot of 5: no wait
    p5, clock5 = _fresh(5)
    assert p5._slot_wait(p5.backends[0], FAST, 0, clock5.now()) == 0.0
    # no report (an HTTP server, a peer from before), or the option off: nothing to predict from
    for p0, c0 in (_fresh(None), _fresh(4, AdmissionConfig(slot_model=True, reported_slots=False))):
        assert p0._slot_wait(p0.backends[0], FAST, 0, c0.now()) is None
        assert p0.backend_ttft(0, FAST) < 3 * STEP


def test_a_backend_without_a_finish_takes_the_step_measured_on_the_others():
    p, clock = _fresh(4)
    be, fleet = p.backends[0], p.fleet_step
    assert be.num_steps == 0 and be.step == pytest.approx(STEP) == pytest.approx(fleet)
    # measured only (fleet_step off): no step there, the slot model is off until its own finish
    p0, c0 = _fresh(4, AdmissionConfig(slot_model=True, fleet_step=False))
    assert p0.backends[0].step == 0.0 and p0._slot_wait(p0.backends[0], FAST, 0, c0.now()) is None
    # its own first finish replaces the borrowed step, and later finishes elsewhere leave it
    clock.set(clock.now() + 3 * STEP)
    p.finished(0, ("run", 0), clock.now(), 40)  # 39 steps of 1.0 STEP: as measured ...
    own = be.step
    k = ("warm2", 1)
    p.dispatched(1, FAST, k, 3)
    p.started(1, FAST, clock.now(), STEP, 0, key=k)
    clock.set(clock.now() + 2 * 3 * STEP)  # ... and a slower one on backend 1: 3 STEP a token
    p.finished(1, k, clock.now(), 3)
    assert be.step == own and p.fleet_step > own
    # a backend that joins later starts from the fleet's
    p.add_backend(7)
    assert p.backends[7].step == pytest.approx(p.fleet_step)


def test_seen_full_below_the_report_the_backend_runs_what_was_seen():
    """A KV-bound backend (or one other gateways share): 4 of ours run while requests wait,
    though it reported 8. What ran is the figure from then on (at most the report), and a
    backend re-introducing itself with the same report keeps it."""
    p, clock = _fresh(8)
    be = p.backends[0]
    now = clock.now()
    p.dispatched(0, SLOW, "w1", 50)
    p.dispatched(0, SLOW, "w2", 50)
    assert p._slot_wait(be, FAST, 0, now) == 0.0  # 8 reported, 4 running: it believes free slots
    # the first running request ends (3 steps on); w1 starts in the next step, w2 still waits
    clock.set(now + 3 * STEP)
    p.finished(0, ("run", 0), clock.now(), 40)
    clock.set(now + 4 * STEP)
    p.started(0, SLOW, clock.now(), 4 * STEP, 0, key="w1")
    assert be.seen_slots == 4 and be.slots == 4
    now = clock.now()
    assert p._slot_wait(be, FAST, 0, now) == pytest.approx(100.0 + 6 * STEP + 6 * STEP - now)
    p.set_slots(0, 8)  # its BackendInfo again (a reconnect)
    assert be.slots == 4
    p.set_slots(0, 3)  # restarted with --max-num-seqs 3: never more than it says
    assert be.slots == 3
    p.set_slots(0, 0)  # unknown now: what was seen
    assert be.slots == 4


def test_the_count_of_a_full_backend_includes_the_requests_ending_in_that_step():
    """Seen full at a start: the requests whose last token comes in the same step held their
    slots in it (in the simulator 8 of 8 was read in 64% of the counts before, 86% after)."""
    p, clock = _fresh(None, running=0)
    be = p.backends[0]
    now = clock.now()
    for j in range(4):  # 4 running; the first ends at +3 steps, the others later
        k = ("run", j)
        p.dispatched(0, NORMAL, k, 40)
        p.started(0, NORMAL, now + 3 * (j + 1) * STEP - 39 * STEP, 0.0, 0, key=k)
    p.dispatched(0, SLOW, "w0", 50)  # the first to wait ...
    p.dispatched(0, SLOW, "w1", 50)
    p.dispatched(0, SLOW, "w2", 50)
    clock.set(now + 2 * STEP)
    p.finished(0, ("run", 0), now + 3 * STEP, 40)  # ends in the step that ends at +3 (read first)
    clock.set(now + 3 * STEP)
    p.started(0, SLOW, clock.now(), 3 * STEP, 0, key="w0")  # started in that step: 5 ran in it
    assert be.seen_slots == 5  # 3 running + the one ending now + w0


def _warmup_misses(admission: dict | None) -> tuple[int, int, dict, dict]:
    """The benchmark's simulated twin (4 x 8 slots at 47.8 req/s), workload seeds 0-4:
    (Fast and Normal admitted missing by > 10% that arrived in the first 2.2 s, all admitted
    missing by > 10%, met per class, sent per class)."""
    from dataclasses import replace

    from sims.options import add_run_args, parse_with_config, spec_from_args
    from sims.retry_after_bound import base_run
    p = argparse.ArgumentParser()
    add_run_args(p)
    warm = total = 0
    met, sent = {0: 0, 1: 0, 2: 0}, {0: 0, 1: 0, 2: 0}
    for seed in range(5):
        a = parse_with_config(p, [
            "--step-ms", "20", "--max-num-seqs", "8", "--backends", "4", "--rate", "47.8",
            "--num-requests", "600", "--input-len", "32", "--output-len", "uniform:1:80",
            "--slo-ttft-ms", "fast=150,normal=400,slow=1000", "--placement", "ttft",
            "--waiting-by-class", "--slot-model", "--seed", str(seed)])
        spec = spec_from_args(a)
        spec = replace(spec, scheduler=replace(spec.scheduler, admission=True))
        base = base_run(spec, admission)
        ttft = base.result.first_token_time - base.workload.arrival_time
        for j, c in enumerate(base.classes):
            sent[c] += 1
            if j in base.retry_after_s:
                continue
            target = (0.15, 0.4, 1.0)[c]
            met[c] += ttft[j] <= target
            if ttft[j] > 1.1 * target:
                total += 1
                warm += c < 2 and base.workload.arrival_time[j] < 2.2
    return warm, total, met, sent


def test_warm_up_misses_go_with_the_slots_step_and_rate_known_at_start():
    """Seeds 0-4: the Fast and Normal misses of the warm-up (11 before) go, and all misses fall
    to less than a third (19 -> 2); no class meets 1% fewer of its requests, all together
    no fewer."""
    # the sixth session's settings alone (the seventh's contested free slot off on both sides:
    # it trades Slow requests met for misses, tested on its own below)
    new_warm, new_total, new_met, sent = _warmup_misses({"compete_steps": 0.0})
    old_warm, old_total, old_met, _ = _warmup_misses(
        {"reported_slots": False, "fleet_step": False, "rate_from_start": False,
         "compete_steps": 0.0})
    assert old_warm >= 8 and new_warm == 0
    assert new_total * 3 < old_total
    assert sum(new_met.values()) >= sum(old_met.values())
    for c in range(3):
        assert new_met[c] >= old_met[c] - 0.01 * sent[c], c


def test_the_simulator_seeds_each_backends_slots_from_its_max_num_seqs():
    from sims.options import add_run_args, parse_with_config, spec_from_args
    from sims.retry_after_bound import _loop
    from sims.workload import generate
    p = argparse.ArgumentParser()
    add_run_args(p)
    spec = spec_from_args(parse_with_config(p, [
        "--step-ms", "20", "--max-num-seqs", "6", "--backends", "3", "--num-requests", "20",
        "--slo-ttft-ms", "1000", "--admission", "--slot-model"]))
    loop = _loop(spec, generate(spec.workload))
    pred = loop.gateway.predictor
    assert pred._reported == {0: 6, 1: 6, 2: 6}
    pred.add_backend(1)
    assert pred.backends[1].slots == 6


def test_a_fresh_backends_arrival_rate_is_read_over_its_life_not_the_whole_window():
    """Issue 31: 1 s after a backend's first request, Fast requests sent there at 10/s read
    ~10/s (before: the count over the whole 2 s window, 3.9/s, and the first Slow requests were
    admitted on futures with too few arrivals); a first window placed at once reads its count
    over 0.5 s, not hundreds a second."""
    from scheduler.admission import RATE_MIN_SPAN_S
    count = sum(np.exp(-(1.0 - 0.1 * j) / 2.0) for j in range(11))  # decayed, 2 s window
    for from_start, expect in ((True, count / (2.0 * -np.expm1(-0.5))), (False, count / 2.0)):
        clock = ManualClock(0.0)
        p = WaitPredictor(AdmissionConfig(slot_model=True, rate_from_start=from_start))
        p.clock = clock.now
        for j in range(11):
            clock.set(j * 0.1)
            p.dispatched(0, FAST, ("f", j), 4)
        rate, _ = p.higher_rate(p.backends[0], SLOW, clock.now())
        assert rate == pytest.approx(expect, rel=1e-6), from_start
        assert (9.5 < rate < 11.5) if from_start else rate < 5.0
    clock = ManualClock(0.0)
    p = WaitPredictor(AdmissionConfig(slot_model=True))
    p.clock = clock.now
    for j in range(8):
        p.dispatched(0, FAST, ("w", j), 4)
    clock.set(0.01)
    rate, _ = p.higher_rate(p.backends[0], SLOW, clock.now())
    assert rate == pytest.approx(8 / (2.0 * -np.expm1(-RATE_MIN_SPAN_S / 2.0)), rel=0.02)


# ---- a free slot contested by the higher classes' next arrivals (issue 31, seventh session) --
def _free_slot_slow_check(rate_per_s: float, since_tick_steps: float = 0.0, window_s: float = 0.0,
                          **config) -> tuple[object, float, float]:
    """One backend of 4 reported slots, 3 Slow running (ending 3, 6, 9 steps from now), nothing
    queued: one slot free. Normal requests of 40 tokens (0.4 s a slot) sent there at
    `rate_per_s`; the last token seen `since_tick_steps` steps ago. A Slow request checked
    with a 1 s deadline: (the check's Refusal or None, its point prediction, its wait at the
    admission quantile)."""
    from scheduler.admission import AdmissionControl
    from scheduler.slo import SLOTargets
    slo = SLOTargets.parse("fast=150,normal=400,slow=1000", None)
    clock = ManualClock(100.0)
    p = WaitPredictor(AdmissionConfig(slot_model=True, slo=slo, **config))
    p.clock = clock.now
    _warm(p, clock)  # its finish is the last token seen
    p.set_slots(0, 4)
    now = clock.now()
    for j in range(3):
        k = ("run", j)  # Slow: not among the higher classes' arrivals
        p.dispatched(0, SLOW, k, 40)
        p.started(0, SLOW, now + 3 * (j + 1) * STEP - 39 * STEP, 0.0, 0, key=k)
    be = p.backends[0]
    be.tick = now - since_tick_steps * STEP
    be.arr_t0 = now - 60.0
    for j in range(round(2.0 * rate_per_s)):
        p.dispatched(0, NORMAL, ("n", j), 40)
        p.gone(0, NORMAL, ("n", j))
    assert len(p._live_finishes(be, now)) == 3 and not be.queued and be.slots == 4
    adm = AdmissionControl(p.config, p)
    point = p.backend_ttft(0, SLOW)
    upper = p.backend_ttft(0, SLOW, quantile=p.config.arrival_quantile)
    return adm.check(SLOW, [0, 0, 0], window_s, now=now), point, upper


def test_a_free_slot_is_contested_by_the_higher_classes_arriving_before_the_next_step():
    """Live, Slow requests predicted to start at once waited 1.7-2.5 s: a Normal request sent
    0.2 ms later took the one free slot at the backend's next step (Fast first), then Fast and
    Normal arrivals every slot that freed. At 30 Normal arrivals/s on 4 slots of 0.4 s (10
    starts/s) one arrives within the next 10 ms step with p = 0.26: the Slow request is
    refused; its Retry-After (the point estimate, the free slot) is unchanged."""
    refusal, point, upper = _free_slot_slow_check(30.0)
    assert refusal is not None and upper > 1.0
    assert point == pytest.approx(1.5 * STEP) and refusal.retry_after_s == pytest.approx(point)
    # the free slot its own for certain (before): admitted, the quantile's wait the point's
    refusal, point, upper = _free_slot_slow_check(30.0, compete_steps=0.0)
    assert refusal is None and upper == pytest.approx(point)
    # few arrivals (p = 0.005 <= 1 - 0.99 of losing the slot): admitted
    refusal, _, upper = _free_slot_slow_check(0.5)
    assert refusal is None and upper == pytest.approx(point)


def test_the_contest_lasts_until_the_backends_next_step_starts():
    """The window ends at the next step's start read from the last token seen: a check 0.99
    steps after a step ended has 0.1 ms of arrivals to lose to (p = 0.003): admitted; with
    the whole step as the window (compete_phase off) refused."""
    refusal, _, _ = _free_slot_slow_check(30.0, since_tick_steps=2.99)
    assert refusal is None
    refusal, _, _ = _free_slot_slow_check(30.0, since_tick_steps=2.99, compete_phase=False)
    assert refusal is not None


def test_the_lost_slot_wait_is_a_conditional_quantile_of_the_futures():
    """Losing the free slot with p: the wait's 0.99-quantile is the (1 - 0.01 / p)-quantile of
    the waits given the loss: at 3 Normal arrivals/s, p = 1 - e^-0.03 = 0.03 (level 0.66),
    past the first slot to free (3 steps from now) and short of the longest future's wait."""
    import math
    assert 1.0 - math.exp(-0.03) > 0.01
    _, point, upper = _free_slot_slow_check(3.0)
    assert upper >= 3 * STEP + STEP > point
    _, _, longest = _free_slot_slow_check(3.0, arrival_quantile=0.999999)
    assert upper < longest


def test_a_batching_windows_arrivals_contest_the_free_slot_too():
    """`compete_window` (issue 31, ninth session): a Slow request checked 0.1 ms before the
    backend's next step (p = 0.003 of losing the slot to 30 Normal arrivals/s) but held 50 ms
    in its batching window competes with the arrivals of those 50 ms as well (m = 30 x 0.05 s
    + the phase at the flush: p > 0.77): refused. Off, or with no window to wait, admitted as
    before; on, the decision no longer turns on the phase (0.1 ms or 5 ms before the step)."""
    refusal, _, _ = _free_slot_slow_check(30.0, since_tick_steps=2.99, window_s=0.05)
    assert refusal is None  # off (the default): the 0.1 ms to the step alone
    for since in (2.99, 2.5):
        refusal, _, _ = _free_slot_slow_check(30.0, since_tick_steps=since, window_s=0.05,
                                              compete_window=True)
        # its Retry-After is the point estimate: the window, then a free slot's start
        assert refusal is not None and refusal.retry_after_s == pytest.approx(0.05 + 1.5 * STEP)
    refusal, _, _ = _free_slot_slow_check(30.0, since_tick_steps=2.99, window_s=0.0,
                                          compete_window=True)
    assert refusal is None


def test_slow_misses_fall_with_the_contested_free_slot_at_one_and_a_half_times_capacity():
    """The benchmark's simulated twin (4 x 8 slots at 47.8 req/s), workload seeds 0-9: the
    admitted missing their deadline by > 10% fall by more than half (11 -> 4) and Slow ones
    too (5 -> 2); Fast and Normal meet no fewer (fewer Slow requests hold slots)."""
    from dataclasses import replace

    from sims.options import add_run_args, parse_with_config, spec_from_args
    from sims.retry_after_bound import outcomes_over_seeds
    p = argparse.ArgumentParser()
    add_run_args(p)
    spec = spec_from_args(parse_with_config(p, [
        "--step-ms", "20", "--max-num-seqs", "8", "--backends", "4", "--rate", "47.8",
        "--num-requests", "600", "--input-len", "32", "--output-len", "uniform:1:80",
        "--slo-ttft-ms", "fast=150,normal=400,slow=1000", "--placement", "ttft",
        "--waiting-by-class", "--slot-model"]))
    spec = replace(spec, scheduler=replace(spec.scheduler, admission=True))
    new = outcomes_over_seeds(spec, range(10))["total"]
    old = outcomes_over_seeds(spec, range(10), {"compete_steps": 0.0})["total"]
    miss = {k: sum(d[c]["missed_by_10pct"] for c in ("fast", "normal", "slow"))
            for k, d in (("new", new), ("old", old))}
    assert miss["new"] * 2 < miss["old"]
    assert new["slow"]["missed_by_10pct"] < old["slow"]["missed_by_10pct"]
    for c in ("fast", "normal"):
        assert new[c]["met"] >= old[c]["met"], c
