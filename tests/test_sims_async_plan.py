"""The simulator's model of the engine's async loop (`EngineConfig.async_plan_lead_s`, issue 18):
on CUDA the engine plans each step while the one before it runs, so a request delivered after that
plan waits one step more than in the synchronous loop. Closed-form timings on a cost model with
fixed prefill / decode step times."""
import numpy as np
import pytest

from scheduler.batcher import BatcherConfig
from sims.adapters import SimSchedulerConfig
from sims.event_loop import EngineConfig, simulate
from tests.sim_helpers import DECODE_S, PREFILL_S, TwoSpeedCost, workload

# windows of one, flushed ~0.16 ms after they open (the design card's target rate): these tests
# place arrivals against step boundaries, and the default window (5 ms while busy) would move them
ONE_BY_ONE = SimSchedulerConfig(batcher=BatcherConfig(target_throughput=8000.0))


def run(w, lead, prefill_deadline=True):
    return simulate(w, TwoSpeedCost(), ONE_BY_ONE,
                    EngineConfig(num_samples=1, max_stretch_steps=1, async_plan_lead_s=lead,
                                 prefill_launch_deadline=prefill_deadline))


def test_request_delivered_during_a_prefill_step_joins_the_next_step_before_the_deadline():
    # A's prefill step runs [dA, dA + 0.1]; B is delivered 50 ms into it
    w = workload([0.0, 0.05], [20, 3])
    sync, asyn = run(w, None), run(w, 0.002)
    d_a, d_b = sync.dispatch_time
    assert d_a < d_b < d_a + PREFILL_S
    np.testing.assert_array_equal(asyn.dispatch_time, sync.dispatch_time)
    # synchronous: B's prefill is the next step (planned at the prefill step's end)
    assert sync.first_token_time[1] == pytest.approx(d_a + 2 * PREFILL_S)
    # async with a launch deadline for prefill steps (the engine now): planned 2 ms before the
    # prefill step's end, after B's delivery, so the same step as in the synchronous loop
    np.testing.assert_allclose(asyn.first_token_time, sync.first_token_time)
    # the engine before it planned the next step when A's prefill step started (A's decode
    # only): B waits for the step after that
    old = run(w, 0.002, prefill_deadline=False)
    assert old.first_token_time[1] == pytest.approx(d_a + PREFILL_S + DECODE_S + PREFILL_S)
    assert old.first_token_time[0] == sync.first_token_time[0] == pytest.approx(d_a + PREFILL_S)


def test_request_delivered_within_the_lead_of_a_prefill_step_waits_a_step_more():
    w = workload([0.0], [20])
    d_a = run(w, None).dispatch_time[0]
    lead = 0.005
    w = workload([0.0, d_a + PREFILL_S - 0.002], [20, 3])  # inside the last 5 ms of A's prefill
    sync, asyn = run(w, None), run(w, lead)
    assert sync.dispatch_time[1] > d_a + PREFILL_S - lead
    assert sync.first_token_time[1] == pytest.approx(d_a + 2 * PREFILL_S)
    assert asyn.first_token_time[1] == pytest.approx(d_a + PREFILL_S + DECODE_S + PREFILL_S)


def test_request_delivered_within_the_lead_of_a_decode_step_waits_a_step_more():
    lead = 0.005
    # A decodes alone from dA + 0.1 in 20 ms steps; C arrives 2.5 ms before one ends (inside the
    # lead: missed), D 10 ms before the next one ends (before the lead: taken)
    base = run(workload([0.0], [40]), None).dispatch_time[0]
    c_at = base + PREFILL_S + 2 * DECODE_S - 0.0025
    w = workload([0.0, c_at], [40, 3])
    sync, asyn = run(w, None), run(w, lead)
    d_a, d_c = sync.dispatch_time
    step_end = d_a + PREFILL_S + 2 * DECODE_S
    assert d_a == base and step_end - lead < d_c < step_end
    assert sync.first_token_time[1] == pytest.approx(step_end + PREFILL_S)
    assert asyn.first_token_time[1] == pytest.approx(step_end + DECODE_S + PREFILL_S)

    d_at = base + PREFILL_S + 2 * DECODE_S - 0.010
    w = workload([0.0, d_at], [40, 3])
    sync, asyn = run(w, None), run(w, lead)
    assert sync.first_token_time[1] == pytest.approx(step_end + PREFILL_S)
    assert asyn.first_token_time[1] == pytest.approx(sync.first_token_time[1])


def test_the_async_loop_model_changes_nothing_for_an_idle_backend():
    """A request reaching an idle backend starts at once in both loops."""
    w = workload([0.0, 1.0, 2.0], [4, 4, 4])
    sync, asyn = run(w, None), run(w, 0.002)
    np.testing.assert_array_equal(asyn.first_token_time, sync.first_token_time)
    np.testing.assert_array_equal(asyn.finish_time, sync.finish_time)


def test_hidden_launch_is_charged_only_after_an_idle_spell():
    """ProfileCost(hide_launch=True) charges steps without the host's launch (the async loop
    runs it behind the step before); a step that starts on an idle engine pays it."""
    from sims.profile_cost import ProfileCost

    pts = np.array([(d, p, d * c + p) for c in (100, 300) for d in (0, 1, 4, 8) for p in (0, 64)
                    if d + p and (d or c == 100)],
                   dtype=np.float64)
    device = 0.010 + 0.001 * pts[:, 0] + 0.0001 * pts[:, 1]
    launch = 0.002 + 0.0 * pts[:, 0]
    plain = ProfileCost(pts, device + launch, launch_times_s=launch, num_blocks=4096)
    hidden = ProfileCost(pts, device + launch, launch_times_s=launch, hide_launch=True,
                         num_blocks=4096)
    assert plain.step_time(4, 0, 400) == pytest.approx(0.016)
    assert hidden.step_time(4, 0, 400) == pytest.approx(0.014)
    assert hidden.launch_time(4, 0) == pytest.approx(0.002)

    # one request on an idle engine, then decodes back to back: only its first step pays the launch
    w = workload([0.0], [4])
    cfg = EngineConfig(num_samples=1, max_stretch_steps=1, async_plan_lead_s=0.002)
    a = simulate(w, plain, ONE_BY_ONE, cfg)
    b = simulate(w, hidden, ONE_BY_ONE, cfg)
    d = a.dispatch_time[0]
    assert a.first_token_time[0] - d == pytest.approx(plain.step_time(0, 64, 64, [64]))
    assert b.first_token_time[0] - d == pytest.approx(hidden.step_time(0, 64, 64, [64]) + 0.002)
    # 3 decode steps after it, each 2 ms cheaper
    assert (a.finish_time[0] - a.first_token_time[0]) - (b.finish_time[0] - b.first_token_time[0]) \
        == pytest.approx(3 * 0.002)


def test_power_cap_slows_a_prefill_step_by_the_prefill_share_before_it():
    """ProfileCost(power_cap=True), from the profile's pause check: paused 50 ms, back to back
    55 ms (r = 1.1) with a 60 ms pause, so f_ref = 1 - 0.06 / 0.1 = 0.4; a prefill step after
    a prefill-busy share f of the last 100 ms takes 1 + 0.1 (f - 0.4) / 0.6 times longer (every
    such step alike: cap_by_compute=False; the compute share: tests/test_fidelity_grid_33b.py)."""
    from sims.profile_cost import ProfileCost

    pts = np.array([(d, p, d * c + p) for c in (100, 300) for d in (0, 1, 4, 8) for p in (0, 64)
                    if d + p and (d or c == 100)], dtype=np.float64)
    times = np.where(pts[:, 1] > 0, PREFILL_S, DECODE_S)
    meta = {"pause_ms": 60.0, "pause_check": {"runs": [
        {"run": "paused", "step_ms_median": 50.0}, {"run": "back_to_back", "step_ms_median": 55.0},
        {"run": "paused_again", "step_ms_median": 50.0}]}}
    cost = ProfileCost(pts, times, num_blocks=4096, meta=meta, power_cap=True, cap_by_compute=False)
    assert ProfileCost(pts, times, num_blocks=4096, meta=meta).prefill_slowdown(1.0) == 1.0
    assert cost.prefill_slowdown(0.0) == cost.prefill_slowdown(0.4) == 1.0
    assert cost.prefill_slowdown(1.0) == pytest.approx(1.1)
    assert cost.prefill_slowdown(0.7) == pytest.approx(1.05)

    # A's prefill [d, d + 0.1]; B arrives during it and is prefilled in the step right after A's
    # first decode step (async loop): that step starts 20 ms after A's prefill ended, so the 100 ms
    # before it held 80 ms of prefill (f = 0.8) -> x (1 + 0.1 * 0.4 / 0.6)
    w = workload([0.0, 0.05], [20, 3])
    cfg = EngineConfig(num_samples=1, max_stretch_steps=1, async_plan_lead_s=0.002,
                       prefill_launch_deadline=False)  # the engine the pause check ran on
    plain = simulate(w, ProfileCost(pts, times, num_blocks=4096, meta=meta), ONE_BY_ONE, cfg)
    capped = simulate(w, cost, ONE_BY_ONE, cfg)
    d = plain.dispatch_time[0]
    assert capped.first_token_time[0] == pytest.approx(plain.first_token_time[0])  # idle before A
    b_start = d + PREFILL_S + DECODE_S
    assert plain.first_token_time[1] == pytest.approx(b_start + PREFILL_S)
    assert capped.first_token_time[1] == pytest.approx(b_start + PREFILL_S * (1 + 0.1 * 0.4 / 0.6))


def test_power_cap_counts_decode_busy_time_from_the_after_decode_run():
    """Issue 35: with the pause check's after_decode run (its 60 ms pause filled with decode
    steps: 53 ms against 50 paused, a = 1.06 at a decode share g_ref = 0.6 -> r_dec = 1.1), a
    prefill step after a decode-only share g of the window is slower by 0.1 g on top of the
    prefill term; one after an idle spell is not."""
    from sims.profile_cost import ProfileCost

    pts = np.array([(d, p, d * c + p) for c in (100, 300) for d in (0, 1, 4, 8) for p in (0, 64)
                    if d + p and (d or c == 100)], dtype=np.float64)
    times = np.where(pts[:, 1] > 0, PREFILL_S, DECODE_S)
    runs = [{"run": "paused", "step_ms_median": 50.0}, {"run": "back_to_back", "step_ms_median": 55.0},
            {"run": "paused_again", "step_ms_median": 50.0}]
    meta = {"pause_ms": 60.0, "pause_check": {"runs": runs + [{"run": "after_decode", "step_ms_median": 53.0}]}}
    cost = ProfileCost(pts, times, num_blocks=4096, meta=meta, power_cap=True, cap_by_compute=False)
    old = ProfileCost(pts, times, num_blocks=4096, meta={"pause_ms": 60.0, "pause_check": {"runs": runs}},
                      power_cap=True, cap_by_compute=False)
    assert cost.prefill_slowdown(0.4, 0.6) == pytest.approx(1.06)  # the after_decode run itself
    assert cost.prefill_slowdown(0.0, 1.0) == pytest.approx(1.1)
    assert cost.prefill_slowdown(1.0, 0.0) == pytest.approx(1.1)  # back to back, as before
    assert old.prefill_slowdown(0.0, 1.0) == 1.0  # profiles without the run: no decode term

    # A (prefill at d, then 20 decode steps of 20 ms); B arrives 300 ms later, in A's decode-only
    # stretch (f = 0, g = 1): its prefill step x 1.1. A's own prefill, after idle: x 1.
    w = workload([0.0, 0.3], [20, 3])
    cfg = EngineConfig(num_samples=1, max_stretch_steps=1, async_plan_lead_s=0.002,
                       prefill_launch_deadline=False)
    plain = simulate(w, ProfileCost(pts, times, num_blocks=4096, meta=meta), ONE_BY_ONE, cfg)
    capped = simulate(w, cost, ONE_BY_ONE, cfg)
    assert capped.first_token_time[0] == pytest.approx(plain.first_token_time[0])
    b_plain = plain.first_token_time[1] - PREFILL_S
    assert capped.first_token_time[1] == pytest.approx(b_plain + PREFILL_S * 1.1)


def test_power_cap_takes_a_fully_busy_window_from_the_sustained_run():
    """Issue 35, session 14: the pause check's back-to-back run lasts ten steps (63 ms on the 6.7B:
    it read 0.91 x paused, no cap), its "sustained" run follows a second of the step back to back:
    r is the slower of the two against paused; profiles without the run as before."""
    from sims.profile_cost import ProfileCost

    pts = np.array([(d, p, d * c + p) for c in (100, 300) for d in (0, 1, 4, 8) for p in (0, 64)
                    if d + p and (d or c == 100)], dtype=np.float64)
    times = np.where(pts[:, 1] > 0, PREFILL_S, DECODE_S)
    runs = [{"run": "paused", "step_ms_median": 6.9}, {"run": "back_to_back", "step_ms_median": 6.3},
            {"run": "paused_again", "step_ms_median": 6.9}]

    def cap(extra):
        return ProfileCost(pts, times, num_blocks=4096, meta={"pause_ms": 60.0, "pause_check": {"runs": runs + extra}},
                           power_cap=True, cap_by_compute=False)

    assert cap([]).prefill_slowdown(1.0) == 1.0  # back to back under paused: no cap, as before
    assert cap([{"run": "sustained", "step_ms_median": 7.59}]).prefill_slowdown(1.0) == pytest.approx(1.1)
    assert cap([{"run": "sustained", "step_ms_median": 7.59}]).prefill_slowdown(0.7) == pytest.approx(1.05)
    assert cap([{"run": "sustained", "step_ms_median": 6.5}]).prefill_slowdown(1.0) == 1.0
