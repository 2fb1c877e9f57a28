"""Issue 35, session 28: the power limiter's slow sag (sims.profile_cost, "The slow sag").

Session 27 found live mixed steps 1.5-3% over the paused profile, growing over seconds of load, past
the pause check's 2.5 s sustained runs. The profile's long "stream_mixed" run (12 s in 1 s bins) gives
the sag past that horizon; the model charges it from a weighted busy share at its own time constant,
in the event loop and in the live-step scorer alike. Closed forms."""
import math
from itertools import pairwise

import numpy as np
import pytest

from scheduler.batcher import BatcherConfig
from sims.adapters import SimSchedulerConfig
from sims.event_loop import EngineConfig, simulate
from sims.profile_cost import ProfileCost, ewma_duty_ref, fit_stream_sag
from tests.sim_helpers import TimedStandInRunner, workload


def _law(d, p):
    """4 ms a step, 0.2 ms a decode, 0.1 ms a prefill token (exact in the fit: no residuals)."""
    return 4e-3 + 2e-4 * d + 1e-4 * p


REF = 1e3 * _law(0, 512)


def _bins(sag=0.03, tau=3.0, span=12):
    """A stream's 1 s bins from idle: ratio 1 + sag (1 - e^-t/tau) at each bin's middle."""
    return [{"t_s": float(b), "ratio": 1 + sag * -math.expm1(-(b + 0.5) / tau), "steps": 80} for b in range(span)]


def _trace(r=1.05, tau=0.3, span_s=2.5):
    t, ts, ms = 0.0, [], []
    while t < span_s:
        x = REF * (1 + (r - 1) * -math.expm1(-t / tau))
        ts.append(t * 1e3)
        ms.append(x)
        t += x / 1e3
    return ts, ms


def _cost(bins=None, r=1.05, **kw):
    pts = [(d, p, d * c + p) for c in (100, 300) for d in (0, 1, 4, 8, 16, 32) for p in (0, 64, 256, 512)
           if d + p and (d or c == 100)]
    times = np.array([_law(d, p) for d, p, _ in pts])
    ts, ms = _trace(r)
    runs = [{"run": "paused", "step_ms_median": REF}, {"run": "back_to_back", "step_ms_median": REF},
            {"run": "paused_again", "step_ms_median": REF},
            {"run": "sustained", "step_ms_median": ms[-1], "trace_t_ms": ts, "trace_ms": ms}]
    if bins is not None:
        runs.append({"run": "stream_mixed", "shapes": [[8, 64, 100], [32, 256, 100], [32, 256, 100, 1024]], "ratio": bins[-1]["ratio"] if bins else 1.0,
                     "bin_s": 1.0, "bins": bins})
    meta = {"pause_ms": 60.0, "pause_check": {"num_prefill_tokens": 512, "runs": runs}}
    return ProfileCost(np.array(pts, dtype=float), times, num_blocks=4096, meta=meta, power_cap=True,
                       cap_by_compute=False, ctx_quantum=1, **kw)


def test_the_fit_reads_the_sag_past_the_sustained_runs_horizon():
    fit = fit_stream_sag(_bins(0.03, 3.0), 1.0)
    assert fit["tau_s"] == pytest.approx(3.0, rel=0.02)
    assert fit["settled"]  # tau 3 s within a third of the 11.5 s span
    ref = 1 + 0.03 * -math.expm1(-2.5 / 3.0)
    assert fit["ref_ratio"] == pytest.approx(ref, rel=1e-4)
    assert fit["sag"] == pytest.approx(1.03 / ref - 1, rel=0.01)  # the tau grid's step
    # a stream that has not settled: the level at its last bin, no extrapolation
    slow = fit_stream_sag(_bins(0.03, 20.0), 1.0)
    assert not slow["settled"]
    assert slow["end_ratio"] == pytest.approx(1 + 0.03 * -math.expm1(-11.5 / 20.0), rel=1e-3)
    # a flat stream (the sustained runs' level reached in the first second): no sag
    flat = [{"t_s": float(b), "ratio": 1.02, "steps": 80} for b in range(12)]
    assert fit_stream_sag(flat, 1.0)["sag"] == pytest.approx(0.0, abs=1e-9)
    # a falling one (the clock recovering): none either, and too few bins: no fit
    falling = [{"t_s": float(b), "ratio": 1.03 - 0.001 * b, "steps": 80} for b in range(12)]
    assert fit_stream_sag(falling, 1.0)["sag"] == 0.0
    assert fit_stream_sag(_bins(span=4), 1.0) is None


def test_the_model_charges_the_sag_from_its_own_share():
    cost = _cost(_bins(0.03, 3.0))
    sg = cost.cap_sag
    assert sg is not None and cost.power_cap_tau_sag_s == pytest.approx(3.0, rel=0.02)
    assert sg["w_stream"] == 1.0  # without the power-by-kind weights every prefill step weighs 1
    assert sg["f_ref"] == pytest.approx(ewma_duty_ref(REF / 1e3, 0.06, sg["tau_s"]))
    assert cost.describe()["power_cap"]["sag"]["sag"] == sg["sag"]
    r, f_ref = cost.sustained_fit["r"], cost.power_cap_f_ref
    # a full sag share on top of a full busy share: the sustained ratio and the sag beside it
    assert cost.prefill_slowdown(1.0, 0.0, None, None, 1.0) == pytest.approx(r + sg["sag"])
    # at the paused points' share: nothing more; without a share given (an older caller): nothing
    assert cost.prefill_slowdown(f_ref, 0.0, None, None, sg["f_ref"]) == pytest.approx(1.0)
    assert cost.prefill_slowdown(1.0) == pytest.approx(r)
    half = sg["f_ref"] + 0.5 * (1 - sg["f_ref"])
    assert cost.prefill_slowdown(f_ref, 0.0, None, None, half) == pytest.approx(1 + 0.5 * sg["sag"])
    # switched off, or a stream without bins (session 27's short run): none
    assert _cost(_bins(), cap_sag=False).cap_sag is None
    assert _cost([]).cap_sag is None and _cost([]).power_cap_tau_sag_s is None


def test_the_event_loop_and_the_scorer_charge_the_sag_share():
    """Prompt steps back to back (one request's prompt in chunks... here two requests' prompts, each
    its own step): the second's sag share is e^-0/ts - e^-T1/ts = 1 - e^-T1/ts of the first's span,
    and it takes T2 (1 + (r - 1) x_slow + sag (fs - f_ref_s) / (1 - f_ref_s)), in the event loop and
    in the scorer alike."""
    cost = _cost(_bins(0.03, 3.0))
    sg = cost.cap_sag
    one = SimSchedulerConfig(batcher=BatcherConfig(target_throughput=8000.0))
    cfg = EngineConfig(num_samples=1, max_stretch_steps=1, async_plan_lead_s=0.002,
                       prefill_launch_deadline=False)
    res = simulate(workload([0.0, 0.005], [20, 3]), cost, one, cfg)
    tp, td, tb = _law(0, 64), _law(1, 0), _law(1, 64)
    tau, f_ref, r = cost.power_cap_tau_s, cost.power_cap_f_ref, cost.sustained_fit["r"]
    f = math.exp(-td / tau) - math.exp(-(td + tp) / tau)
    fs = math.exp(-td / sg["tau_s"]) - math.exp(-(td + tp) / sg["tau_s"])
    xs = sg["sag"] * max(0.0, fs - sg["f_ref"]) / (1 - sg["f_ref"])
    want = tb * (1 + (r - 1) * max(0.0, f - f_ref) / (1 - f_ref) + xs)
    d = res.dispatch_time[0]
    assert res.first_token_time[1] == pytest.approx(d + tp + td + want, rel=1e-9)
    from bench.simulator.fidelity_steps import model_step_ms
    steps = [{"d": 0, "p": 64, "ctx": 0, "chunks": [(64, 0)], "start": 0.0, "end": tp, "idle_before": True},
             {"d": 1, "p": 0, "ctx": 64, "chunks": [], "start": tp, "end": tp + td, "idle_before": False},
             {"d": 1, "p": 64, "ctx": 64, "chunks": [(64, 0)], "start": tp + td, "end": tp + td + want,
              "idle_before": False}]
    rows = {k: ms for k, ms, _f in model_step_ms(cost, steps)}
    assert rows[2] == pytest.approx(1e3 * want, rel=1e-9)


def test_a_long_busy_stretch_reaches_the_sag():
    """Prompt steps back to back for seconds (400 prompts of 512 tokens at once, four a step: ~20 s of
    prefill): the last steps run the sag slower than the model without it, the first ones alike."""
    one = SimSchedulerConfig(batcher=BatcherConfig(target_throughput=8000.0))
    cfg = EngineConfig(num_samples=1, max_stretch_steps=1, async_plan_lead_s=0.002,
                       prefill_launch_deadline=False, record_steps=True)

    def durations(cost):
        wl = workload([0.0] * 400, [1] * 400)
        wl.prompt_len[:] = 512
        steps = [s for s in simulate(wl, cost, one, cfg).extra["steps"] if s[3]]
        return [b[0] - a[0] for a, b in pairwise(steps)]

    on, off = _cost(_bins(0.03, 3.0)), _cost(_bins(0.03, 3.0), cap_sag=False)
    d_on, d_off = durations(on), durations(off)
    assert len(d_on) > 90 and on.cap_sag["sag"] > 0.01
    assert d_on[0] == pytest.approx(d_off[0], rel=0.002)  # ~0.2 s of load: the sag share still small
    # ~20 s busy: the share at tau 3 s full, less the paused points' share
    assert d_on[-1] / d_off[-1] == pytest.approx(1 + on.cap_sag["sag"], rel=2e-3)


def test_each_kinds_stream_reads_its_throttle_in_device_time(monkeypatch):
    """The pause check's "stream_kind" runs: a kind paused (spin-queued, as the grid's points) and then back
    to back two in flight, in device time. A stand-in CUDA runner whose steps take 10 ms on the device,
    3% more when launched behind another (the cap acting at once): the run reads 1.03; the CPU, none."""
    import torch

    from bench.engine import profile as prof

    runner = TimedStandInRunner(lambda chunks, in_flight: 10.0 * (1.03 if in_flight else 1.0))

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None, raising=False)
    monkeypatch.setattr(prof, "sm_clock_mhz", lambda device: 1980)
    monkeypatch.setattr(prof.time, "sleep", lambda s: None)
    monkeypatch.setattr(prof.NvmlSampler, "__init__", lambda self, device: (
        setattr(self, "nv", None), setattr(self, "rows", [(0.0, 1920, 686.0, 1, 0)] * 6),
        setattr(self, "_stop", __import__("threading").Event()), setattr(self, "_thread", None))[0])
    run = prof.stream_kind(runner, "mixed", ["chunk"], 0.06, 3, span_s=0.02, idle_s=0.0)
    assert run["run"] == "stream_kind" and run["kind"] == "mixed"
    assert run["paused_device_ms_median"] == pytest.approx(10.0)
    assert run["ratio"] == pytest.approx(1.03) and run["steps"] >= 1
    assert run["nvml"] == {"samples": 6, "sm_clock_median": 1920, "power_median_w": 686.0,
                           "sw_power_cap_share": 1.0, "hw_slowdown_share": 0.0}
    runner.device = torch.device("cpu")
    assert prof.stream_kind(runner, "mixed", ["chunk"], 0.06, 3, span_s=0.02, idle_s=0.0) is None


def _anchored_cost(anchors, kinds, r_wall=1.05, r_mix_wall=0.96):
    """A profile whose sustained runs read r_wall (the 512-token step) and r_mix_wall (the mixed step) in
    wall time, and whose stream_kind runs read `kinds` in device time."""
    pts = [(d, p, d * c + p) for c in (100, 300) for d in (0, 1, 4, 8, 16, 32) for p in (0, 64, 256, 512)
           if d + p and (d or c == 100)]
    times = np.array([_law(d, p) for d, p, _ in pts])
    ts, ms = _trace(r_wall)
    paused_mix = 1e3 * _law(32, 256)
    runs = [{"run": "paused", "step_ms_median": REF}, {"run": "back_to_back", "step_ms_median": REF},
            {"run": "paused_again", "step_ms_median": REF},
            {"run": "sustained", "step_ms_median": ms[-1], "trace_t_ms": ts, "trace_ms": ms},
            {"run": "sustained_mixed", "num_decode_seqs": 32, "num_prefill_tokens": 256, "decode_context_len": 100,
             "paused_ms_median": paused_mix, "step_ms_median": paused_mix * r_mix_wall}]
    runs += [{"run": "stream_kind", "kind": k, "ratio": v, "paused_device_ms_median": 1.0,
              "pipelined_device_ms_median": v} for k, v in kinds.items()]
    meta = {"pause_ms": 60.0, "pause_check": {"num_prefill_tokens": 512, "runs": runs}}
    return ProfileCost(np.array(pts, dtype=float), times, num_blocks=4096, meta=meta, power_cap=True,
                       cap_by_compute=False, ctx_quantum=1, cap_by_power=True, cap_anchors=anchors)


def test_the_cap_can_take_its_ratios_from_the_kinds_device_time_streams():
    """`cap_anchors="stream"`: r from the prefill kind's stream, r_mix from the mixed kind's, where the
    sustained runs' wall times read 1.05 and 0.96 (a mixed step that does not throttle: weight f_ref)."""
    kinds = {"prefill": 1.04, "mixed": 1.012, "decode": 1.002}
    wall, dev = _anchored_cost("sustained", kinds), _anchored_cost("stream", kinds)
    assert wall.cap_anchors is None and wall.sustained_fit["r"] == pytest.approx(wall.prefill_slowdown(1.0), rel=1e-9)
    assert wall.cap_mixed["r_mix"] == pytest.approx(0.96) and wall.cap_mixed["w_mix"] == pytest.approx(wall.power_cap_f_ref)
    assert dev.cap_anchors == {"prefill": 1.04, "mixed": 1.012}
    assert dev.prefill_slowdown(1.0) == pytest.approx(1.04)  # the reference's ratio, a full share
    assert dev.cap_mixed["r_mix"] == pytest.approx(1.012) and dev.cap_mixed["whatif"] == "stream_kind"
    # the mixed step back to back holds the share at its weight, where the factor gives its own ratio
    assert dev.prefill_slowdown(dev.cap_mixed["w_mix"]) == pytest.approx(1.012)
    # the time constant and f_ref stay the sustained trace's
    assert dev.power_cap_tau_s == wall.power_cap_tau_s and dev.power_cap_f_ref == wall.power_cap_f_ref
    assert dev.describe()["power_cap"]["anchors_device_time"] == {"prefill": 1.04, "mixed": 1.012}
    # a profile without the runs: the sustained anchors, whatever was asked
    none = _anchored_cost("stream", {})
    assert none.cap_anchors is None and none.cap_mixed["r_mix"] == pytest.approx(0.96)
    with pytest.raises(ValueError, match="cap_anchors"):
        _anchored_cost("device", kinds)


def test_validate_replay_takes_the_anchors_through_the_cost_spec():
    """`validate_replay --cap-anchors stream` reaches the replay's ProfileCost through CostSpec; a
    committed H200 profile (no stream_kind runs) keeps its sustained anchors."""
    from pathlib import Path

    from bench.simulator.validate_replay import parser
    from sims.runner import CostSpec

    base = ["v.json", "d.jsonl.gz", "s.jsonl.gz"]
    assert parser().parse_args(base).cap_anchors == "sustained"
    assert parser().parse_args(base + ["--cap-anchors", "stream"]).cap_anchors == "stream"
    prof = (Path(__file__).resolve().parents[1] / "bench" / "results" / "fidelity_grid_h200_s25" / "33b-mixed-1"
            / "profile_33b-mixed-1.json")
    on = {"hide_launch": True, "power_cap": True, "cap_by_power": True}
    stream = CostSpec(model="tiny", profile=str(prof), **on, cap_anchors="stream").build()
    plain = CostSpec(model="tiny", profile=str(prof), **on).build()
    assert stream.cap_anchors is None and stream.cap_mixed["r_mix"] == plain.cap_mixed["r_mix"]


def test_the_pause_check_streams_every_kind_with_its_shape(monkeypatch):
    """The pause check's long form on a stand-in for CUDA timing (the tiny model on the CPU, each step's
    device time its shape's token count in µs): the six stream_kind runs come out, each with the shape it
    ran (the cost model places a kind among the anchors by it), and the long stream with its bins."""
    import torch

    from backend.engine.args import add_engine_args, backend_config
    from backend.engine.assemble import ServingOptions, create_engine
    from bench.engine import profile as prof

    ap = __import__("argparse").ArgumentParser()
    add_engine_args(ap)
    a = ap.parse_args(["--model", "tiny", "--num-blocks", "512", "--max-num-seqs", "64"])
    engine, loaded = create_engine(backend_config(a), ServingOptions())
    runner, cfg = engine.runner, engine.config
    last = {}
    real_launch = runner.launch

    def launch(chunks):
        step = real_launch(chunks)
        last[id(step)] = sum(len(c.token_ids) for c in chunks)
        return step

    monkeypatch.setattr(runner, "launch", launch)
    monkeypatch.setattr(prof, "measure_device", lambda r, chunks, n, pause=0.0, **k: [
        float(sum(len(c.token_ids) for c in chunks)) / 1e3] * n)
    monkeypatch.setattr(prof, "_step_device_ms", lambda r, step: last.get(id(step), 1) / 1e3)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *x, **k: None)
    monkeypatch.setattr(prof.time, "sleep", lambda s: None)
    for name, value in (("SUSTAIN_S", 0.05), ("SUSTAIN_IDLE_S", 0.0), ("PATTERN_S", 0.02), ("STREAM_S", 0.04),
                        ("STREAM_BIN_S", 0.02), ("STREAM_KIND_S", 0.02), ("STREAM_KIND_IDLE_S", 0.0)):
        monkeypatch.setattr(prof, name, value)
    monkeypatch.setattr(prof.stream_kind, "__defaults__", (0.3, 0.0))  # a CPU packed step outlasts 20 ms
    shapes = [(d, p, c, 1, 0) for c in (64, 160) for d in (0, 1, 8, 32) for p in (0, 64, 256) if d + p and (d or c == 64)]
    shapes.append((0, 512, 0, 2, 0))
    doc = prof.compare_pause(runner, shapes, cfg, loaded.config.vocab_size, 0.0, repeats=2, sustain_s=0.05)
    kinds = {r["kind"]: r for r in doc["runs"] if r["run"] == "stream_kind"}
    assert sorted(kinds) == ["decode", "mixed", "mixed_short", "mixed_two_chunks", "packed", "prefill"]
    assert kinds["prefill"]["shape"] == [0, 256, 0, 1, 0] and kinds["packed"]["shape"] == [0, 512, 0, 2, 0]
    assert kinds["mixed"]["shape"][:2] == [32, 256] and kinds["mixed_short"]["shape"] == [8, 256, 64, 1, 0]
    assert kinds["mixed_two_chunks"]["shape"][3] == 2 and kinds["decode"]["shape"][1] == 0
    # the stand-in's device time is the shape's alone: back to back as paused
    assert all(r["ratio"] == pytest.approx(1.0) for r in kinds.values())
    # the mixed step's no-pause timing, each repetition kept beside its median (the busy level's scatter)
    mixed_run = next(r for r in doc["runs"] if r["run"] == "sustained_mixed")
    assert len(mixed_run["spin_device_ms"]) == 2 and len(mixed_run["paused_device_ms"]) == 2
    med = __import__("statistics").median
    assert mixed_run["spin_device_ms_median"] == pytest.approx(med(mixed_run["spin_device_ms"]), abs=1e-4)
    assert mixed_run["paused_device_ms_median"] == pytest.approx(med(mixed_run["paused_device_ms"]), abs=1e-4)
    assert not [r for r in doc["runs"] if r["run"].endswith("_failed")]


def test_a_kind_with_its_shape_is_an_anchor_of_its_own():
    """A light-decode mixed step streamed at 1.01 (its shape carried by its run) sits among the weights'
    anchors at its token rate: a step of that shape back to back is charged 1.01, where the line from the
    mixed anchor to the reference gave it more."""
    kinds = {"prefill": 1.08, "mixed": 0.997}
    line = _anchored_cost("stream", kinds)
    run = {"run": "stream_kind", "kind": "mixed_short", "ratio": 1.01, "shape": [8, 256, 100, 1, 0]}
    cost = _with_kind(run, kinds)
    ctx = 8 * 100 + 256
    assert line.prefill_slowdown(line.cap_weight(8, 256, ctx)) > 1.02  # the line: steeper than measured
    assert cost.prefill_slowdown(cost.cap_weight(8, 256, ctx)) == pytest.approx(1.01)
    got = cost.cap_mixed["extra_anchors"]
    assert [a["kind"] for a in got] == ["mixed_short"] and got[0]["r"] == 1.01
    assert cost.cap_anchors["mixed_short"] == 1.01


def _with_kind(run, kinds):
    """`_anchored_cost("stream", kinds)` with one more stream_kind run (its shape included)."""
    cost = _anchored_cost("stream", kinds)
    meta = dict(cost.meta)
    meta["pause_check"] = {**meta["pause_check"], "runs": meta["pause_check"]["runs"] + [run]}
    pts = [(d, p, d * c + p) for c in (100, 300) for d in (0, 1, 4, 8, 16, 32) for p in (0, 64, 256, 512)
           if d + p and (d or c == 100)]
    times = np.array([_law(d, p) for d, p, _ in pts])
    return ProfileCost(np.array(pts, dtype=float), times, num_blocks=4096, meta=meta, power_cap=True,
                       cap_by_compute=False, ctx_quantum=1, cap_by_power=True, cap_anchors="stream")
