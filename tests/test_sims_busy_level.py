"""Issue 35, session 40: the busy level (sims.profile_cost, "The busy level"; opt-in, `decode_spells="spin"`,
`validate_replay --decode-spells spin`).

The grid's points are timed after the profile's pause; a busy engine never pauses. The pause check's
sustained_mixed run times its step after the pause and with no pause (the spin that queues it alone): their
ratio is the level a step with prefill pays when it is launched behind another. With it no decode spell
counts. Closed forms on the power-by-kind tests' law."""
import pytest

from tests.test_sims_power_by_kind import (
    _cost,
    _law,
    _mixed,
    _prefill_step_time,
    _spell_then_prefill,
)

R_SPIN = 1.04


def _spun(r_mix=1.3, r_spin=R_SPIN):
    run = _mixed(r_mix)
    paused = run["paused_ms_median"]
    return {**run, "paused_device_ms_median": paused, "spin_device_ms_median": paused * r_spin}


def test_the_level_is_the_no_pause_timing_over_the_paused_one_and_replaces_the_spells():
    spin = _cost(_spun(), tau=0.02, r=1.5, decode_spells="spin")
    assert spin.busy_level == pytest.approx(R_SPIN)
    assert spin.weights_cap_by_power and not spin.counts_decode_spells
    # a profile whose mixed run has no no-pause timing (every H200 grid part): the spells stay
    plain = _cost(_mixed(1.3), tau=0.02, r=1.5, decode_spells="spin")
    assert plain.busy_level is None and plain.counts_decode_spells
    # the default form has no level whatever the profile measured
    assert _cost(_spun(), tau=0.02, r=1.5).busy_level is None
    with pytest.raises(ValueError, match="decode_spells"):
        _cost(_spun(), tau=0.02, r=1.5, decode_spells="sometimes")


@pytest.mark.parametrize("by_compute", [False, True])
def test_a_prefill_step_behind_a_decode_spell_pays_the_level_not_the_spell(by_compute):
    """B's 64-token prompt joins while A has decoded for 0.5 s: with the spells B's step throttles at its own
    kind's weight (> 5 % here); with the level it takes T_B x r_spin (no prefill in the window: the cap's factor
    is 1, whether the cap goes by compute share or not), in the event loop and in the live-step scorer alike."""
    tb = _law(1, 64)
    spin = _cost(_spun(), tau=0.02, r=1.5, decode_spells="spin", cap_by_compute=by_compute)
    assert spin.caps_by_compute == by_compute
    dt, d = _prefill_step_time(spin, [0.0, 0.5], [200, 3])
    assert d == 1 and dt == pytest.approx(tb * R_SPIN, rel=1e-6)
    spells, _ = _prefill_step_time(_cost(_spun(), tau=0.02, r=1.5, cap_by_compute=by_compute), [0.0, 0.5], [200, 3])
    assert spells > 1.05 * tb
    from bench.simulator.fidelity_steps import model_step_ms
    steps = _spell_then_prefill(tb)
    (_, ms, _), = [row for row in model_step_ms(spin, steps) if row[0] == len(steps) - 1]
    assert ms == pytest.approx(1e3 * tb * R_SPIN, rel=1e-9)
    # the same step after an idle spell: its paused time, the pause the grid's points had
    steps[-1]["idle_before"] = True
    (_, ms, _), = [row for row in model_step_ms(spin, steps) if row[0] == len(steps) - 1]
    assert ms == pytest.approx(1e3 * tb, rel=1e-9)


def test_a_prompt_into_an_idle_engine_keeps_its_paused_time():
    """A single prompt into an idle engine: its first step is launched from idle, so no level (the event loop's
    step from idle)."""
    spin = _cost(_spun(), tau=0.02, r=1.5, decode_spells="spin")
    from scheduler.batcher import BatcherConfig
    from sims.adapters import SimSchedulerConfig
    from sims.event_loop import EngineConfig, simulate
    from tests.sim_helpers import workload

    one = SimSchedulerConfig(batcher=BatcherConfig(target_throughput=8000.0))
    cfg = EngineConfig(num_samples=1, max_stretch_steps=1, async_plan_lead_s=0.002,
                       prefill_launch_deadline=False, record_steps=True)
    steps = simulate(workload([0.0], [3]), spin, one, cfg).extra["steps"]
    assert steps[0][3] and steps[1][0] - steps[0][0] == pytest.approx(_law(0, 64), rel=1e-6)


def test_the_flag_reaches_the_replays_cost_model():
    """`validate_replay --decode-spells spin` reaches CostSpec's ProfileCost; on a committed H100 profile (the 33B
    bf16, session 39) the level is its sustained_mixed run's no-pause / paused device time, 1.0407."""
    from pathlib import Path

    from bench.simulator.validate_replay import parser
    from sims.runner import CostSpec

    assert parser().parse_args(["v.json", "d.jsonl.gz", "s.jsonl.gz", "--decode-spells", "spin"]).decode_spells == "spin"
    prof = (Path(__file__).resolve().parents[1] / "bench" / "results" / "pairs_s39" / "h100_33b" / "33b-seeds0-1"
            / "33b" / "profile_33b.json")
    on = {"hide_launch": True, "power_cap": True, "cap_by_power": True}
    spin = CostSpec(model="tiny", profile=str(prof), **on, decode_spells="spin").build()
    assert spin.busy_level == pytest.approx(40.237057 / 38.665087, rel=1e-5)
    assert not spin.counts_decode_spells
    assert CostSpec(model="tiny", profile=str(prof), **on).build().busy_level is None
