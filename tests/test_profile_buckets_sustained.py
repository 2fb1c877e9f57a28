"""Issue 35, session 15: the profile's decode-graph bucket points and the sustained-load trace.

1. A decode-only step of d sequences runs the decode graph of the smallest bucket >= d, so its time
   jumps past each bucket and rises with d inside it (live H200 6.7B: 16 -> 17 5.51 -> 5.95 ms). The
   profiler measures every bucket's first two batches; `ProfileCost` then interpolates inside each
   bucket only. Profiles without such points interpolate as before.
2. The pause check's "sustained" run times every step from an idle start (the trace); the cost model
   fits T(t) = A + B (1 - exp(-t / tau)) and reads the power cap's busy shares as exponential
   averages with that tau. Profiles without the trace keep the 100 ms window.
Closed forms throughout."""
import math

import numpy as np
import pytest

from bench.engine.profile import decode_bucket_shapes, step_shapes
from scheduler.batcher import BatcherConfig
from sims.adapters import SimSchedulerConfig
from sims.event_loop import EngineConfig, simulate
from sims.profile_cost import ProfileCost, ewma_duty_ref, fit_sustained_trace
from tests.sim_helpers import workload

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
LS = (512, 576, 640)


def _bucket(d):
    return next(b for b in BUCKETS if b >= d)


def _law(d, p, L):
    """Decode graph: the bucket's padded rows through the GEMMs (20 us a row), 10 us per real row,
    attention 0.1 us per context token; a prefill chunk 15 us a token over a mixed step's 1.5 ms."""
    t = 4.0e-3 + 1.0e-5 * d + 1.0e-7 * d * L
    if d and not p:
        t += 2.0e-5 * _bucket(d)
    if p:
        t += 1.5e-3 + 1.5e-5 * (d + p)
    return t


def _profile(first_batches: bool, **kw) -> ProfileCost:
    shapes = step_shapes([0, 1, 2, 4, 8, 16, 32, 64], [0, 256, 512], list(LS), [], [], None,
                         max_num_seqs=256, max_num_batched_tokens=2048, max_model_len=16384)
    shapes += decode_bucket_shapes(shapes, BUCKETS, list(LS), first_batches=first_batches)
    pts = np.array([(d, p, d * c + p) for d, p, c, _, _ in shapes], dtype=float)
    times = np.array([_law(d, p, c) for d, p, c, _, _ in shapes])
    return ProfileCost(pts, times, meta={"cuda_graph_decode_buckets": list(BUCKETS)}, ctx_quantum=1, **kw)


def test_the_profiler_measures_each_buckets_first_two_batches():
    shapes = step_shapes([0, 1, 2, 4, 8, 16, 32, 64], [0, 512], [512], [], [], None, max_num_seqs=256,
                         max_num_batched_tokens=2048, max_model_len=16384)
    old = decode_bucket_shapes(shapes, BUCKETS, [512])
    new = decode_bucket_shapes(shapes, BUCKETS, [512], first_batches=True)
    assert [d for d, *_ in old] == [24, 48]  # the session-14 profiler's
    assert [d for d, *_ in new] == [3, 5, 6, 9, 10, 17, 18, 24, 25, 26, 33, 34, 48, 49, 50]
    assert all(p == 0 and c == 512 for _, p, c, _, _ in new)


def test_decode_steps_are_charged_inside_their_bucket():
    new, old = _profile(True), _profile(False)
    assert new.interpolates_by_decode_bucket and not old.interpolates_by_decode_bucket
    for L in (512, 576, 600, 640):
        for d in range(1, 65):
            truth = _law(d, 0, L)
            # the law is linear in (d, ctx) inside a bucket: exact bucket by bucket
            assert new.step_time(d, 0, d * L) == pytest.approx(truth, rel=1e-6), (d, L)
    # across buckets (the points at the buckets alone), just past 16 the line from 16 to 24
    # charges 17 the level between them: low by most of the jump (0.16 ms of 6.6)
    assert old.step_time(17, 0, 17 * 576) / _law(17, 0, 576) < 0.98
    assert old.step_time(33, 0, 33 * 576) / _law(33, 0, 576) < 0.97
    # the first-batch points stay out of the regression: its coefficients, and so every step's
    # compute share (the power cap's scale) and every step with prefill, are the profile's without them
    np.testing.assert_allclose(new.coef, old.coef, rtol=1e-9, atol=1e-15)
    assert new.compute_share(0, 512, 512) == pytest.approx(old.compute_share(0, 512, 512), rel=1e-9)
    assert new.step_time(8, 256, 8 * 576 + 256) == pytest.approx(old.step_time(8, 256, 8 * 576 + 256))


def test_profiles_without_first_batch_points_interpolate_as_before():
    old = _profile(False)
    plain = _profile(False, decode_buckets=[])
    for d in (1, 3, 9, 17, 20, 33, 40, 49, 64, 80):
        assert old.step_time(d, 0, d * 580) == plain.step_time(d, 0, d * 580)


# ---- 2. the sustained trace ------------------------------------------------------------------------
def _trace(tau_s, start_ms=10.0, rise_ms=1.2, span_s=2.0, first_extra_ms=0.5):
    """Back-to-back steps from an idle start, T(t) = start + rise (1 - exp(-t / tau)); the first
    step also pays an idle launch (left out by the fit)."""
    t, ts, ms = 0.0, [], []
    while t < span_s:
        x = start_ms + rise_ms * -math.expm1(-t / tau_s) + (first_extra_ms if not ms else 0.0)
        ts.append(t)
        ms.append(x)
        t += x / 1e3
    return ts, ms


def test_fit_sustained_trace_recovers_the_level_and_the_time_constant():
    ts, ms = _trace(0.3)
    fit = fit_sustained_trace(ts, ms)
    assert fit["settled"] and fit["tau_s"] == pytest.approx(0.3, rel=0.03)
    # the steps of the first 50 ms are left out (the clock's rise from idle): A is the level then
    t_k = next(t for t in ts if t >= 0.05)
    assert fit["steady_ms"] == pytest.approx(11.2, rel=2e-3)
    assert fit["start_ms"] == pytest.approx(10.0 + 1.2 * -math.expm1(-t_k / 0.3), abs=0.03)
    # slower than the trace can settle (tau 3 s over 2 s): no extrapolation, the level at its end
    ts, ms = _trace(3.0)
    fit = fit_sustained_trace(ts, ms)
    end = 10.0 + 1.2 * -math.expm1(-ts[-1] / 3.0)
    assert not fit["settled"] and fit["steady_ms"] == pytest.approx(end, rel=3e-3)
    assert fit_sustained_trace(ts[:5], ms[:5]) is None


def test_ewma_duty_ref_closed_form():
    s, p, tau = 0.010, 0.060, 0.2
    x = (1 - math.exp(-s / tau)) * math.exp(-p / tau) / (1 - math.exp(-(s + p) / tau))
    assert ewma_duty_ref(s, p, tau) == pytest.approx(x)
    assert ewma_duty_ref(s, 0.0, tau) == pytest.approx(1.0)  # back to back: always busy
    # the periodic steady state: one cycle (busy s, then idle p) maps it onto itself
    after = (x + (1 - x) * -math.expm1(-s / tau)) * math.exp(-p / tau)
    assert after == pytest.approx(x)


def _cap_cost(extra_runs, tau=None):
    pts = np.array([(d, p, d * c + p) for c in (100, 300) for d in (0, 1, 4, 8) for p in (0, 64)
                    if d + p and (d or c == 100)], dtype=float)
    times = np.where(pts[:, 1] > 0, 0.010, 0.004)
    runs = [{"run": "paused", "step_ms_median": 10.0}, {"run": "back_to_back", "step_ms_median": 10.1},
            {"run": "paused_again", "step_ms_median": 10.0}, {"run": "after_decode", "step_ms_median": 10.3}]
    meta = {"pause_ms": 60.0, "pause_check": {"num_prefill_tokens": 64, "runs": runs + extra_runs}}
    return ProfileCost(pts, times, num_blocks=4096, meta=meta, power_cap=True, cap_by_compute=False)


def test_a_profile_with_the_trace_averages_the_busy_shares_with_its_time_constant():
    ts, ms = _trace(0.3)
    cost = _cap_cost([{"run": "sustained", "step_ms_median": 11.2, "trace_t_ms": [t * 1e3 for t in ts],
                       "trace_ms": ms}])
    tau = cost.power_cap_tau_s
    assert tau == pytest.approx(0.3, rel=0.03)
    assert cost.power_cap_window_s == pytest.approx(6 * tau)
    f_ref = ewma_duty_ref(0.010, 0.060, tau)
    assert cost.power_cap_f_ref == pytest.approx(f_ref)
    r = cost.sustained_fit["steady_ms"] / 10.0
    assert r == pytest.approx(1.12, rel=2e-3)
    assert cost.prefill_slowdown(1.0) == pytest.approx(r)
    assert cost.prefill_slowdown(f_ref) == 1.0
    assert cost.prefill_slowdown(0.5 * (1 + f_ref)) == pytest.approx(1 + (r - 1) / 2)
    # after_decode: its pauses ran decode steps (never idle), g = 1 - f_ref
    assert cost.prefill_slowdown(f_ref, 1 - f_ref) == pytest.approx(1.03)
    # without the trace: the 100 ms window and r from the slower of back to back and sustained
    old = _cap_cost([{"run": "sustained", "step_ms_median": 11.2}])
    assert old.power_cap_tau_s is None and old.power_cap_window_s == 0.1
    assert old.power_cap_f_ref == pytest.approx(0.4) and old.prefill_slowdown(1.0) == pytest.approx(1.12)


def test_the_simulator_weights_earlier_prefill_by_exp_minus_age_over_tau():
    """A's prefill step [d, d + Tp], A's decode step (Td), then B's prefill step beside A's decode:
    B's step starts Td after A's prefill ended, so its exponential prefill share is
    f = exp(-Td / tau) - exp(-(Td + Tp) / tau), its decode share g = 1 - exp(-(Tp + Td) / tau) - f
    (busy since d), and it takes Tp (1 + (r - 1)(f - f_ref) / (1 - f_ref) + (r_dec - 1) g)."""
    ts, ms = _trace(0.02)
    cost = _cap_cost([{"run": "sustained", "step_ms_median": 11.2, "trace_t_ms": [t * 1e3 for t in ts],
                       "trace_ms": ms}])
    tp, td = 0.010, 0.004
    assert cost.step_time(0, 64, 64) == pytest.approx(tp) and cost.step_time(1, 0, 65) == pytest.approx(td)
    tau, f_ref, r, r_dec = cost.power_cap_tau_s, cost.power_cap_f_ref, cost.sustained_fit["r"], cost._cap[2]
    assert tau == pytest.approx(0.02, rel=0.05)
    assert r_dec == pytest.approx(1 + 0.03 / (1 - f_ref))
    one = SimSchedulerConfig(batcher=BatcherConfig(target_throughput=8000.0))
    cfg = EngineConfig(num_samples=1, max_stretch_steps=1, async_plan_lead_s=0.002,
                       prefill_launch_deadline=False)
    res = simulate(workload([0.0, 0.005], [20, 3]), cost, one, cfg)
    d = res.dispatch_time[0]
    assert res.first_token_time[0] == pytest.approx(d + tp)  # after idle: f = 0
    b_start = d + tp + td  # the decode step: no prefill, not slowed (cap_by_compute=False)
    f = math.exp(-td / tau) - math.exp(-(td + tp) / tau)
    g = -math.expm1(-(tp + td) / tau) - f
    assert f > f_ref
    want = tp * (1 + (r - 1) * (f - f_ref) / (1 - f_ref) + (r_dec - 1) * g)
    assert res.first_token_time[1] == pytest.approx(b_start + want, rel=1e-9)
    # the same profile without the trace: the 100 ms window's shares (f = Tp / 0.1, g = Td / 0.1)
    old = _cap_cost([{"run": "sustained", "step_ms_median": 11.2}])
    res = simulate(workload([0.0, 0.005], [20, 3]), old, one, cfg)
    want = tp * (1 + 0.12 * max(0.0, 0.1 - 0.4) / 0.6 + (old._cap[2] - 1) * 0.04)
    assert res.first_token_time[1] == pytest.approx(res.dispatch_time[0] + tp + td + want, rel=1e-9)


def test_the_committed_profiles_load_as_before():
    """The committed H200 profiles have neither the first-batch points nor the trace: no bucket
    interpolation, the 100 ms window (their figures in BENCHMARKS stand)."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[1] / "bench/results"
    paths = [root / "fidelity_grid_h200_s14/6.7b/profile_6.7b.json", root / "fidelity_grid_h200_s11/33b/profile_33b.json"]
    if not all(p.is_file() for p in paths):
        pytest.skip("no committed H200 profiles")
    for p in paths:
        cost = ProfileCost.from_json(p, hide_launch=True, power_cap=True)
        assert not cost.interpolates_by_decode_bucket
        assert cost.power_cap_tau_s is None and cost.power_cap_window_s == 0.1
        assert cost.power_cap_f_ref == pytest.approx(0.4)


def test_plan_leads_by_kind_from_the_profiles_launch_times():
    """The engine's launch deadline (2 x host launch + 1 ms) on the profile's launch times per kind;
    the committed s14 6.7B profile: decode points 0.377 ms (1.75 ms, the one lead used so far),
    points with prefill 1.456 ms (3.91; the live loop planned 3.65 ms before a prefill step's end)."""
    from backend.engine.continuous import LAUNCH_SLACK_S
    from sims.profile_cost import PLAN_LEAD_SLACK_S, plan_leads
    assert PLAN_LEAD_SLACK_S == LAUNCH_SLACK_S
    doc = {"points": [{"num_prefill_tokens": 0, "launch_ms_median": x} for x in (0.3, 0.5, 0.4)]
           + [{"num_prefill_tokens": 64, "launch_ms_median": x} for x in (1.0, 2.0)]}
    leads = plan_leads(doc)
    assert leads["decode_only_s"] == pytest.approx(2 * 0.4e-3 + 1e-3)
    assert leads["with_prefill_s"] == pytest.approx(2 * 1.5e-3 + 1e-3)
    assert plan_leads({"points": [{"num_prefill_tokens": 0}]}) is None
    import json
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "bench/results/fidelity_grid_h200_s14/6.7b/profile_6.7b.json"
    if path.is_file():
        leads = plan_leads(json.loads(path.read_text()))
        assert leads["decode_only_s"] == pytest.approx(1.754e-3, abs=2e-6)
        assert leads["with_prefill_s"] == pytest.approx(3.91e-3, abs=1e-5)
