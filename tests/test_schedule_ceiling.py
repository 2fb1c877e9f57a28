"""The schedule's ceiling (bench.simulator.schedule_ceiling, issue 35, session 22): the gateway ->
engine delay's variation in the event loop (`EngineConfig.network_jitter_s`), the steps' own
scatter, and the re-runs that say how alike two runs of one workload can be."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest

import sims.event_loop as el
from bench.simulator.fidelity_steps import dispatch_delay, idle_dispatch_delays
from bench.simulator.schedule_ceiling import ScatteredCost, ceiling_draws, step_scatter
from scheduler.batcher import BatcherConfig
from scheduler.decisions import ArrivalRecord, BatchRecord
from scheduler.step_plan import PrefillCap
from sims.adapters import SimSchedulerConfig
from sims.cost import ConstantCost
from sims.decision_replay import replay_run, step_records
from sims.event_loop import EngineConfig

DT = 0.010  # every step 10 ms


def mixed_arrivals(n=80, seed=0, gap_s=0.012):
    """Prompts of 40-900 tokens arriving about one a step: each prompt's last chunk leaves part of
    the 256-token budget to whichever prompt has arrived, the race the ceiling is about."""
    rng = random.Random(seed)
    t, out = 100.0, []
    for k in range(n):
        t += rng.expovariate(1.0 / gap_s)
        out.append(ArrivalRecord(f"r{k:03d}", t, rng.randint(40, 900), rng.randint(4, 40), -1))
    return out


SCHED = SimSchedulerConfig(batcher=BatcherConfig(min_latency_ms=0.0, idle_flush=False),
                           max_num_seqs=64, max_num_batched_tokens=2048, block_size=16,
                           max_model_len=4096, prefill_cap=PrefillCap(max_tokens=256))


def engine(**kw):
    return EngineConfig(network_delay_s=0.002, async_plan_lead_s=0.002, **kw)


def steps_of(arrivals, eng, cost=None):
    res, _ = replay_run(arrivals, SCHED, cost or ConstantCost(DT), eng, record_steps=True)
    return step_records(res, arrivals)


def prefill(steps):
    return [s.prefill for s in steps if s.prefill]


def test_a_zero_jitter_is_no_jitter_and_a_draw_is_reproducible():
    arr = mixed_arrivals()
    plain = steps_of(arr, engine())
    assert prefill(steps_of(arr, engine(network_jitter_s=(0.0,)))) == prefill(plain)
    wide = (-0.0015, 0.0, 0.004)
    a = steps_of(arr, engine(network_jitter_s=wide, jitter_seed=3))
    assert prefill(steps_of(arr, engine(network_jitter_s=wide, jitter_seed=3))) == prefill(a)
    # the variation moves requests across the plans: some step's chunks differ from the plain run
    assert prefill(a) != prefill(plain)


def test_messages_reach_the_backend_in_the_order_they_were_sent(monkeypatch):
    delivered = []
    push = el.EventLoop.push

    def spy(self, t, kind, arg):
        if kind == el._DELIVER:
            delivered.append(t)
        return push(self, t, kind, arg)
    monkeypatch.setattr(el.EventLoop, "push", spy)
    # draws of -1.9 to +6 ms on a 2 ms delay: without the order kept, later messages would overtake
    steps_of(mixed_arrivals(), engine(network_jitter_s=(-0.0019, 0.006), jitter_seed=1))
    assert len(delivered) > 20
    assert delivered == sorted(delivered)
    assert len(set(np.round(np.diff(delivered), 9))) > 3  # the delays did vary


def test_step_scatter_reads_back_to_back_decode_only_pairs():
    rows = [{"ms": 10.0, "decodes": 4, "prefill": []}, {"ms": 10.2, "decodes": 4, "prefill": []},
            {"ms": 12.0, "decodes": 5, "prefill": []},  # another decode count: no pair with the last
            {"ms": 30.0, "decodes": 5, "prefill": [["a", 256, 0]]},  # a prefill step breaks pairs
            {"ms": 12.0, "decodes": 5, "prefill": []}, {"ms": 11.88, "decodes": 5, "prefill": []},
            {"ms": 9.0, "decodes": 0, "prefill": []}]  # an empty step is no decode step
    r = step_scatter(rows)
    assert r == pytest.approx([math.log(1.02) / math.sqrt(2), math.log(0.99) / math.sqrt(2)])


def test_scattered_cost_multiplies_each_step_by_a_drawn_factor():
    base = ConstantCost(DT)
    same = ScatteredCost(base, np.zeros(3), seed=0)
    assert same.step_time(4, 0, 100) == DT and list(same.decode_times(4, 100, 3)) == [DT] * 3
    double = ScatteredCost(base, np.array([math.log(2.0)]), seed=0)
    assert double.step_time(4, 0, 100) == pytest.approx(2 * DT)
    assert double.decode_times(4, 100, 5) == pytest.approx([2 * DT] * 5)
    assert double.num_kv_blocks  # the inner model's other terms pass through
    mixed = ScatteredCost(base, np.log([0.9, 1.1]), seed=0)
    seen = {round(mixed.step_time(1, 0, 10) / DT, 6) for _ in range(50)}
    assert seen == {0.9, 1.1}
    with pytest.raises(ValueError):
        ScatteredCost(base, np.zeros(0), seed=0)


def test_prefill_steps_draw_from_their_own_sample_where_given():
    base = ConstantCost(DT)
    c = ScatteredCost(base, np.array([0.0]), seed=0, prefill_log_factors=np.array([math.log(1.5)]))
    assert c.step_time(4, 0, 100) == DT  # decode-only: the decode sample
    assert c.step_time(4, 256, 100) == pytest.approx(1.5 * DT)  # with prefill: its own
    assert c.step_time(num_decode_seqs=0, num_prefill_tokens=16, num_context_tokens=0) == pytest.approx(1.5 * DT)
    assert c.decode_times(4, 100, 2) == pytest.approx([DT, DT])
    # no prefill sample (None or empty): prefill steps draw from the decode steps' one
    for none in (None, np.zeros(0)):
        assert ScatteredCost(base, np.array([math.log(2.0)]), seed=0,
                             prefill_log_factors=none).step_time(4, 256, 100) == pytest.approx(2 * DT)


def test_the_prefill_sample_is_the_profiles_sustained_traces_each_centred():
    from bench.simulator.schedule_ceiling import noise_of, sustained_prefill_scatter
    prof = {"pause_check": {"runs": [
        {"run": "paused", "trace_ms": [1.0, 2.0, 4.0]},  # not a sustained run: left out
        {"run": "sustained", "trace_ms": [10.0, 10.0, 11.0, 11.0]},
        {"run": "sustained_packed", "trace_ms": [20.0, 21.0]},  # too short for a ratio's centre
        {"run": "sustained_mixed", "trace_ms": [5.0, 5.5, 5.0, 5.5]}]}}
    r = sustained_prefill_scatter(prof)
    one, ten = math.log(1.1) / math.sqrt(2), math.log(11 / 10) / math.sqrt(2)
    # each run's ratios minus their median: [0, ten, 0] - 0; [one, -one, one] - one
    assert sorted(r) == pytest.approx(sorted([0.0, ten, 0.0, 0.0, -2 * one, 0.0]))
    assert len(sustained_prefill_scatter({})) == 0
    nz = noise_of([], [], prof)
    assert nz["num_prefill_scatter"] == 6 and nz["prefill_scatter_robust_sd"] == 0.0
    assert noise_of([], [])["num_prefill_scatter"] == 0 and noise_of([], [])["prefill_scatter_robust_sd"] is None


def test_live_prefill_pairs_are_steps_of_one_exact_shape_a_few_steps_apart():
    from bench.simulator.schedule_ceiling import noise_of, prefill_step_scatter
    rows = [{"ms": 10.0, "decodes": 4, "prefill": [["a", 256, 0]]},
            {"ms": 11.0, "decodes": 4, "prefill": [["a", 256, 256]]},  # another position: no pair
            {"ms": 10.2, "decodes": 4, "prefill": [["b", 256, 0]]},  # a's shape two steps before
            {"ms": 5.0, "decodes": 4, "prefill": []},
            {"ms": 11.0 * 1.01, "decodes": 4, "prefill": [["b", 256, 256]]},  # against row 1
            {"ms": 10.0, "decodes": 5, "prefill": [["c", 256, 0]]}]  # another decode count
    for i, row in enumerate(rows):
        row["mono"] = 0.02 * i
    r = prefill_step_scatter(rows)
    assert r == pytest.approx([math.log(1.02) / math.sqrt(2), math.log(1.01) / math.sqrt(2)])
    assert len(prefill_step_scatter(rows, within=2)) == 1  # row 4's match is 3 steps back
    prof = {"pause_check": {"runs": [{"run": "sustained", "trace_ms": [10.0, 10.0, 11.0]}]}}
    # auto: the live sample needs >= 100 pairs, else the profile's sustained runs, else decode
    assert noise_of(rows, [], prof)["prefill_scatter_source"] == "sustained"
    assert noise_of(rows, [], prof, "live")["num_prefill_scatter"] == 2
    assert noise_of(rows, [], {})["prefill_scatter_source"] == "decode"
    many = rows[:3] * 60  # 180 steps, every one but the first two a shape two steps before
    assert noise_of(many, [], prof)["prefill_scatter_source"] == "live"
    with pytest.raises(ValueError, match="prefill_source"):
        noise_of(rows, [], prof, "profile")


def test_idle_dispatch_delays_are_the_sample_the_median_is_taken_of():
    # two requests flushed while the engine was idle (1.2 and 1.6 ms to their steps), one flushed
    # while a step ran (not idle: left out)
    rows = [{"mono": 10.0012, "ms": 5.0, "decodes": 0, "prefill": [["a", 16, 0]]},
            {"mono": 10.0060, "ms": 5.0, "decodes": 1, "prefill": [["c", 16, 0]]},
            {"mono": 11.0016, "ms": 5.0, "decodes": 0, "prefill": [["b", 16, 0]]}]
    batches = [BatchRecord(10.0, ("a",), (1,)), BatchRecord(10.003, ("c",), (1,)),
               BatchRecord(11.0, ("b",), (1,))]
    d = idle_dispatch_delays(rows, batches)
    assert sorted(d) == pytest.approx([0.0012, 0.0016])
    assert dispatch_delay(rows, batches) == (pytest.approx(0.0014), 2)


def test_the_ceiling_is_one_without_noise_and_lower_with_it():
    arr = mixed_arrivals()
    eng = engine(record_steps=True, max_stretch_steps=1)
    base = steps_of(arr, eng)
    quiet = {"delays_s": np.zeros(4), "scatter": np.zeros(4)}
    c = ceiling_draws(arr, SCHED, eng, lambda: ConstantCost(DT), base, quiet, draws=2)
    assert c["same_prefill_step_share"] == 1.0 and c["draws"] == [1.0, 1.0]
    noisy = {"delays_s": np.array([-0.0015, 0.0, 0.0, 0.004]), "scatter": np.log([0.97, 1.0, 1.03])}
    for which in ("delays", "scatter", "both"):
        c = ceiling_draws(arr, SCHED, eng, lambda: ConstantCost(DT), base, noisy, draws=2, which=which)
        assert 0.3 < c["same_prefill_step_share"] < 1.0, (which, c)
        assert c["delays"] == (which != "scatter") and c["scatter"] == (which != "delays")
    with pytest.raises(ValueError, match="noise"):
        ceiling_draws(arr, SCHED, eng, lambda: ConstantCost(DT), base, noisy, draws=1, which="all")


def test_noise_half_widths_are_a_student_t_interval_of_one_runs_moves():
    from scipy import stats

    from bench.simulator.schedule_ceiling import noise_half_widths
    moves = {"ttft_p99": [0.02, -0.02, 0.04, -0.04], "tpot_p50": [0.0, 0.0, 0.0, 0.0], "one": [0.1]}
    hw = noise_half_widths(moves, num_runs=5)
    sd = float(np.std(moves["ttft_p99"], ddof=1))
    assert hw["ttft_p99"] == pytest.approx(stats.t.ppf(0.975, 4) * sd / math.sqrt(5))
    assert hw["tpot_p50"] == 0.0  # no noise, no width
    assert math.isnan(hw["one"])  # one draw says nothing of a spread
    assert math.isnan(noise_half_widths(moves, num_runs=1)["ttft_p99"])  # nor does one seed
    # more seeds, a narrower interval from the same noise
    assert noise_half_widths(moves, num_runs=10)["ttft_p99"] < hw["ttft_p99"]


def test_the_table_marks_an_interval_the_noise_alone_keeps_out():
    from bench.simulator.fidelity_table import _fmt
    out = {"mean": 0.04, "ci": 0.03, "inside": False, "seed_bound": True}
    assert _fmt(out).endswith("†")
    assert _fmt({**out, "seed_bound": False}) == "+4.0 ± 3.0"
    assert _fmt({"mean": 0.01, "ci": 0.01, "inside": True}) == "**+1.0 ± 1.0**"
