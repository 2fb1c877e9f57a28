"""Issue 35, session 41: the delayed onset (sims.profile_cost, "The delayed onset"; opt-in, `cap_onset="delay"`,
`validate_replay --cap-onset delay`).

On the H100 the live steps with prefill run at the paused profile's time for the first ~80 ms of a run of such steps
back to back, then at the level of the profile's streamed mixed step; the card's own sustained trace shows the same
delay. With "delay" a step with prefill pays that level for its part past the delay and nothing else of the cap;
decode-only steps and idle spells end a run. Closed forms on the power-by-kind tests' step-time law."""
import numpy as np
import pytest

from sims.profile_cost import ProfileCost, fit_cap_delay
from tests.test_sims_power_by_kind import REF, _law

R_STREAM = 1.05
BASE_MS = 10.0  # the trace step's paused device time (the "stream_kind" prefill run's)
EARLY, LATE = 8, 30  # trace steps at 1.02, then at 1.10


def _meta(trace_late=1.10, with_mixed=True):
    dev = [BASE_MS * 1.02] * EARLY + [BASE_MS * trace_late] * LATE
    ts = list(np.cumsum([0.0] + dev[:-1]))
    runs = [{"run": "paused", "step_ms_median": REF}, {"run": "back_to_back", "step_ms_median": REF},
            {"run": "paused_again", "step_ms_median": REF},
            {"run": "sustained", "step_ms_median": REF, "trace_t_ms": ts, "trace_ms": [REF] * len(ts),
             "trace_device_ms": dev},
            {"run": "stream_kind", "kind": "prefill", "shape": [0, 512, 0, 1, 0], "ratio": 1.1,
             "paused_device_ms_median": BASE_MS}]
    if with_mixed:
        runs.append({"run": "stream_kind", "kind": "mixed", "shape": [32, 256, 100, 1, 0], "ratio": R_STREAM,
                     "paused_device_ms_median": 1e3 * _law(32, 256)})
    return {"pause_ms": 60.0, "pause_check": {"num_prefill_tokens": 512, "runs": runs}}


def _cost(meta=None, cap_onset="delay"):
    pts = [(d, p, d * c + p) for c in (100, 300) for d in (0, 1, 4, 8, 16, 32) for p in (0, 64, 256, 512)
           if d + p and (d or c == 100)]
    times = np.array([_law(d, p) for d, p, _ in pts])
    return ProfileCost(np.array(pts, dtype=float), times, num_blocks=4096, meta=meta or _meta(), power_cap=True,
                       ctx_quantum=1, cap_by_power=True, cap_onset=cap_onset)


def _share(d, p):
    return 1.0 - 4e-3 / _law(d, p)  # the law's constant is the weights' read


def test_the_delay_is_where_the_cards_trace_rises_and_the_level_its_streamed_mixed_step():
    spec = fit_cap_delay(_meta())
    assert spec["delay_s"] == pytest.approx(EARLY * BASE_MS * 1.02 / 1e3)  # the first step past halfway
    assert spec["r_stream"] == R_STREAM and spec["shape"][:3] == [32, 256, 100]
    assert spec["trace_early"] == pytest.approx(1.02) and spec["trace_settled"] == pytest.approx(1.10)
    assert fit_cap_delay(_meta(trace_late=1.02)) is None  # a trace that does not rise (the FP8 6.7B's)
    assert fit_cap_delay(_meta(with_mixed=False)) is None


def test_a_step_pays_the_level_for_its_part_past_the_delay_and_nothing_else_of_the_cap():
    cost = _cost()
    d_s = cost.cap_delay["delay_s"]
    assert cost.power_cap_window_s is None and not cost.caps_by_compute and cost.busy_level is None
    assert cost.prefill_slowdown(1.0) == 1.0  # the busy shares' cap is off
    full = 1 + (R_STREAM - 1) * _share(8, 64) / _share(32, 256)
    t = _law(8, 64)
    assert cost.delay_factor(8, 64, 8 * 100 + 64, None, 0.0, t) == 1.0  # the run's first step
    assert cost.delay_factor(8, 64, 8 * 100 + 64, None, d_s, t) == pytest.approx(full)
    # across the onset: its share of the step past it
    assert cost.delay_factor(8, 64, 8 * 100 + 64, None, d_s - 0.25 * t, t) == pytest.approx(1 + 0.75 * (full - 1))
    assert cost.delay_factor(8, 0, 800, None, 1.0, _law(8, 0)) == 1.0  # decode-only steps pay nothing
    # a profile without the runs it needs (every H200 profile so far): the default cap, untouched
    plain = _cost(_meta(with_mixed=False))
    assert plain.cap_delay is None and plain.power_cap_window_s is not None
    assert _cost(cap_onset="slow").cap_delay is None
    with pytest.raises(ValueError, match="slow, fast or delay"):
        _cost(cap_onset="late")


def test_in_the_event_loop_a_run_of_prefill_steps_pays_after_the_delay_and_decodes_end_it():
    """Twelve 64-token prompts at once, a budget of 80 tokens a step: steps with prefill back to back (each beside the
    decodes of the prompts before it), then decode-only steps. The run's steps before the delay take the law's time,
    those past it the level (the one across it its share past it), the decode steps the law's."""
    from scheduler.batcher import BatcherConfig
    from sims.adapters import SimSchedulerConfig
    from sims.event_loop import EngineConfig, simulate
    from tests.sim_helpers import workload

    cost = _cost()
    d_s = cost.cap_delay["delay_s"]
    sched = SimSchedulerConfig(batcher=BatcherConfig(target_throughput=8000.0), max_num_batched_tokens=80,
                               max_num_seqs=16)
    cfg = EngineConfig(num_samples=1, max_stretch_steps=1, async_plan_lead_s=0.002, prefill_launch_deadline=False,
                       record_steps=True)
    steps = simulate(workload([0.0] * 12, [20] * 12), cost, sched, cfg).extra["steps"]
    pre = [k for k, s in enumerate(steps) if s[3]]
    assert len(pre) >= 10
    paid, t0 = 0, None
    for k in range(pre[-1] + 1):
        if not steps[k][3]:  # a decode-only step ends the run (the batcher may hand the first prompt alone)
            assert steps[k + 1][0] - steps[k][0] == pytest.approx(_law(steps[k][2], 0), rel=1e-6)
            t0 = None
            continue
        start, dur, d = steps[k][0], steps[k + 1][0] - steps[k][0], steps[k][2]
        t0 = start if t0 is None else t0
        p = sum(n for _r, n, _s in steps[k][3])
        law = _law(d, p)
        run_s = start - t0
        frac = min(1.0, max(0.0, (run_s + dur - d_s) / dur))
        if run_s + law <= d_s:
            assert dur == pytest.approx(law, rel=1e-6)
        else:
            paid += 1
            assert dur > law * 1.001
            assert dur == pytest.approx(law * (1 + (R_STREAM - 1) * _share(d, p) / _share(32, 256) * frac), rel=1e-3)
    assert 3 <= paid < len(pre)
    k = pre[-1] + 1  # the first decode-only step: the law's time
    assert steps[k + 1][0] - steps[k][0] == pytest.approx(_law(steps[k][2], 0), rel=1e-6)


def test_the_live_step_scorer_charges_the_same():
    """`fidelity_steps.model_step_ms` on live steps: a run of steps with prefill, then a decode step, then another
    run: the second run starts its own clock."""
    from bench.simulator.fidelity_steps import model_step_ms

    cost = _cost()
    d_s = cost.cap_delay["delay_s"]
    tb = _law(4, 64)
    steps, t = [], 0.0
    for kind in ["p"] * 12 + ["d"] + ["p"] * 2:
        p = 64 if kind == "p" else 0
        dur = _law(4, p)
        steps.append({"d": 4, "p": p, "ctx": 400, "chunks": [(64, 0)] if p else [], "start": t, "end": t + dur,
                      "idle_before": False})
        t += dur
    ms = {k: v for k, v, _f in model_step_ms(cost, steps)}
    full = 1 + (R_STREAM - 1) * _share(4, 64) / _share(32, 256)
    assert ms[0] == pytest.approx(1e3 * tb, rel=1e-9)
    assert ms[11] == pytest.approx(1e3 * tb * full, rel=1e-9)  # 11 x 10.4 ms in: past the delay
    assert ms[12] == pytest.approx(1e3 * _law(4, 0), rel=1e-9)
    assert ms[13] == pytest.approx(1e3 * tb, rel=1e-9) and steps[13]["start"] - steps[12]["start"] < d_s


def test_before_the_delay_a_step_behind_another_pays_the_busy_level():
    """Where the profile timed its mixed step with no pause (the busy level, 1.04 here), the part of a step before
    the delay pays it when the step was launched behind another, and nothing after an idle spell."""
    meta = _meta()
    paused = 1e3 * _law(32, 256)
    meta["pause_check"]["runs"].append({"run": "sustained_mixed", "num_decode_seqs": 32, "num_prefill_tokens": 256,
                                        "decode_context_len": 100, "paused_ms_median": paused,
                                        "step_ms_median": paused, "paused_device_ms_median": paused,
                                        "spin_device_ms_median": paused * 1.04})
    cost = _cost(meta)
    assert cost.cap_delay["busy_level"] == pytest.approx(1.04)
    t, d_s = _law(8, 64), cost.cap_delay["delay_s"]
    assert cost.delay_factor(8, 64, 864, None, 0.0, t) == pytest.approx(1.04)
    assert cost.delay_factor(8, 64, 864, None, 0.0, t, after_step=False) == 1.0
    full = 1 + (R_STREAM - 1) * _share(8, 64) / _share(32, 256)
    assert cost.delay_factor(8, 64, 864, None, d_s - 0.5 * t, t) == pytest.approx(0.5 * 1.04 + 0.5 * full)
    assert _cost().cap_delay["busy_level"] == 1.0  # unmeasured: no level
