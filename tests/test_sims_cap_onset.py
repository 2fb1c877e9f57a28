"""Issue 35, session 27: the power limiter's fast onset (sims.profile_cost, "The limiter's onset";
opt-in, `cap_onset="fast"`, `validate_replay --cap-onset fast`).

A sustained run's trace from idle reaches most of its slowdown within two or three steps (the 33B
bf16 on the H200: 29.7, 31.1, 32.5, 33.2 ms against 29.8 paused, then a slow drift to 33.5), which
the one-exponential fit, skipping the first 50 ms, reads as a slow tau (0.27 s). The fast form fits
both and reads the busy share at each time constant; no decode spell counts. Closed forms."""
import math

import numpy as np
import pytest

from scheduler.batcher import BatcherConfig
from sims.adapters import SimSchedulerConfig
from sims.event_loop import EngineConfig, simulate
from sims.profile_cost import ProfileCost, ewma_duty_ref, fit_cap_onset
from tests.sim_helpers import TimedStandInRunner, workload


def _law(d, p):
    """4 ms a step, 0.2 ms a decode, 0.1 ms a prefill token (exact in the fit: no residuals)."""
    return 4e-3 + 2e-4 * d + 1e-4 * p


REF = 1e3 * _law(0, 512)  # the pause check's step, ms


def _trace(a, tau_f, b, tau_s, span_s=2.0):
    """A step run back to back from idle, each step's time at its start: REF (1 + a (1 - e^-t/tau_f)
    + b (1 - e^-t/tau_s))."""
    t, ts, ms = 0.0, [], []
    while t < span_s:
        x = REF * (1 + a * -math.expm1(-t / tau_f) + b * -math.expm1(-t / tau_s))
        ts.append(t * 1e3)
        ms.append(x)
        t += x / 1e3
    return ts, ms


def _cost(onset="fast", a=0.09, tau_f=0.01, b=0.03, tau_s=0.3, r_mix=None):
    pts = [(d, p, d * c + p) for c in (100, 300) for d in (0, 1, 4, 8, 16, 32) for p in (0, 64, 256, 512)
           if d + p and (d or c == 100)]
    times = np.array([_law(d, p) for d, p, _ in pts])
    ts, ms = _trace(a, tau_f, b, tau_s)
    runs = [{"run": "paused", "step_ms_median": REF}, {"run": "back_to_back", "step_ms_median": REF},
            {"run": "paused_again", "step_ms_median": REF},
            {"run": "sustained", "step_ms_median": ms[-1], "trace_t_ms": ts, "trace_ms": ms}]
    if r_mix is not None:  # the capped mixed step's sustained run: the power-by-kind weights
        paused = 1e3 * _law(32, 256)
        runs.append({"run": "sustained_mixed", "num_decode_seqs": 32, "num_prefill_tokens": 256,
                     "decode_context_len": 100, "paused_ms_median": paused, "step_ms_median": paused * r_mix})
    meta = {"pause_ms": 60.0, "pause_check": {"num_prefill_tokens": 512, "runs": runs}}
    return ProfileCost(np.array(pts, dtype=float), times, num_blocks=4096, meta=meta, power_cap=True,
                       cap_by_compute=False, ctx_quantum=1, cap_onset=onset, cap_by_power=r_mix is not None)


def test_the_fit_splits_a_trace_into_its_fast_onset_and_slow_drift():
    ts, ms = _trace(0.09, 0.03, 0.03, 0.4)
    fit = fit_cap_onset(np.asarray(ts) / 1e3, ms, REF, 0.4)
    assert fit["tau_fast_s"] == pytest.approx(0.03, rel=0.1)
    assert fit["phi"] == pytest.approx(0.75, abs=0.02)
    assert fit["fast"] + fit["slow"] == pytest.approx(0.12, abs=0.005)
    # nothing to split (a flat trace at the paused time), or too few steps: no fit
    assert fit_cap_onset(np.array([0.0, 0.05, 0.1, 0.15, 0.2]), [REF] * 5, REF, 0.3) is None
    assert fit_cap_onset(np.array([0.0, 0.05]), [REF, REF], REF, 0.3) is None


def test_the_factor_splits_between_the_two_shares():
    cost = _cost()
    on = cost.cap_onset
    assert on is not None and cost.power_cap_tau_fast_s == on["tau_fast_s"]
    assert on["f_ref"] == pytest.approx(ewma_duty_ref(REF / 1e3, 0.06, on["tau_fast_s"]))
    f_ref, r = cost.power_cap_f_ref, cost.sustained_fit["r"]
    phi, fr = on["phi"], on["f_ref"]
    # both shares full: the sustained ratio; both at the paused points' shares: nothing
    assert cost.prefill_slowdown(1.0, 0.0, None, 1.0) == pytest.approx(r)
    assert cost.prefill_slowdown(f_ref, 0.0, None, fr) == pytest.approx(1.0)
    # right after a busy stretch the fast share is full while the slow one is not
    want = 1 + (r - 1) * (phi + (1 - phi) * (0.6 - f_ref) / (1 - f_ref))
    assert cost.prefill_slowdown(0.6, 0.0, None, 1.0) == pytest.approx(want)
    # without a fast share given (an older caller) the slow form alone, as "slow"
    slow = _cost("slow")
    assert slow.cap_onset is None and slow.power_cap_tau_fast_s is None
    assert slow.prefill_slowdown(0.6, 0.0, None, 1.0) == pytest.approx(1 + (r - 1) * (0.6 - f_ref) / (1 - f_ref))
    with pytest.raises(ValueError, match="cap_onset"):
        _cost("quick")


def test_the_fast_form_counts_no_decode_spell():
    """The 33B bf16's pattern runs (the mixed step with 1 / 3 decode steps between) read 1.034 /
    0.997 x paused; the decode-spells term charges 1.079 / 1.081, the fast form 1.030 / 1.004
    (bench/results/fidelity_onset_s27). Here: a prompt's step after a 0.5 s decode spell takes its
    paused time in the event loop."""
    one = SimSchedulerConfig(batcher=BatcherConfig(target_throughput=8000.0))
    cfg = EngineConfig(num_samples=1, max_stretch_steps=1, async_plan_lead_s=0.002,
                       prefill_launch_deadline=False, record_steps=True)

    def b_step(cost):
        steps = simulate(workload([0.0, 0.5], [200, 3]), cost, one, cfg).extra["steps"]
        k = max(i for i, s in enumerate(steps) if s[3])  # B's prompt step beside A's decode
        assert steps[k][2] == 1
        return steps[k + 1][0] - steps[k][0]

    fast, slow = _cost(r_mix=1.08), _cost("slow", r_mix=1.08)
    assert fast.weights_cap_by_power and not fast.counts_decode_spells and slow.counts_decode_spells
    assert b_step(fast) == pytest.approx(_law(1, 64), rel=1e-6)
    assert b_step(slow) > 1.01 * _law(1, 64)  # the spell counted at B's weight


def test_the_event_loop_and_the_scorer_charge_the_fast_share():
    """A's prompt step (0, 64) [d, d + Tp], A's decode step (Td), then B's prompt beside A's decode:
    f_fast = e^-Td/tau_f - e^-(Td + Tp)/tau_f, f_slow likewise at tau_s, and B takes
    T_B (1 + (r - 1) [phi max(0, f_fast - fr) / (1 - fr) + (1 - phi) max(0, f_slow - f_ref) / (1 - f_ref)]),
    in the event loop and in the live-step scorer alike."""
    cost = _cost()
    one = SimSchedulerConfig(batcher=BatcherConfig(target_throughput=8000.0))
    cfg = EngineConfig(num_samples=1, max_stretch_steps=1, async_plan_lead_s=0.002,
                       prefill_launch_deadline=False)
    res = simulate(workload([0.0, 0.005], [20, 3]), cost, one, cfg)
    tp, td, tb = _law(0, 64), _law(1, 0), _law(1, 64)
    on, tau = cost.cap_onset, cost.power_cap_tau_s
    f_ref, r = cost.power_cap_f_ref, cost.sustained_fit["r"]
    ff = math.exp(-td / on["tau_fast_s"]) - math.exp(-(td + tp) / on["tau_fast_s"])
    fs = math.exp(-td / tau) - math.exp(-(td + tp) / tau)
    x = on["phi"] * max(0.0, ff - on["f_ref"]) / (1 - on["f_ref"]) + (1 - on["phi"]) * max(0.0, fs - f_ref) / (1 - f_ref)
    assert x > 0.2  # the fast share carries it: B right after A's prompt step
    want = tb * (1 + (r - 1) * x)
    d = res.dispatch_time[0]
    assert res.first_token_time[1] == pytest.approx(d + tp + td + want, rel=1e-9)
    from bench.simulator.fidelity_steps import model_step_ms
    steps = [{"d": 0, "p": 64, "ctx": 0, "chunks": [(64, 0)], "start": 0.0, "end": tp, "idle_before": True},
             {"d": 1, "p": 0, "ctx": 64, "chunks": [], "start": tp, "end": tp + td, "idle_before": False},
             {"d": 1, "p": 64, "ctx": 64, "chunks": [(64, 0)], "start": tp + td, "end": tp + td + want,
              "idle_before": False}]
    rows = {k: ms for k, ms, _f in model_step_ms(cost, steps)}
    assert rows[2] == pytest.approx(1e3 * want, rel=1e-9)


def test_the_replays_cost_spec_takes_the_onset_and_the_prefix_term():
    """`validate_replay --cap-onset fast` and `--prefix-term fit` reach the replay's ProfileCost
    through CostSpec (before session 27 `--prefix-term fit` stopped there with a TypeError), on a
    committed H200 profile: its trace's fast onset, ~32 ms, carries ~3/4 of the slowdown."""
    from pathlib import Path

    from bench.simulator.validate_replay import parser
    from sims.runner import CostSpec

    args = parser().parse_args(["v.json", "d.jsonl.gz", "s.jsonl.gz"])
    assert args.cap_onset == "slow" and args.prefix_term == "twins"
    assert parser().parse_args(["v.json", "d.jsonl.gz", "s.jsonl.gz", "--cap-onset", "fast"]).cap_onset == "fast"
    prof = (Path(__file__).resolve().parents[1] / "bench" / "results" / "fidelity_grid_h200_s25" / "33b-mixed-1"
            / "profile_33b-mixed-1.json")
    on = {"hide_launch": True, "power_cap": True, "cap_by_power": True}
    fast = CostSpec(model="tiny", profile=str(prof), **on, cap_onset="fast").build()
    assert fast.cap_onset["tau_fast_s"] == pytest.approx(0.032, abs=0.004)
    assert 0.65 < fast.cap_onset["phi"] < 0.8 and not fast.counts_decode_spells
    slow = CostSpec(model="tiny", profile=str(prof), **on).build()
    assert slow.cap_onset is None and slow.counts_decode_spells
    fit = CostSpec(model="tiny", profile=str(prof), **on, prefix_term="fit").build()
    assert fit.prefix_twins is None and slow.prefix_twins is not None


def test_the_pattern_runs_carry_each_steps_device_time(monkeypatch):
    """The pause check's mixed_pattern runs time each step's device part too (the live step log's
    CUDA events), so that a profile tells whether a mixed step run right after others takes longer
    on the device than paused (session 27: live mixed steps run ~3% over the paused device times).
    A stand-in CUDA runner whose mixed steps take 12 ms of device time and decode steps 5 ms."""
    import torch

    from bench.engine import profile as prof

    kinds: dict[int, str] = {}  # read-back slot -> the step's kind

    class Buffers:
        def device_seconds(self, slot):
            return 0.012 if kinds[slot] == "m" else 0.005

    class Step:
        def __init__(self, kind):
            self.readback = len(kinds)
            kinds[self.readback] = kind

    class Runner:
        device = torch.device("cuda")
        buffers = Buffers()

        def launch(self, chunks):
            return Step(chunks)

        def finish(self, step):
            return None

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(prof.time, "sleep", lambda s: None)
    pat = prof.mixed_pattern(Runner(), "m", "d", 1, 0.01, 0.0, 3)
    assert pat["device_ms_median"] == 12.0 and pat["decode_device_ms_median"] == 5.0
    assert pat["pattern_device_ms"][:2] == [12.0, 5.0] and pat["pattern_kinds"].startswith("md")
    # and launched as the serving loop does, two in flight: each step's own device time
    assert pat["pipelined_device_ms_median"] == 12.0 and pat["pipelined_decode_device_ms_median"] == 5.0
    assert pat["pipelined_kinds"].startswith("dm")  # the first step (from idle) left out
    # on the CPU (no timing events) the pattern has no device fields, as before
    Runner.device = torch.device("cpu")
    cpu = prof.mixed_pattern(Runner(), "m", "d", 1, 0.01, 0.0, 3)
    assert "device_ms_median" not in cpu and "pipelined_device_ms_median" not in cpu


def test_the_stream_run_sets_the_mixed_shapes_in_turn_against_each_paused(monkeypatch):
    """The pause check's "stream_mixed" run: the grid's one-chunk mixed shapes timed paused, then in
    turn two in flight. A stand-in CUDA runner whose steps take 10 ms + 0.1 ms a decode on the
    device, 2% more when launched while another step is in flight: the run reads 1.02, every shape."""
    import torch

    from bench.engine import profile as prof

    def decodes(chunks):
        return sum(1 for c in chunks if not c.is_prefill)

    runner = TimedStandInRunner(lambda chunks, in_flight: (10.0 + 0.1 * decodes(chunks)) * (1.02 if in_flight else 1.0))

    class Cfg:
        block_size, num_blocks = 16, 4096

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None, raising=False)
    monkeypatch.setattr(prof, "sm_clock_mhz", lambda device: 1980)
    monkeypatch.setattr(prof.time, "sleep", lambda s: None)
    shapes = [(d, p, 128, 1, 0) for d in (0, 8, 32) for p in (0, 64, 256) if d + p]
    run = prof.stream_mixed(runner, shapes, Cfg(), 100, 0.0, 3, 0.01)
    assert run["shapes"] == [[8, 64, 128], [8, 256, 128], [32, 64, 128], [32, 256, 128]]
    assert run["paused_device_ms"] == pytest.approx([10.8, 10.8, 13.2, 13.2])
    assert run["pipelined_device_ms"] == pytest.approx([x * 1.02 for x in run["paused_device_ms"]])
    assert run["ratio"] == pytest.approx(1.02)
    assert "bins" not in run  # the short form: no bins
    # the long form, in bins: a device whose steps slow by 0.01% a launch (the power cap's sag) reads a
    # ratio that rises bin to bin, the first near 1, with the clock and the power after each bin
    piped = [0]

    def sagging(chunks, in_flight):  # each step launched behind another: 0.1% slower than the one before
        piped[0] += bool(in_flight)
        return (10.0 + 0.1 * decodes(chunks)) * (1 + 1e-3 * piped[0] * bool(in_flight))

    runner.step_ms = sagging
    monkeypatch.setattr(prof, "power_w", lambda device: 650.0)
    Cfg.max_model_len, Cfg.max_num_seqs, Cfg.max_num_batched_tokens = 1500, 64, 2048
    long = prof.stream_mixed(runner, shapes, Cfg(), 100, 0.0, 3, 0.05, idle_s=0.01, bin_s=0.01,
                             prefix_starts=(1024, 2048))
    # the mixed step after a 1,024-token prefix joins the shapes (2,048 + 256 is past the model's length)
    assert long["shapes"][-1] == [32, 256, 128, 1024] and len(long["shapes"]) == 5
    assert long["idle_before_ms"] == 10.0 and long["bin_s"] == 0.01 and len(long["bins"]) == 5
    assert [b["t_s"] for b in long["bins"]] == [0.0, 0.01, 0.02, 0.03, 0.04]
    assert all(b["sm_clock_mhz"] == 1980 and b["power_w"] == 650.0 and b["steps"] >= 1 for b in long["bins"])
    ratios = [b["ratio"] for b in long["bins"]]
    assert ratios == sorted(ratios) and ratios[-1] > ratios[0]
    # no timing events (the CPU), or one mixed shape: no run
    runner.device = torch.device("cpu")
    assert prof.stream_mixed(runner, shapes, Cfg(), 100, 0.0, 3, 0.01) is None
