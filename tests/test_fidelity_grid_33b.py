"""Issue 35, the H200 fidelity grid's 33B part (bench/results/fidelity_grid_h200_s11/33b: 33B
preset, bf16, 512/128, 0.5/0.8/0.95/1.2x, 3 seeds x 200 requests, with the engine's 256-token
prefill cap while decoding): the replay tools read the live prefill cap, the power cap slows a
step by its compute share, and the divergence report names another request's arrival."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench.simulator.fidelity_resim import resimulate, session_prefill_cap
from bench.simulator.fidelity_steps import (
    LiveTimedCost,
    dispatch_delay,
    first_divergence,
    live_steps,
    read_steps,
    schedule_report,
    step_cost_table,
)
from scheduler.decisions import StepRecord, read_log
from sims.profile_cost import ProfileCost

ROOT = Path(__file__).resolve().parents[1] / "bench" / "results"
GRID = ROOT / "fidelity_grid_h200_s11" / "33b"
OLD = ROOT / "fidelity_h200_2"
LEAD_S, DELIVERY_S = 1.5907e-3, 3.1985e-3  # the run's async lead; its delivery path at 0.5x


@pytest.fixture(scope="module")
def grid():
    validate = json.loads((GRID / "validate_33b.json").read_text())
    arrivals, batches = read_log(str(GRID / "decisions_33b.jsonl.gz"))
    rows = read_steps(GRID / "steps_33b.jsonl.gz")
    steps, bad = live_steps(rows, {a.request_id: a.max_tokens for a in arrivals})
    return validate, arrivals, batches, rows, steps, bad


def test_the_session_prefill_cap():
    """The grid's engine capped prefill at 256 tokens while decoding (the CUDA default since
    d251018); the 2026-12-03 session was recorded before it; a cap recorded in the JSON wins."""
    grid = json.loads((GRID / "validate_33b.json").read_text())
    old = json.loads((OLD / "validate_33b.json").read_text())
    cap = session_prefill_cap(grid)
    assert cap is not None and cap.max_tokens == 256
    assert session_prefill_cap(old) is None
    assert session_prefill_cap(old, "live").max_tokens == 256
    assert session_prefill_cap(grid, "off") is None
    assert session_prefill_cap(grid, "128").max_tokens == 128
    recorded = {**grid, "config": {**grid["config"], "prefill_cap": {
        "max_tokens": 64, "backlog_tokens": None, "backlog_seqs": 2}}}
    assert session_prefill_cap(recorded).max_tokens == 64
    assert session_prefill_cap({**grid, "config": {**grid["config"], "prefill_cap": {
        "max_tokens": 0, "backlog_tokens": None, "backlog_seqs": 4}}}) is None


def _linear_cost(**kw):
    """Step time 10 ms + 0.05 ms per prefill token + 0.5 ms per decode, exactly: the fit's
    constant (the weights' read) is 10 ms. Pause check: 512 tokens, paused 50, back to back
    55 ms (r = 1.1), 60 ms pauses (f_ref = 0.4)."""
    pts = np.array([(d, p, d * c + p) for c in (100, 300) for d in (0, 1, 4, 8)
                    for p in (0, 64, 512, 1024) if d + p], dtype=np.float64)
    times = 0.010 + 0.05e-3 * pts[:, 1] + 0.5e-3 * pts[:, 0]
    meta = {"pause_ms": 60.0, "pause_check": {"num_prefill_tokens": 512, "num_prefill_seqs": 1, "runs": [
        {"run": "paused", "step_ms_median": 50.0}, {"run": "back_to_back", "step_ms_median": 55.0},
        {"run": "paused_again", "step_ms_median": 50.0}]}}
    return ProfileCost(pts, times, num_blocks=4096, meta=meta, **kw)


def test_compute_share_closed_form():
    """compute_share = 1 - constant / T; the factor's excess scales by it over the pause check
    step's (1 - 10 / 35.6): a decode-only step of 8 (14 ms, share 4/14) is slowed 0.397x as much
    as the 512-token step; the model alike (cap_by_compute=False) is the factor unscaled."""
    cost = _linear_cost(power_cap=True)
    ref = 1 - 10 / 35.6
    assert cost.caps_by_compute
    assert cost.compute_share(0, 512, 512, [512]) == pytest.approx(ref, rel=1e-6)
    assert cost.compute_share(8, 0, 800) == pytest.approx(4 / 14, rel=1e-6)
    assert cost.compute_share(8, 256, 800 + 256, [(256, 0)]) == pytest.approx(16.8 / 26.8, rel=1e-6)
    assert cost.prefill_slowdown(1.0, 0.0, ref) == pytest.approx(1.1)
    assert cost.prefill_slowdown(1.0, 0.0, 4 / 14) == pytest.approx(1 + 0.1 * (4 / 14) / ref)
    assert cost.prefill_slowdown(1.0) == pytest.approx(1.1)  # no share given: the step's own
    assert cost.prefill_slowdown(0.4, 0.0, 0.5) == 1.0  # at the paused points' duty: nothing
    alike = _linear_cost(power_cap=True, cap_by_compute=False)
    assert not alike.caps_by_compute
    assert alike.prefill_slowdown(1.0, 0.0, 4 / 14) == pytest.approx(1.1)
    assert not _linear_cost().caps_by_compute  # the power cap off


def test_the_power_cap_slows_a_decode_step_after_a_prefill():
    """One request of 1,024 tokens (its prefill 61.2 ms after an idle spell: not slowed), then
    one decode step (10.5 ms), whose 100 ms window held 61.2 ms of prefill (f = 0.612): slowed
    by 0.1 (0.612 - 0.4) / 0.6 x its share (0.5 / 10.5) over the reference's; not at all by the
    model alike."""
    from scheduler.batcher import BatcherConfig
    from sims.adapters import SimSchedulerConfig
    from sims.event_loop import EngineConfig, simulate
    from sims.workload import Workload

    w = Workload(arrival_time=np.array([0.0]), prompt_len=np.array([1024], dtype=np.int64),
                 output_len=np.array([2], dtype=np.int64), prefix_group=np.array([-1], dtype=np.int64),
                 prefix_len=np.zeros(1, dtype=np.int64), queue_class=np.array([-1], dtype=np.int64),
                 priority=np.zeros(1, dtype=np.int64))
    sched = SimSchedulerConfig(batcher=BatcherConfig(target_throughput=8000.0), max_num_batched_tokens=2048)
    cfg = EngineConfig(num_samples=1)
    cost = _linear_cost(power_cap=True)
    res = simulate(w, cost, sched, cfg)
    alike = simulate(w, _linear_cost(power_cap=True, cap_by_compute=False), sched, cfg)
    prefill = 0.010 + 0.05e-3 * 1024
    assert res.first_token_time[0] - res.dispatch_time[0] == pytest.approx(prefill, rel=1e-6)
    ref = 1 - 10 / 35.6
    want = 0.0105 * (1 + 0.1 * (prefill / 0.1 - 0.4) / 0.6 * (0.5 / 10.5) / ref)
    assert res.finish_time[0] - res.first_token_time[0] == pytest.approx(want, rel=1e-6)
    assert alike.finish_time[0] - alike.first_token_time[0] == pytest.approx(0.0105, rel=1e-6)


def _bins(cost, steps):
    return {r["bin"]: r for r in step_cost_table(cost, steps)}


def test_the_grid_steps_by_compute_share(grid):
    """The grid's 11,574 live steps against the paused profile: with every prefill step slowed
    alike, those after prefill-heavy time are charged 3.3% over and the decode-only steps right
    after one 3.2% under; by compute share every populated bin is within 2.5%."""
    steps, bad = grid[4], grid[5]
    assert len(steps) == 11574 and bad == 0
    prof = GRID / "profile_33b.json"
    alike = _bins(ProfileCost.from_json(prof, hide_launch=True, power_cap=True, cap_by_compute=False), steps)
    share = _bins(ProfileCost.from_json(prof, hide_launch=True, power_cap=True), steps)
    heavy, after = "prefill <= 512, busy, prefill share >= 0.5", "decode-only, after a prefill step"
    assert alike[heavy]["n"] > 3000 and alike[heavy]["ratio"] > 1.03
    assert alike[after]["ratio"] < 0.97
    for name, r in share.items():
        if r["n"] >= 50 and not name.startswith("  "):
            assert abs(r["ratio"] - 1) < 0.025, name


def test_the_replay_needs_the_live_prefill_cap(grid):
    """Replayed with the engine's cap, every prefill step of the 0.5x runs is the live one;
    the 0.8x runs part late or not at all."""
    validate, arrivals, batches, rows, _, _ = grid
    delay, _ = dispatch_delay(rows, batches)
    res = resimulate(validate, arrivals, str(GRID / "profile_33b.json"), False, DELIVERY_S, LEAD_S,
                     True, True, True, record_steps=True, network_delay_s=delay,
                     prefill_cap=session_prefill_cap(validate))
    sched = schedule_report(res, validate, arrivals, batches, rows, LEAD_S, True, delay)
    assert all(r["first_divergence"] is None for r in sched[0]["runs"])
    assert sched[1]["same_prefill_step_share"] >= 0.96
    assert res["model_terms"]["prefill_cap"]["max_tokens"] == 256


@pytest.mark.slow
def test_without_the_cap_no_prefill_step_matches_and_live_times_agree(grid):
    """Without the cap the replay prefilled whole prompts where the engine ran 256-token
    chunks (< 1% of steps alike); with the live step times fed back (the power cap not charged
    on top of them again) the schedules agree in every run at 0.5 and 0.8x."""
    validate, arrivals, batches, rows, _, _ = grid
    delay, _ = dispatch_delay(rows, batches)
    args = (validate, arrivals, str(GRID / "profile_33b.json"), False, DELIVERY_S, LEAD_S, True, True, True)
    off = resimulate(*args, record_steps=True, network_delay_s=delay)
    sched = schedule_report(off, validate, arrivals, batches, rows, LEAD_S, True, delay)
    assert max(ld["same_prefill_step_share"] for ld in sched) < 0.01
    res = resimulate(*args, record_steps=True, network_delay_s=delay,
                     wrap_cost=lambda c, ids: LiveTimedCost(c, ids, rows),
                     prefill_cap=session_prefill_cap(validate))
    sched = schedule_report(res, validate, arrivals, batches, rows, LEAD_S, True, delay)
    assert all(r["first_divergence"] is None for ld in sched[:2] for r in ld["runs"])
    for ld in res["loads"][:3]:
        for name in ("tpot_p50", "throughput"):
            assert abs(ld["summary"][name]["rel_err"]["mean"]) < 0.01, (ld["load_label"], name)


def _rec(t, ms, prefill=(), d=1):
    return StepRecord(t, d, tuple(prefill), (), ms)


def test_first_divergence_by_another_arrival_closed_form():
    """a (flushed long before) has its second chunk planned at the same step on both sides; live
    plans that step at 98 ms (2 ms lead), after e reached the backend (97 ms), so the backlog
    holds e too and the step takes e's prompt beside a's chunk; simulated, the step before ran
    3 ms shorter, its plan at 95 ms missed e. The moved request, a, came long before both plans:
    not its own timing but e's arrival between the two plans."""
    lead = 0.002
    live = [_rec(0.0, 40.0, [("a", 256, 0)]), _rec(0.040, 60.0, [("x", 256, 0)]),
            _rec(0.100, 60.0, [("a", 256, 256), ("e", 512, 0)])]
    sim = [_rec(0.0, 40.0, [("a", 256, 0)]), _rec(0.040, 57.0, [("x", 256, 0)]),
           _rec(0.097, 40.0, [("a", 256, 256)]), _rec(0.137, 40.0, [("e", 256, 0)])]
    flush = {"a": -0.001, "x": 0.030, "e": 0.097}
    d = first_divergence(live, sim, flush, lead, prefill_deadline=True)
    assert d["index"] == 2 and not d["by_timing"]
    assert d["cause"] == "arrival" and d["arrival_between_plans"] == "e"
    assert d["plans_ms_apart"] == pytest.approx(3.0)
    same_plan = [*sim[:2], _rec(0.097, 40.0, [("a", 200, 256)], d=2)]
    d = first_divergence([*sim[:2], _rec(0.097, 40.0, [("a", 256, 256)])], same_plan, flush, lead, True)
    assert d["cause"] == "decodes" and d["decodes"] == [1, 2]
