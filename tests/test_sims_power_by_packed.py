"""Issue 35, session 18 (H35P): the pause check's "sustained_packed" run as the power cap's third anchor.

The run (the grid's largest prefill-only step, k prompts of p / k tokens, paused and back to back)
gives r_packed = sustained / paused; with `cap_by_power` its weight w_packed is the busy share at
which the factor gives r_packed (as the mixed step's), and steps with prefill are weighted by token
rate through (0, 0), the mixed step's, the pause check step's and the packed step's anchors, held
past the end. Where the pause check's step does not throttle (r <= 1) and the packed one does, the
packed step is the factor's reference (its ratio, its trace's tau, its paused duty as f_ref). A
profile without the run is charged exactly as before. Closed forms throughout."""
import numpy as np
import pytest

from sims.profile_cost import ProfileCost, ewma_duty_ref
from tests.test_sims_power_by_kind import _law, _mixed, _trace

REF = 1e3 * _law(0, 512)  # the pause check's step (512 tokens, prefill only), ms
BIG = 1e3 * _law(0, 2048)  # the packed step (2,048 tokens in 4 prompts; the law ignores k), ms


def _rate(d, p):
    """A step's token rate over the pause check step's."""
    return (d + p) / _law(d, p) / (512 / _law(0, 512))


def _packed(r_packed, tau=None, p=2048, k=4):
    run = {"run": "sustained_packed", "num_decode_seqs": 0, "num_prefill_tokens": p, "num_prefill_seqs": k,
           "decode_context_len": 0, "paused_ms_median": BIG, "step_ms_median": BIG * r_packed}
    if tau is not None:  # a trace settling at r_packed x paused with time constant tau
        ts, ms = _trace(tau, BIG * r_packed - 2.0, 2.0)
        run.update(trace_t_ms=ts, trace_ms=ms)
    return run


def _cost(packed=None, mixed=None, r=1.12, tau=0.02, cap_by_compute=False, cap_by_power=True,
          after_decode=None):
    pts = [(d, p, d * c + p, 1) for c in (100, 300) for d in (0, 1, 4, 8, 16, 32) for p in (0, 64, 256, 512)
           if d + p and (d or c == 100)]
    pts += [(0, p, p, k) for p in (1024, 2048) for k in (1, 2, 4)]
    times = np.array([_law(d, p) for d, p, _, _ in pts])
    ts, ms = _trace(tau, REF * r - 0.5, 0.5)
    runs = [{"run": "paused", "step_ms_median": REF}, {"run": "back_to_back", "step_ms_median": REF},
            {"run": "paused_again", "step_ms_median": REF},
            {"run": "sustained", "step_ms_median": REF * r, "trace_t_ms": ts, "trace_ms": ms}]
    if after_decode is not None:
        runs.append({"run": "after_decode", "step_ms_median": REF * after_decode})
    runs += [x for x in (mixed, packed) if x is not None]
    meta = {"pause_ms": 60.0, "pause_check": {"num_prefill_tokens": 512, "runs": runs}}
    return ProfileCost(np.array(pts, dtype=float), times, num_blocks=4096, meta=meta, power_cap=True,
                       cap_by_compute=cap_by_compute, ctx_quantum=1, cap_by_power=cap_by_power)


def test_the_packed_runs_weight_gives_its_sustained_ratio_past_the_check_steps():
    cost = _cost(_packed(1.2), _mixed(1.03))
    f_ref, r = cost.power_cap_f_ref, cost.sustained_fit["r"]
    assert r == pytest.approx(1.12, abs=2e-3)
    w_packed = f_ref + (1 - f_ref) * 0.2 / (r - 1)  # above 1: it throttles more than the 512 step
    assert cost.cap_packed["w_packed"] == pytest.approx(w_packed) and w_packed > 1
    assert cost.cap_packed["reference"] == "check" and cost.cap_packed["w_check"] == 1.0
    assert cost.cap_packed["rate_packed"] == pytest.approx(_rate(0, 2048))
    # back to back the packed step holds the share at its weight: the factor gives r_packed
    chunks = [512] * 4
    assert cost.cap_weight(0, 2048, 2048, chunks) == pytest.approx(w_packed)
    assert cost.prefill_slowdown(w_packed) == pytest.approx(1.2)
    # the 512-token step and the mixed one keep their weights (1 and the two-anchor model's w_mix)
    assert cost.cap_weight(0, 512, 512) == pytest.approx(1.0)
    w_mix = f_ref + (1 - f_ref) * 0.03 / (r - 1)
    assert cost.cap_weight(32, 256, 32 * 100 + 256) == pytest.approx(w_mix)
    assert cost.cap_mixed["w_mix"] == pytest.approx(w_mix)
    # a step between the 512 step's rate and the packed one's: linear in token rate between them
    x = _rate(0, 1024)
    assert 1 < x < _rate(0, 2048)
    want = 1 + (x - 1) / (_rate(0, 2048) - 1) * (w_packed - 1)
    assert cost.cap_weight(0, 1024, 1024, [256] * 4) == pytest.approx(want)
    # below the 512 step's rate nothing changes (the mixed anchor's segment)
    x = _rate(4, 256)
    assert _rate(32, 256) < x < 1
    assert cost.cap_weight(4, 256, 656) == pytest.approx(
        w_mix + (x - _rate(32, 256)) / (1 - _rate(32, 256)) * (1 - w_mix))


def test_without_the_packed_run_the_weights_are_the_two_anchor_models():
    """Before the run (and without the opt-in) the packed step was weighted by extrapolation: held at
    the end, weight 1 past the 512 step's rate."""
    two = _cost(None, _mixed(1.03))
    three = _cost(_packed(1.2), _mixed(1.03))
    assert two.cap_packed is None and two.cap_weight(0, 2048, 2048, [512] * 4) == 1.0
    assert "by_power_packed" not in two.describe()["power_cap"]
    assert three.describe()["power_cap"]["by_power_packed"]["r_packed"] == pytest.approx(1.2)
    for d, p, ctx in ((32, 256, 3456), (0, 64, 64), (4, 256, 656), (0, 512, 512)):
        assert three.cap_weight(d, p, ctx) == two.cap_weight(d, p, ctx)
        assert three.step_time(d, p, ctx) == two.step_time(d, p, ctx)
    off = _cost(_packed(1.2), _mixed(1.03), cap_by_power=False)
    assert not off.weights_cap_by_power and off.cap_packed is None
    assert off.cap_weight(0, 2048, 2048, [512] * 4) == 1.0


def test_the_packed_run_alone_weighs_steps_with_prefill():
    """No mixed run: the anchors are (0, 0), the check step's (1, 1) and the packed step's."""
    cost = _cost(_packed(1.06))
    f_ref, r = cost.power_cap_f_ref, cost.sustained_fit["r"]
    assert cost.weights_cap_by_power and cost.cap_mixed is None
    w_packed = f_ref + (1 - f_ref) * 0.06 / (r - 1)  # below 1: it throttles less than the 512 step
    assert w_packed < 1
    assert cost.cap_weight(0, 2048, 2048, [512] * 4) == pytest.approx(w_packed)
    assert cost.cap_weight(0, 64, 64) == pytest.approx(_rate(0, 64))  # (0, 0) to (1, 1)
    assert cost.describe()["power_cap"]["by_power"] is None


def test_with_the_compute_share_the_packed_weight_divides_by_its_share():
    cost = _cost(_packed(1.2), _mixed(1.03), cap_by_compute=True)
    f_ref, r = cost.power_cap_f_ref, cost.sustained_fit["r"]
    s_ref = cost.compute_share(0, 512, 512)
    s_p = cost.compute_share(0, 2048, 2048, [512] * 4)
    assert s_p > s_ref  # a longer step: less of it is the constant
    w = cost.cap_weight(0, 2048, 2048, [512] * 4)
    assert w == pytest.approx(f_ref + (1 - f_ref) * 0.2 * s_ref / ((r - 1) * s_p))
    assert cost.prefill_slowdown(w, 0.0, s_p) == pytest.approx(1.2)


def test_where_the_check_step_does_not_throttle_the_packed_step_is_the_reference():
    """The 6.7B FP8 on the H200: the 512-token step back to back ran 0.97 of paused (the cap off)
    while the ~2,000-token packed steps throttled live. With the run the factor takes the packed
    step's line: r_packed, its trace's tau, f_ref its paused duty; the 512 and mixed steps, which do
    not slow down, weigh f_ref."""
    plain = _cost(None, _mixed(0.99), r=0.97)
    assert plain.prefill_slowdown(1.0) == 1.0 and not plain.weights_cap_by_power
    cost = _cost(_packed(1.08, tau=0.05), _mixed(0.99), r=0.97)
    tau = cost.power_cap_tau_s
    assert tau != pytest.approx(plain.power_cap_tau_s) and tau == pytest.approx(0.05, rel=0.2)
    assert cost.power_cap_window_s == pytest.approx(6 * tau)
    f_ref = ewma_duty_ref(BIG / 1e3, 0.06, tau)
    assert cost.power_cap_f_ref == pytest.approx(f_ref)
    r_p = cost.cap_packed["r_packed"]
    assert r_p == pytest.approx(1.08, abs=2e-3) and cost.cap_packed["reference"] == "packed"
    assert cost.cap_weight(0, 2048, 2048, [512] * 4) == pytest.approx(1.0)
    assert cost.prefill_slowdown(1.0) == pytest.approx(r_p)
    assert cost.cap_weight(0, 512, 512) == pytest.approx(f_ref) == cost.cap_packed["w_check"]
    assert cost.cap_weight(32, 256, 3456) == pytest.approx(f_ref)
    assert cost.prefill_slowdown(f_ref) == pytest.approx(1.0)
    # between the check step's rate and the packed one's: f_ref to 1, linear in token rate
    x = _rate(0, 1024)
    assert cost.cap_weight(0, 1024, 1024, [256] * 4) == pytest.approx(
        f_ref + (x - 1) / (_rate(0, 2048) - 1) * (1 - f_ref))


def test_the_reference_switch_keeps_the_check_steps_after_decode_term():
    """With the compute share, the factor's excess scales by a step's share over the reference's;
    moving the reference to the packed step rescales the after_decode term so that the check step
    after decode-only time runs as its after_decode run measured."""
    kw = {"r": 0.97, "cap_by_compute": True, "after_decode": 1.03}
    plain = _cost(None, None, **kw)
    cost = _cost(_packed(1.08, tau=0.05), None, **kw)
    s_c = cost.compute_share(0, 512, 512)
    for g in (0.2, 0.5, 1.0):
        assert cost.prefill_slowdown(0.0, g, s_c) == pytest.approx(plain.prefill_slowdown(0.0, g, s_c))
    s_p = cost.compute_share(0, 2048, 2048, [512] * 4)
    assert cost.prefill_slowdown(1.0, 0.0, s_p) == pytest.approx(cost.cap_packed["r_packed"])


def test_a_packed_run_that_does_not_throttle_either_leaves_the_cap_off():
    cost = _cost(_packed(0.99), _mixed(0.99), r=0.97)
    plain = _cost(None, _mixed(0.99), r=0.97)
    assert not cost.weights_cap_by_power and cost.cap_weight(0, 2048, 2048, [512] * 4) == 1.0
    assert cost.power_cap_tau_s == plain.power_cap_tau_s and cost.power_cap_f_ref == plain.power_cap_f_ref
    assert cost.prefill_slowdown(1.0) == plain.prefill_slowdown(1.0) == 1.0


def test_the_committed_h200_profiles_are_charged_as_before():
    """No committed profile has the run: their step costs, weights and factors are those of the
    model before it (values from the tree before the change, 26189be; bench/results/
    fidelity_packed_s18/identity.py compares every committed profile and form in full). The
    cached-prefix term as it was then (`prefix_term="fit"`; the twins' term since session 26 moves
    the charges of steps with prefill chunks, tests/test_sims_prefix_twins.py), and any compute knee
    (`knee_support=0`; since session 27 a knee needs support past it, which moves the 33B
    FP8's from 1,152 to 1,024 tokens: tests/test_sims_knee_support.py)."""
    from pathlib import Path
    res = Path(__file__).resolve().parents[1] / "bench" / "results"
    s17 = res / "fidelity_grid_h200_s17" / "33b-fp8" / "profile_33b-fp8.json"
    s13 = res / "fidelity_grid_h200_s13" / "33b-seeds" / "profile_33b-seeds.json"
    if not s17.exists() or not s13.exists():
        pytest.skip("no committed H200 profiles")
    want = {
        s17: [((0, 2048, 2048, [512] * 4), 0.12481450966667279, 1.0, 1.1197668115646768),
              ((40, 1920, 26176, [(256, 256), 512, 512, 512, 128]), 0.12886394908339577, 1.0, 1.120214160107229),
              ((32, 256, 20736, None), 0.03326547600002528, 0.24348182704044175, 1.0805887829134575),
              ((48, 0, 28800, None), 0.01731118645833618, 0.0, 1.031361651941961)],
        s13: [((0, 2048, 2048, [512] * 4), 0.2055924109999978, 1.0, 1.0995549111483343),
              ((32, 256, 20736, None), 0.03784276097057239, 1.0, 1.0671976323289563)],
    }
    for path, rows in want.items():
        cost = ProfileCost.from_json(path, hide_launch=True, power_cap=True, cap_by_power=True,
                                     prefix_term="fit", knee_support=0)
        assert cost.cap_packed is None
        for shape, t, w, slow in rows:
            assert cost.step_time(*shape) == pytest.approx(t, rel=1e-12)
            assert cost.cap_weight(*shape) == pytest.approx(w, rel=1e-12)
            assert cost.prefill_slowdown(0.8, 0.1, cost.compute_share(*shape)) == pytest.approx(slow, rel=1e-12)
