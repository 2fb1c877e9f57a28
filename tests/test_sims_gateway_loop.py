"""The simulator's model of the gateway's one event loop (`EngineConfig.gateway_loop_*`, issue 35):
each step's outputs occupy the loop (per stream of the step, from a read delay after the step's
end); a window's timer that falls due inside such a busy period fires when it ends, i.e. late by
exactly the busy period's remainder; an arrival waits for the loop (or, with recorded pushes, is
charged its time-average residual). Closed-form timings on a cost model with fixed prefill /
decode step times (tests/sim_helpers.py: 100 ms prefill steps, 20 ms decode steps)."""
import numpy as np
import pytest

from scheduler.batcher import BatcherConfig
from sims.adapters import SimSchedulerConfig
from sims.event_loop import EngineConfig, simulate
from tests.sim_helpers import DECODE_S, PREFILL_S, TwoSpeedCost, workload

# a window closes 5 ms after it opens (the third rule's 1 / (100 x 0.8) = 12.5 ms is later);
# idle flush on: a request reaching an idle gateway/backend leaves at once
WINDOW = SimSchedulerConfig(batcher=BatcherConfig(min_latency_ms=5.0, target_throughput=100.0))
READ, PER_STREAM = 0.001, 0.004  # the loop starts a step's outputs 1 ms after it ends, 4 ms a stream


def run(w, **loop):
    return simulate(w, TwoSpeedCost(), WINDOW, EngineConfig(num_samples=1, max_stretch_steps=1, **loop))


def loop_on(**kw):
    return {"gateway_loop_read_s": READ, "gateway_loop_per_stream_s": PER_STREAM} | kw


def test_a_timer_due_inside_a_busy_period_fires_at_its_end():
    # A (alone, idle engine) is flushed at once: its prefill step [0, 0.1], one stream; the loop
    # then writes its first token over [0.101, 0.105]. B's window opens at 0.098: due at 0.103
    w = workload([0.0, 0.098], [40, 3])
    off, on = run(w), run(w, **loop_on())
    assert off.dispatch_time[0] == on.dispatch_time[0] == 0.0
    assert off.dispatch_time[1] == pytest.approx(0.098 + 0.005)
    # late by exactly the remainder of the busy period it fell in: 0.105 - 0.103
    busy_end = PREFILL_S + READ + PER_STREAM * 1
    assert on.dispatch_time[1] == pytest.approx(busy_end)
    assert on.dispatch_time[1] - off.dispatch_time[1] == pytest.approx(busy_end - 0.103)


def test_a_timer_outside_the_busy_periods_is_late_only_by_the_idle_lateness():
    # B's window due at 0.115: the loop was busy [0.101, 0.105] and is next at [0.121, 0.125]
    w = workload([0.0, 0.110], [40, 3])
    assert run(w).dispatch_time[1] == pytest.approx(0.115)
    assert run(w, **loop_on()).dispatch_time[1] == pytest.approx(0.115)
    late = run(w, **loop_on(gateway_timer_late_s=0.0005))
    assert late.dispatch_time[1] == pytest.approx(0.1155)
    # the idle lateness can carry a timer into a busy period: due 0.121 + 0.0005 -> 0.125
    w = workload([0.0, 0.116], [40, 3])
    assert run(w, **loop_on()).dispatch_time[1] == pytest.approx(0.121)
    late = run(w, **loop_on(gateway_timer_late_s=0.0005))
    assert late.dispatch_time[1] == pytest.approx(PREFILL_S + DECODE_S + READ + PER_STREAM)


def test_the_busy_period_grows_with_the_streams_of_the_step():
    # A and B decode together from 0.3 s on (two streams a step): the loop's job after each
    # decode step is 8 ms. C's window opens 0.5 ms after a decode step ends (before the loop
    # starts that step's outputs): due at end + 5.5 ms, inside [end + 1, end + 9 ms]: fires at end + 9 ms
    w0 = workload([0.0, 0.15], [60, 60])
    base = run(w0, **loop_on())
    d_b = base.dispatch_time[1]
    assert base.dispatch_time[0] == 0.0 and d_b > PREFILL_S
    # B's prefill runs [max(0.1 + k decodes, d_b) ...]: find a decode step end after both decode
    from sims.event_loop import EventLoop
    loop = EventLoop(w0, TwoSpeedCost(), WINDOW, EngineConfig(num_samples=1, max_stretch_steps=1,
                                                              record_steps=True, **loop_on()))
    loop.run()
    starts = [t for t, _b, d, chunks, _p in loop.step_log if d == 2 and not chunks]
    end = starts[3] + DECODE_S  # a decode step of both
    w = workload([0.0, 0.15, end + 0.0005], [60, 60, 3])
    on = run(w, **loop_on())
    assert on.dispatch_time[2] == pytest.approx(end + READ + 2 * PER_STREAM)
    assert run(w).dispatch_time[2] == pytest.approx(end + 0.0055)


def test_an_arrival_waits_for_the_loop_or_is_charged_its_mean_residual():
    # "wait": C reaches the gateway at 0.102, inside [0.101, 0.105]: pushed at 0.105, its window
    # due at 0.110; its TTFT counts from 0.102 (the client's send)
    w = workload([0.0, 0.102], [40, 3])
    on = run(w, **loop_on())
    assert on.dispatch_time[1] == pytest.approx(0.105 + 0.005)
    # "recorded" (a replay: 0.102 is the push, made after the wait): pushed at once, and every
    # request's TTFT and E2E grow by the loop's residual averaged over the arrivals' span
    rec = run(w, **loop_on(gateway_loop_arrivals="recorded"))
    off = run(w)
    assert rec.dispatch_time[1] == pytest.approx(off.dispatch_time[1])
    # over [0, 0.102]: the loop was busy [0.101, 0.102] of the job [0.101, 0.105]: residual 4 -> 3 ms
    mean = 0.001 * (0.004 + 0.003) / 2 / 0.102
    assert rec.extra["gateway_loop"]["residual_mean_s"] == pytest.approx(mean)
    assert rec.first_token_time[0] - off.first_token_time[0] == pytest.approx(mean)
    np.testing.assert_allclose(rec.finish_time - off.finish_time, mean)


def test_off_by_default_and_unchanged():
    w = workload([0.0, 0.098, 0.3, 0.31], [40, 3, 20, 5])
    a, b = run(w), run(w, gateway_loop_per_stream_s=0.0)
    np.testing.assert_array_equal(a.first_token_time, b.first_token_time)
    assert "gateway_loop" not in a.extra
    with pytest.raises(ValueError):
        simulate(w, TwoSpeedCost(), WINDOW, EngineConfig(gateway_loop_per_stream_s=0.001))  # stretches


# the async loop's lead after a step carrying prefill (`EngineConfig.async_plan_lead_prefill_s`,
# measured live by bench.simulator.plan_lead): windows of one, flushed ~0.16 ms after they open
ONE_BY_ONE = SimSchedulerConfig(batcher=BatcherConfig(target_throughput=8000.0))


def run_lead(w, lead, lead_prefill=None):
    return simulate(w, TwoSpeedCost(), ONE_BY_ONE,
                    EngineConfig(num_samples=1, max_stretch_steps=1, async_plan_lead_s=lead,
                                 async_plan_lead_prefill_s=lead_prefill))


def test_a_longer_lead_after_a_prefill_step_makes_a_request_wait_a_step_more():
    d_a = run_lead(workload([0.0], [20]), None).dispatch_time[0]
    # B is delivered ~3.3 ms before A's prefill step ends: inside a 5 ms lead, outside a 2 ms one
    w = workload([0.0, d_a + PREFILL_S - 0.0035], [20, 3])
    assert PREFILL_S - 0.005 < run_lead(w, None).dispatch_time[1] - d_a < PREFILL_S - 0.002
    assert run_lead(w, 0.002).first_token_time[1] == pytest.approx(d_a + 2 * PREFILL_S)
    assert run_lead(w, 0.002, 0.002).first_token_time[1] == pytest.approx(d_a + 2 * PREFILL_S)
    assert run_lead(w, 0.002, 0.005).first_token_time[1] == pytest.approx(
        d_a + PREFILL_S + DECODE_S + PREFILL_S)


def test_the_prefill_lead_leaves_decode_steps_alone():
    base = run_lead(workload([0.0], [40]), None).dispatch_time[0]
    step_end = base + PREFILL_S + 2 * DECODE_S
    w = workload([0.0, step_end - 0.0035], [40, 3])  # 3.5 ms before a decode step ends
    assert run_lead(w, 0.002, 0.010).first_token_time[1] == pytest.approx(step_end + PREFILL_S)
    assert run_lead(w, 0.005, 0.002).first_token_time[1] == pytest.approx(step_end + DECODE_S + PREFILL_S)


def run_line(w, line):
    return simulate(w, TwoSpeedCost(), ONE_BY_ONE,
                    EngineConfig(num_samples=1, max_stretch_steps=1, async_plan_lead_s=0.002,
                                 async_plan_lead_line=line))


def test_a_lead_by_the_step_s_duration_reads_the_step_that_ends():
    d_a = run_lead(workload([0.0], [20]), None).dispatch_time[0]
    w = workload([0.0, d_a + PREFILL_S - 0.0035], [20, 3])  # B: 3.5 ms before A's prefill step ends
    # after prefill: 0 + 0.5 x the step's duration (PREFILL_S), held in [1 ms, 50 ms]: past 3.5 ms
    late = ((0.0, 0.0, 0.001, 0.05), (0.0, 0.5, 0.001, 0.05))
    assert run_line(w, late).first_token_time[1] == pytest.approx(d_a + PREFILL_S + DECODE_S + PREFILL_S)
    # the same line held under 2 ms by its measured range: B joins the next step
    held = ((0.0, 0.0, 0.001, 0.05), (0.0, 0.5, 0.001, 0.002))
    assert run_line(w, held).first_token_time[1] == pytest.approx(d_a + 2 * PREFILL_S)
    with pytest.raises(ValueError):  # a stretch's end is not one step's
        simulate(w, TwoSpeedCost(), ONE_BY_ONE, EngineConfig(async_plan_lead_s=0.002, async_plan_lead_line=late))


def test_plan_lead_lines_recover_a_line_through_noise():
    from bench.simulator.plan_lead import engine_fields, plan_lead_lines, plan_leads
    rng = np.random.default_rng(0)
    steps, leads, t = [], [], 0.0
    for k in range(400):  # alternate decode-only and prefill steps, back to back
        ms = float(rng.uniform(4.0, 16.0))
        pre = [[f"r{k}", 64, 0]] if k % 2 else []
        steps.append({"mono": t, "ms": ms, "decodes": 4, "prefill": pre})
        lead = (0.5 + 0.2 * ms if pre else 1.0 + 0.1 * ms) + float(rng.normal(0, 0.05))
        leads.append(lead + (5.0 if k % 37 == 0 else 0.0))  # a few host hiccups: the medians ignore them
        t += ms / 1e3
    for a, b, lead in zip(steps, steps[1:], leads):  # b planned `lead` before a's end
        b["host_ms"] = [0.1, 0.4, lead + b["ms"] - 0.5, 0.0]
    ln = plan_lead_lines(steps)
    assert ln["decode"]["b"] == pytest.approx(0.1, abs=0.02) and ln["decode"]["a_ms"] == pytest.approx(1.0, abs=0.2)
    assert ln["prefill"]["b"] == pytest.approx(0.2, abs=0.02) and ln["prefill"]["a_ms"] == pytest.approx(0.5, abs=0.2)
    assert 1.4 < ln["prefill"]["lo_ms"] < ln["prefill"]["hi_ms"] < 3.8
    f = engine_fields({**plan_leads(steps), "lines": ln})
    assert f["async_plan_lead_line"][1][1] == pytest.approx(ln["prefill"]["b"])
    with pytest.raises(ValueError):
        plan_lead_lines(steps[:10])


# the terms measured from a session's logs (bench.simulator.gateway_loop, bench.simulator.plan_lead)
def _row(mono, ms, decodes, prefill=(), host=None):
    r = {"mono": mono, "ms": ms, "decodes": decodes, "prefill": [list(c) for c in prefill]}
    if host is not None:
        r["host_ms"] = host
    return r


def test_busy_periods_and_residual_on_a_step_log():
    from bench.simulator.gateway_loop import busy_periods, residual_at
    # steps ending at 0.010 (4 streams) and 0.012 (2 streams): jobs from 0.011 (4 ms) and 0.013
    # (2 ms, queued behind the first until 0.015)
    rows = [_row(0.0, 10.0, 3, [("a", 16, 0)]), _row(0.010, 2.0, 2)]
    starts, ends = busy_periods(rows, 0.001, 0.001)
    np.testing.assert_allclose(starts, [0.011, 0.013])
    np.testing.assert_allclose(ends, [0.015, 0.017])
    np.testing.assert_allclose(residual_at(starts, ends, np.array([0.005, 0.012, 0.014, 0.0175])),
                               [0.0, 0.003, 0.003, 0.0], atol=1e-12)


def test_timer_lateness_at_idle_is_read_outside_the_busy_periods():
    from types import SimpleNamespace as NS

    from bench.simulator.gateway_loop import check, measure
    # lowest load: three timer-fired windows; one's deadline falls in the loop's job after the
    # step ending at 0.100 (1 stream, 2 ms from 0.101): 1.5 ms late; the two others 0.4 / 0.6 ms
    rows = [_row(0.090, 10.0, 1)]
    arr = [NS(request_id=r, t=t) for r, t in (("a", 0.0), ("b", 0.097), ("c", 0.2))]
    wins = [NS(t=0.0054, request_ids=("a",)), NS(t=0.1035, request_ids=("b",)), NS(t=0.2056, request_ids=("c",))]
    session = {"config": {"batcher": {"min_latency_ms": 5.0}},
               "loads": [{"load_label": "0.5x", "runs": [{"ttft_path_ms": {"front": 0.05, "out": 1.0}}]}]}
    path = {"per_stream_ms": 2.0, "constant_ms": 3.0, "base_ms": 1.0, "fit": {"intercept_ms": 1.0}}
    terms = measure(session, {(0, 0): (arr, wins)}, rows, path)
    assert terms["per_stream_ms"] == 2.0 and terms["read_ms"] == 1.0 and terms["request_ms"] == 0.05
    assert terms["num_idle_windows"] == 2 and terms["timer_late_ms"] == pytest.approx(0.5)
    (row,) = check(session, {(0, 0): (arr, wins)}, rows, terms)
    # the model: 0.5 ms + what is left of the job at deadline + 0.5 ms (0.1025: 0.5 ms left) = 1.0
    assert row["num_windows"] == 3 and row["model_ms"]["mean"] == pytest.approx((0.5 + 0.5 + 1.0) / 3)


def test_plan_leads_from_the_host_phases():
    from bench.simulator.plan_lead import plan_leads
    # step 2 (after a prefill step ending at 0.020) planned at 0.030 - 13 ms = 0.017: lead 3 ms;
    # step 3 (after decode-only step 2 ending at 0.030) planned at 0.040 - 12 ms = 0.028: lead 2 ms;
    # step 4 starts after an idle spell: no lead
    rows = [_row(0.0, 20.0, 1, [("a", 16, 0)], [0.1, 0.5, 19.0, 0.0]),
            _row(0.020, 10.0, 2, (), [0.1, 0.9, 12.0, 0.0]),
            _row(0.030, 10.0, 2, (), [0.1, 0.9, 11.0, 0.0]),
            _row(0.100, 10.0, 1, (), [0.1, 0.9, 9.0, 0.0])]
    r = plan_leads(rows)
    assert r["prefill"]["median_ms"] == pytest.approx(3.0) and r["prefill"]["num_steps"] == 1
    assert r["decode"]["median_ms"] == pytest.approx(2.0) and r["decode"]["num_steps"] == 1


def test_the_terms_and_the_timer_check_on_the_committed_h200_6_7b_logs():
    """bench/results/fidelity_grid_h200_s15_gw/terms_6.7b.txt from the s14 call's files: the model
    (per-stream cost and read from the path fit, the timer's idle lateness) puts the timer-fired
    windows' mean lateness within 0.35 ms of the live one at every load, and the leads are longer
    than the profile's 1.75 ms."""
    import json
    from pathlib import Path

    from bench.serving.ttft_path import delivery_path
    from bench.simulator.fidelity_steps import read_steps
    from bench.simulator.gateway_loop import check, measure
    from bench.simulator.plan_lead import plan_leads
    from bench.simulator.validate_replay import first_token_streams, path_records, run_arrivals
    from scheduler.decisions import read_log

    r = Path(__file__).resolve().parents[1] / "bench/results/fidelity_grid_h200_s14/6.7b"
    v = json.loads((r / "validate_6.7b.json").read_text())
    arrivals, batches = read_log(str(r / "decisions_6.7b.jsonl.gz"))
    rows = read_steps(str(r / "steps_6.7b.jsonl.gz"))
    by_run = run_arrivals(v, arrivals, batches)
    streams = first_token_streams(rows)
    recs = {(si, li): path_records(run, [x.request_id for x in by_run[(si, li)][0]], streams)
            for li, ld in enumerate(v["loads"]) for si, run in enumerate(ld["runs"])}
    path = delivery_path([recs[(si, 0)] for si in range(5)], list(recs.values()))
    terms = measure(v, by_run, rows, path)
    assert terms["per_stream_ms"] == pytest.approx(0.0879, abs=1e-4)
    assert terms["read_ms"] == pytest.approx(0.866, abs=1e-3)
    assert terms["timer_late_ms"] == pytest.approx(0.60, abs=0.01)
    lat = check(v, by_run, rows, terms)
    assert [x["load_label"] for x in lat] == ["0.5x", "0.8x", "0.95x", "1.2x"]
    for x in lat:
        assert abs(x["model_ms"]["mean"] - x["live_ms"]["mean"]) < 0.35, x
    # live, the lateness grows with load; without the loop the model would say 0.60 everywhere
    assert lat[2]["live_ms"]["mean"] > lat[0]["live_ms"]["mean"] + 0.5
    assert lat[2]["model_ms"]["mean"] > lat[0]["model_ms"]["mean"] + 0.4
    leads = plan_leads(rows)
    assert leads["decode"]["median_ms"] == pytest.approx(2.22, abs=0.01)
    assert leads["prefill"]["median_ms"] == pytest.approx(3.65, abs=0.01)
    assert v["profile"]["async_plan_lead_ms"] < leads["decode"]["median_ms"]


def test_validate_replay_and_sim_validate_take_the_flags():
    import bench.simulator.validate_replay as vr
    from bench.simulator import validate
    a = validate.parser().parse_args(["--gateway-loop", "off", "--plan-lead", "profile"])
    assert a.gateway_loop == "off" and a.plan_lead == "profile"  # the form before session 17
    # the default since session 17: the loop and the measured leads brought TTFT P50 closer in every
    # cell to 0.95x of four independent H200 parts (BENCHMARKS, issue 35, session 17)
    for a in (validate.parser().parse_args([]), vr.parser().parse_args(["v", "d", "s"])):
        assert a.gateway_loop == "on" and a.plan_lead == "live"
    with pytest.raises(SystemExit):  # a choice outside the list
        vr.main(["v", "d", "s", "--plan-lead", "other"])


S14_67B = "bench/results/fidelity_grid_h200_s14/6.7b"


def test_plan_lead_profile_kinds_takes_the_profiles_two_leads(tmp_path, monkeypatch):
    """`--plan-lead profile-kinds` (issue 35, H35W): the replay's two leads are the profile's
    `plan_lead_ms` (what `backend profile` records since 40ca47c), not the step log's, not the
    one lead from the decode points (the default, unchanged); a clear error without them."""
    import json
    from pathlib import Path

    import bench.simulator.validate_replay as vr
    from bench.simulator import validate
    from bench.simulator.fidelity_steps import read_steps
    from scheduler.decisions import read_log

    r = Path(__file__).resolve().parents[1] / S14_67B
    if not (r / "steps_6.7b.jsonl.gz").is_file():
        pytest.skip("the committed s14 6.7B logs are not here")
    v = json.loads((r / "validate_6.7b.json").read_text())
    arrivals, batches = read_log(str(r / "decisions_6.7b.jsonl.gz"))
    rows = read_steps(str(r / "steps_6.7b.jsonl.gz"))
    doc = json.loads((r / "profile_6.7b.json").read_text())
    assert "plan_lead_ms" not in doc  # s14's profile predates it
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps({**doc, "plan_lead_ms": {"decode_only": 2.5, "with_prefill": 4.75}}))

    engines = []

    class Stop(Exception):
        pass

    def first_replay(spec, arr):  # the first run's engine config, then stop (no replay needed)
        engines.append(spec.engine)
        raise Stop

    monkeypatch.setattr(validate, "run_replay", first_replay)
    for lead in ("profile-kinds", "profile"):
        with pytest.raises(Stop):
            vr.replay_session(v, arrivals, batches, rows, str(prof), seeds={0}, plan_lead=lead)
    kinds, default = engines
    assert kinds.async_plan_lead_s == pytest.approx(2.5e-3)
    assert kinds.async_plan_lead_prefill_s == pytest.approx(4.75e-3)
    # the default: the one lead from the profile's decode points (2 x launch + 1 ms), for both kinds
    assert default.async_plan_lead_s == pytest.approx(1.7531e-3, abs=1e-6)
    assert default.async_plan_lead_prefill_s is None
    assert validate.profile_plan_leads(json.loads(prof.read_text()))["prefill"]["median_ms"] == 4.75
    # a profile without plan_lead_ms: a clear error, in the function and on both command lines
    with pytest.raises(ValueError, match="plan_lead_ms"):
        vr.replay_session(v, arrivals, batches, rows, str(r / "profile_6.7b.json"), seeds={0},
                          plan_lead="profile-kinds")
    with pytest.raises(SystemExit):
        vr.main([str(r / "validate_6.7b.json"), str(r / "decisions_6.7b.jsonl.gz"),
                 str(r / "steps_6.7b.jsonl.gz"), "--profile", str(r / "profile_6.7b.json"),
                 "--plan-lead", "profile-kinds"])
    a = validate.parser().parse_args(["--model", doc["model"], "--device", "cuda", "--profile",
                                      str(r / "profile_6.7b.json"), "--plan-lead", "profile-kinds",
                                      "--decision-log", str(tmp_path / "d.jsonl")])
    with pytest.raises(SystemExit, match="plan_lead_ms"):  # before any live run
        validate.validate(a)
