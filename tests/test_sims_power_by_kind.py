"""Issue 35, session 16 (H35F): the power cap's busy share weighted by each step kind's power.

The pause check's "sustained_mixed" run (the capped mixed step, d decodes beside one p-token chunk,
paused and back to back) gives r_mix; its weight w_mix is the busy share at which the factor gives
r_mix, the pause check step's weight is 1, and a step with prefill is weighted by its token rate
(tokens / its time) between them. Profiles without the run: every step with prefill weighs 1, as
before; `ProfileCost(cap_by_power=True)` turns it on (`sim validate` and `validate_replay` by default
since session 25, where the profile has the run). Closed forms throughout."""
import math

import numpy as np
import pytest

from scheduler.batcher import BatcherConfig
from sims.adapters import SimSchedulerConfig
from sims.event_loop import EngineConfig, simulate
from sims.profile_cost import ProfileCost, ewma_duty_ref
from tests.sim_helpers import workload


def _law(d, p):
    """4 ms a step, 0.2 ms a decode, 0.1 ms a prefill token (exact in the fit: no residuals)."""
    return 4e-3 + 2e-4 * d + 1e-4 * p


def _trace(tau_s, start_ms, rise_ms, span_s=2.0):
    t, ts, ms = 0.0, [], []
    while t < span_s:
        x = start_ms + rise_ms * -math.expm1(-t / tau_s)
        ts.append(t * 1e3)
        ms.append(x)
        t += x / 1e3
    return ts, ms


REF = 1e3 * _law(0, 512)  # the pause check's step (512 tokens, prefill only), ms


def _cost(mixed=None, tau=0.02, r=1.12, cap_by_compute=False, cap_by_power=True, decode_spells=True):
    pts = [(d, p, d * c + p) for c in (100, 300) for d in (0, 1, 4, 8, 16, 32) for p in (0, 64, 256, 512)
           if d + p and (d or c == 100)]
    times = np.array([_law(d, p) for d, p, _ in pts])
    ts, ms = _trace(tau, REF * r - 0.5, 0.5)
    runs = [{"run": "paused", "step_ms_median": REF}, {"run": "back_to_back", "step_ms_median": REF},
            {"run": "paused_again", "step_ms_median": REF},
            {"run": "sustained", "step_ms_median": REF * r, "trace_t_ms": ts, "trace_ms": ms}]
    if mixed is not None:
        runs.append(mixed)
    meta = {"pause_ms": 60.0, "pause_check": {"num_prefill_tokens": 512, "runs": runs}}
    return ProfileCost(np.array(pts, dtype=float), times, num_blocks=4096, meta=meta, power_cap=True,
                       cap_by_compute=cap_by_compute, ctx_quantum=1, cap_by_power=cap_by_power,
                       decode_spells=decode_spells)


def _mixed(r_mix, d=32, p=256, c=100):
    paused = 1e3 * _law(d, p)
    return {"run": "sustained_mixed", "num_decode_seqs": d, "num_prefill_tokens": p, "decode_context_len": c,
            "paused_ms_median": paused, "step_ms_median": paused * r_mix}


def test_the_mixed_runs_weight_gives_its_sustained_ratio_and_steps_interpolate_by_token_rate():
    cost = _cost(_mixed(1.03))
    assert cost.weights_cap_by_power
    f_ref, r = cost.power_cap_f_ref, cost.sustained_fit["r"]
    assert f_ref == pytest.approx(ewma_duty_ref(REF / 1e3, 0.06, cost.power_cap_tau_s))
    w_mix = f_ref + (1 - f_ref) * 0.03 / (r - 1)
    assert cost.cap_mixed["w_mix"] == pytest.approx(w_mix)
    # back to back the mixed step holds the share at its weight: the factor is its own ratio
    assert cost.cap_weight(32, 256, 32 * 100 + 256) == pytest.approx(w_mix)
    assert cost.prefill_slowdown(w_mix) == pytest.approx(1.03)
    # the pause check's step weighs 1 (its own trace's r), a decode-only step 0
    assert cost.cap_weight(0, 512, 512) == pytest.approx(1.0)
    assert cost.prefill_slowdown(1.0) == pytest.approx(r)
    assert cost.cap_weight(8, 0, 800) == 0.0
    # token rate over the reference step's: tokens / time, linear between (0, 0), the mixed
    # step's and (1, 1)
    rate = lambda d, p: (d + p) / _law(d, p) / (512 / _law(0, 512))
    assert cost.cap_mixed["rate_mix"] == pytest.approx(rate(32, 256))
    x = rate(0, 64)
    assert x < rate(32, 256)
    assert cost.cap_weight(0, 64, 64) == pytest.approx(x / rate(32, 256) * w_mix)
    x = rate(4, 256)
    assert rate(32, 256) < x < 1
    want = w_mix + (x - rate(32, 256)) / (1 - rate(32, 256)) * (1 - w_mix)
    assert cost.cap_weight(4, 256, 656) == pytest.approx(want)


def test_a_mixed_step_that_does_not_slow_sustained_weighs_the_paused_share():
    cost = _cost(_mixed(0.99))
    assert cost.cap_mixed["w_mix"] == pytest.approx(cost.power_cap_f_ref)
    assert cost.prefill_slowdown(cost.cap_weight(32, 256, 3456)) == pytest.approx(1.0)


def test_with_the_compute_share_the_mixed_weight_divides_by_its_share():
    cost = _cost(_mixed(1.03), cap_by_compute=True)
    f_ref, r = cost.power_cap_f_ref, cost.sustained_fit["r"]
    s_ref = cost.compute_share(0, 512, 512)
    s_mix = cost.compute_share(32, 256, 3456)
    assert cost.cap_mixed["w_mix"] == pytest.approx(f_ref + (1 - f_ref) * 0.03 * s_ref / ((r - 1) * s_mix))
    w = cost.cap_weight(32, 256, 3456)
    assert cost.prefill_slowdown(w, 0.0, s_mix) == pytest.approx(1.03)


def test_without_the_run_or_the_opt_in_every_prefill_step_weighs_one():
    for cost in (_cost(None), _cost(_mixed(1.03), cap_by_power=False)):
        assert not cost.weights_cap_by_power and cost.cap_mixed is None
        assert cost.cap_weight(32, 256, 3456) == 1.0 and cost.cap_weight(0, 64, 64) == 1.0
        assert cost.describe()["power_cap"]["by_power"] is None


def test_the_simulator_weights_each_prefill_span_by_its_kind():
    """A's prefill step (0, 64) [d, d + Tp], A's decode step (Td), then B's prefill beside A's
    decode: f = w_A (exp(-Td / tau) - exp(-(Td + Tp) / tau)), g = 1 - exp(-(Tp + Td) / tau) - f_u
    (f_u the unweighted share), and B takes T_B (1 + (r - 1) max(0, f - f_ref) / (1 - f_ref))."""
    one = SimSchedulerConfig(batcher=BatcherConfig(target_throughput=8000.0))
    cfg = EngineConfig(num_samples=1, max_stretch_steps=1, async_plan_lead_s=0.002,
                       prefill_launch_deadline=False)
    out = {}
    for name, mixed in (("weighted", _mixed(1.0)), ("plain", None)):
        cost = _cost(mixed, tau=0.02, r=1.5)
        res = simulate(workload([0.0, 0.005], [20, 3]), cost, one, cfg)
        tp, td, tb = _law(0, 64), _law(1, 0), _law(1, 64)
        tau, f_ref, r = cost.power_cap_tau_s, cost.power_cap_f_ref, cost.sustained_fit["r"]
        w = cost.cap_weight(0, 64, 64)
        assert w == (1.0 if mixed is None else pytest.approx(
            (64 / tp / (512 / _law(0, 512))) / cost.cap_mixed["rate_mix"] * f_ref))
        d = res.dispatch_time[0]
        assert res.first_token_time[0] == pytest.approx(d + tp)
        fu = math.exp(-td / tau) - math.exp(-(td + tp) / tau)
        f = w * fu
        want = tb * (1 + (r - 1) * max(0.0, f - f_ref) / (1 - f_ref))  # r_dec = 1 (no after_decode)
        assert res.first_token_time[1] == pytest.approx(d + tp + td + want, rel=1e-9)
        out[name] = res.first_token_time[1]
    assert out["weighted"] < out["plain"]  # the light prefill step weighs less: B slowed less


def test_the_committed_profiles_have_no_mixed_run_and_weigh_every_prefill_step_one():
    """No committed H200 profile has the "sustained_mixed" run yet: the simulator charges them as
    before (their figures in BENCHMARKS stand)."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[1] / "bench/results"
    paths = sorted(root.glob("fidelity_grid_h200_s1[1-6]/*/profile_*.json"))
    if not paths:
        pytest.skip("no committed H200 profiles")
    for p in paths:
        cost = ProfileCost.from_json(p, hide_launch=True, power_cap=True, cap_by_power=True)
        assert not cost.weights_cap_by_power and cost.cap_weight(32, 256, 20000) == 1.0


def test_the_weights_are_opt_in():
    """By default a profile with the run is charged as before (every prefill step weighs 1)."""
    pts = [(d, p, d * c + p) for c in (100, 300) for d in (0, 1, 4, 8, 16, 32) for p in (0, 64, 256, 512)
           if d + p and (d or c == 100)]
    plain = _cost(_mixed(1.03), cap_by_power=False)
    default = ProfileCost(np.array(pts, dtype=float), np.array([_law(d, p) for d, p, _ in pts]), num_blocks=4096,
                          meta=plain.meta, power_cap=True, cap_by_compute=False, ctx_quantum=1)
    assert not default.weights_cap_by_power and default.cap_weight(32, 256, 3456) == 1.0


def test_the_cap_by_power_flag_reaches_the_replays_cost_model():
    """`sim validate --cap-by-power` / `validate_replay --cap-by-power` (session 16; auto, on where
    the profile has the mixed step's run, the default since session 25): the term reaches
    CostSpec's ProfileCost only with the power cap and only where the profile has that run; off
    (or a profile without it) the terms read as before, without the key."""
    import json
    from pathlib import Path

    from bench.simulator.validate import model_terms
    from sims.runner import CostSpec

    res = Path(__file__).resolve().parents[1] / "bench" / "results"
    whatif = res / "fidelity_cost_s16" / "profile_s16_33b-fp8_whatif_mixed.json"  # has sustained_mixed
    plain = res / "fidelity_grid_h200_s16" / "33b-fp8" / "profile_33b-fp8.json"  # the call's: none
    doc = json.loads(whatif.read_text())
    on = model_terms(doc, 2e-3, cap_by_power="on")
    assert on == {"hide_launch": True, "power_cap": True, "cap_by_power": True}
    # auto, the default since session 25: on where the profile has the mixed step's sustained run
    assert model_terms(doc, 2e-3) == on
    off = model_terms(doc, 2e-3, cap_by_power="off")
    assert off == {"hide_launch": True, "power_cap": True}
    assert model_terms(json.loads(plain.read_text()), 2e-3) == {"hide_launch": True, "power_cap": True}
    assert "cap_by_power" not in model_terms(doc, 2e-3, power_cap="off", cap_by_power="on")
    assert CostSpec(model="tiny", profile=str(whatif), **on).build().weights_cap_by_power
    assert not CostSpec(model="tiny", profile=str(whatif), **off).build().weights_cap_by_power
    assert not CostSpec(model="tiny", profile=str(plain), **on).build().weights_cap_by_power


def _prefill_step_time(cost, arrivals, outputs):
    """The simulated duration of the last step with prefill tokens (the next step's start minus its
    own), and its decodes, from the event loop's step log."""
    one = SimSchedulerConfig(batcher=BatcherConfig(target_throughput=8000.0))
    cfg = EngineConfig(num_samples=1, max_stretch_steps=1, async_plan_lead_s=0.002,
                       prefill_launch_deadline=False, record_steps=True)
    res = simulate(workload(arrivals, outputs), cost, one, cfg)
    steps = res.extra["steps"]
    k = max(i for i, s in enumerate(steps) if s[3])
    return steps[k + 1][0] - steps[k][0], steps[k][2]


def _spell_then_prefill(tb: float) -> list[dict]:
    """Live steps for the scorer: A decoding alone for 0.5 s, then B's 64-token prompt beside it
    (the step that lasts `tb`)."""
    td = _law(1, 0)
    steps = [{"d": 1, "p": 0, "ctx": 64, "chunks": [], "start": i * td, "end": (i + 1) * td,
              "idle_before": False} for i in range(int(0.5 / td))]
    t0 = steps[-1]["end"]
    steps.append({"d": 1, "p": 64, "ctx": 64, "chunks": [(64, 0)], "start": t0, "end": t0 + tb,
                  "idle_before": False})
    return steps


def test_a_prefill_step_after_a_decode_spell_throttles_at_its_own_kinds_weight():
    """Issue 35, session 20 ("Decode spells"): B's 64-token prompt joins while A has decoded for
    0.5 s (tau 20 ms: the decode share g ~ 1, no prefill in the window). With the power-by-kind
    weights the decode spell counts at B's step's weight w_B: f = w_B g, and B's step takes
    T_B (1 + (r - 1) max(0, f - f_ref) / (1 - f_ref)); without them (every prefill step weighs 1,
    the model before) the spell does not count and B's step takes T_B (r_dec = 1)."""
    tb = _law(1, 64)
    cost = _cost(_mixed(1.3), tau=0.02, r=1.5)
    dt, d = _prefill_step_time(cost, [0.0, 0.5], [200, 3])
    assert d == 1
    w = cost.cap_weight(1, 64, 64 + 64)
    f_ref, r = cost.power_cap_f_ref, cost.sustained_fit["r"]
    assert w > f_ref  # B's kind throttles
    g = 1.0  # exp(-0.5 / 0.02): the spell fills the share to float precision
    want = tb * (1 + (r - 1) * (w * g - f_ref) / (1 - f_ref))
    assert dt == pytest.approx(want, rel=1e-6) and dt > 1.05 * tb
    # the same profile without the mixed run: no weights, the spell does not count
    plain = _cost(None, tau=0.02, r=1.5)
    dt0, _ = _prefill_step_time(plain, [0.0, 0.5], [200, 3])
    assert dt0 == pytest.approx(tb, rel=1e-6)
    # the live-step scorer charges the same (bench.simulator.fidelity_steps.model_step_ms)
    from bench.simulator.fidelity_steps import busy_shares, model_step_ms
    steps = _spell_then_prefill(tb)
    (_, ms, _), = [row for row in model_step_ms(cost, steps) if row[0] == len(steps) - 1]
    # its shares over the model's horizon (6 tau of the trace's fitted tau: g = 1 - e^-6, ~0.998)
    f_live, g_live = busy_shares(steps, len(steps) - 1, cost.power_cap_window_s, cost.power_cap_tau_s)
    assert f_live == 0.0 and 0.995 < g_live < 1.0
    assert ms == pytest.approx(1e3 * tb * (1 + (r - 1) * (w * g_live - f_ref) / (1 - f_ref)), rel=1e-9)


def test_without_decode_spells_a_prefill_step_after_a_decode_spell_keeps_its_paused_time():
    """Issue 35, session 25: the 33B bf16's pattern runs on the H200 (the mixed step with 1 / 3
    decode steps between, back to back) read 1.034 / 0.997 x paused where the spells term charged
    1.137 / 1.111. `decode_spells=False` (`validate_replay --decode-spells off`) keeps the
    power-by-kind weights and drops the spell's count: B's step after A's 0.5 s decode spell takes
    T_B, in the event loop and in the live-step scorer alike, while the weights stay."""
    tb = _law(1, 64)
    cost = _cost(_mixed(1.3), tau=0.02, r=1.5, decode_spells=False)
    assert cost.weights_cap_by_power and not cost.counts_decode_spells
    assert _cost(_mixed(1.3), tau=0.02, r=1.5).counts_decode_spells
    dt, d = _prefill_step_time(cost, [0.0, 0.5], [200, 3])
    assert d == 1 and dt == pytest.approx(tb, rel=1e-6)
    from bench.simulator.fidelity_steps import model_step_ms
    steps = _spell_then_prefill(tb)
    (_, ms, _), = [row for row in model_step_ms(cost, steps) if row[0] == len(steps) - 1]
    assert ms == pytest.approx(1e3 * tb, rel=1e-9)


def test_the_decode_spells_flag_reaches_the_replays_cost_model():
    """`validate_replay --decode-spells off` reaches CostSpec's ProfileCost only with the
    power-by-kind weights; its parser default keeps the term (on)."""
    from pathlib import Path

    from bench.simulator.validate_replay import parser
    from sims.runner import CostSpec

    assert parser().parse_args(["v.json", "d.jsonl.gz", "s.jsonl.gz"]).decode_spells == "on"
    assert parser().parse_args(["v.json", "d.jsonl.gz", "s.jsonl.gz", "--decode-spells", "off"]).decode_spells == "off"

    res = Path(__file__).resolve().parents[1] / "bench" / "results"
    whatif = res / "fidelity_cost_s16" / "profile_s16_33b-fp8_whatif_mixed.json"  # has sustained_mixed
    on = {"hide_launch": True, "power_cap": True, "cap_by_power": True}
    assert CostSpec(model="tiny", profile=str(whatif), **on).build().counts_decode_spells
    off = CostSpec(model="tiny", profile=str(whatif), **on, decode_spells=False).build()
    assert off.weights_cap_by_power and not off.counts_decode_spells


def test_the_live_step_scorer_weighs_the_prefill_history_by_kind_as_the_event_loop_does():
    """Session 25: with the power-by-kind weights the event loop counts each earlier prefill step's
    span at its kind's weight (`prefill_spans`); the live-step scorer (`fidelity_steps.busy_shares`,
    `model_step_ms`) counted them at 1. Two 256-token prompts back to back, no decodes, no spell:
    the second step's busy share is w_1 x the first's span share, in closed form, and its time is
    the factor at that share."""
    from bench.simulator.fidelity_steps import busy_shares, model_step_ms

    cost = _cost(_mixed(1.03), tau=0.02, r=1.5)
    t1 = _law(0, 256)
    steps = [{"d": 0, "p": 256, "ctx": 0, "chunks": [(256, 0)], "start": 0.0, "end": t1, "idle_before": True},
             {"d": 0, "p": 256, "ctx": 0, "chunks": [(256, 0)], "start": t1, "end": 2 * t1, "idle_before": False}]
    w = cost.cap_weight(0, 256, 256, [(256, 0)])
    assert 0.0 < w < 1.0  # a lighter kind than the pause check's 512-token step
    tau = cost.power_cap_tau_s
    plain, _ = busy_shares(steps, 1, cost.power_cap_window_s, tau)
    weighed, _ = busy_shares(steps, 1, cost.power_cap_window_s, tau, {0: w})
    assert plain == pytest.approx(1.0 - math.exp(-t1 / tau)) and weighed == pytest.approx(w * plain)
    rows = {k: (ms, f) for k, ms, f in model_step_ms(cost, steps)}
    assert rows[1][1] == pytest.approx(weighed)
    f_ref, r = cost.power_cap_f_ref, cost.sustained_fit["r"]
    want = t1 * (1 + (r - 1) * max(0.0, weighed - f_ref) / (1 - f_ref))
    assert rows[1][0] == pytest.approx(1e3 * want, rel=1e-9)
