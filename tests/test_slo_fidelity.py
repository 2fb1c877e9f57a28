"""Issue 31: what the simulator's replay of a live SLO run must share with the live run for the
two to decide alike: the backends' waiting order (echo backends admit Fast first) and each
request's own TTFT target (the probes of `bench.serving.slo_control` carry one)."""
from __future__ import annotations

import io
from dataclasses import replace

from scheduler.decisions import ArrivalRecord, DecisionLog, parse_records
from scheduler.slo import SLOTargets
from scheduler.step_scheduler import SchedulerConfig, StepResult, StepScheduler
from sims.adapters import SimSchedulerConfig
from sims.cost import ConstantCost
from sims.decision_replay import refused_ids, replay_run
from sims.event_loop import EngineConfig


def _admission_order(by_class: bool) -> list[str]:
    """One slot; a Slow request runs, then Normal, Slow and Fast ones wait: who starts next."""
    s = StepScheduler(SchedulerConfig(max_model_len=256, num_blocks=64, block_size=4,
                                      max_num_seqs=1, waiting_by_class=by_class))
    s.add_request("run", [1, 2], 3, 0.0)
    first = s.schedule()  # "run" takes the slot (its prefill)
    for i, (rid, max_tokens) in enumerate((("n1", 20), ("s1", 100), ("f1", 4), ("n2", 30),
                                           ("f2", 2))):
        assert s.add_request(rid, [1, 2], max_tokens, 1.0 + i) is None
    order: list[str] = []
    _drain(s, first, order)
    return order


def _drain(s: StepScheduler, plan, order: list[str]) -> None:
    for _ in range(1000):
        if plan is not None:
            s.update(plan, StepResult({c.request_id: 7 for c in plan.chunks if c.sample}))
            s.check_integrity()
        if not s.has_unfinished():
            return
        plan = s.schedule()
        order.extend(c.request_id for c in plan.chunks if c.is_prefill and c.start_pos == 0)
    raise AssertionError("did not finish")


def test_waiting_by_class_admits_fast_first_fcfs_within_a_class():
    assert _admission_order(True) == ["f1", "f2", "n1", "n2", "s1"]
    assert _admission_order(False) == ["n1", "s1", "f1", "n2", "f2"]  # the default: FCFS


def test_a_preempted_sequence_keeps_the_front_of_a_by_class_queue():
    s = StepScheduler(SchedulerConfig(max_model_len=256, num_blocks=64, block_size=4,
                                      max_num_seqs=1, waiting_by_class=True))
    s.add_request("slow", [1, 2], 100, 0.0)
    plan = s.schedule()
    s.waiting.appendleft(s.running.pop())  # as _preempt leaves it (admitted, at the front)
    s.running.clear()
    s.add_request("fast", [1, 2], 2, 1.0)
    assert [q.request_id for q in s.waiting] == ["slow", "fast"]
    del plan


def test_decision_log_keeps_a_requests_own_ttft_target():
    log = DecisionLog(io.StringIO())
    log.arrival("p", 1.0, 8, 4, 0, 0.99, slo_ttft_ms=1e6)
    log.arrival("q", 1.1, 8, 4, 0, refused=True)
    arrivals, _ = parse_records(log.sink.getvalue().splitlines())
    assert [a.slo_ttft_ms for a in arrivals] == [1e6, None]
    assert arrivals[1].refused and not arrivals[0].refused


def _burst(own_ms: float | None) -> list[ArrivalRecord]:
    """A burst on one backend serving one request at a time: the late ones cannot make 60 ms;
    the last one carries its own target (a probe)."""
    out = [ArrivalRecord(f"r{i}", 10.0 + 0.005 * i, 8, 4, 0) for i in range(200)]
    out.append(ArrivalRecord("probe", 10.9991, 8, 4, 0, slo_ttft_ms=own_ms))
    return out


def test_replay_admits_what_the_live_gateway_admitted_by_its_own_target():
    sched = SimSchedulerConfig(slo=SLOTargets.parse("60", None), admission=True, max_num_seqs=1)
    engine = EngineConfig(num_samples=1, num_backends=1)
    cost = ConstantCost(0.010, num_blocks=1 << 10)
    # without its own target the probe is refused with the others of the burst's tail ...
    arrivals = _burst(None)
    res, _ = replay_run(arrivals, sched, cost, engine)
    refused = refused_ids(res, arrivals)
    assert "probe" in refused and len(refused) > 50
    # ... with it (as the live gateway saw it) it is admitted, and the rest decide as before
    arrivals = _burst(1e6)
    res, _ = replay_run(arrivals, sched, cost, engine)
    refused_own = refused_ids(res, arrivals)
    assert "probe" not in refused_own and refused_own == refused - {"probe"}


def test_forced_replay_follows_the_live_decisions_and_records_its_own():
    from dataclasses import replace

    from bench.simulator.decision_fidelity import compare_predictions
    from sims.decision_replay import predictions_ms
    sched = SimSchedulerConfig(slo=SLOTargets.parse("60", None), admission=True, max_num_seqs=1)
    engine = EngineConfig(num_samples=1, num_backends=1)
    cost = ConstantCost(0.010, num_blocks=1 << 10)
    free = _burst(None)
    res, _ = replay_run(free, sched, cost, engine)
    own = refused_ids(res, free)
    # a live log that refused the first request (the simulator admits it) and admitted the rest
    live = [replace(a, refused=(a.request_id == "r0")) for a in free]
    res_f, _ = replay_run(live, sched, cost, engine, forced=True)
    ids = [a.request_id for a in live]
    assert [ids[i] for i in res_f.rejected.nonzero()[0]] == ["r0"]  # what it followed
    forced_own = refused_ids(res_f, live)
    assert "r0" not in forced_own and len(forced_own) > 50  # its own decisions, recorded
    assert forced_own != own  # taken in another state: every late request was admitted live
    # predictions compared arrival by arrival with what the live log recorded
    preds = predictions_ms(res, free)
    logged = [replace(a, predicted_ms=preds[a.request_id][0] + 5.0, margin_ms=preds[a.request_id][1])
              for a in free]
    cmp = compare_predictions(logged, preds)
    assert cmp["num_compared"] == len(free)
    assert cmp["predicted_sim_minus_live_ms"]["p50"] == -5.0


def test_forced_replay_windows_follow_the_live_admission(tmp_path, capsys):
    """Issue 31, fourth session: with no idle flush a window's members depend on the arrivals
    and the admission decisions alone, so a replay that follows the live decisions flushes the
    live windows exactly (`windows_forced`), while the free replay, whose admission differs at
    one arrival, regroups the windows after it."""
    import json

    from bench.simulator.decision_fidelity import main
    from scheduler.batcher import BatcherConfig
    batcher = BatcherConfig(max_batch_size=4, min_latency_ms=400, target_throughput=1,
                            idle_flush=False)
    sched = SimSchedulerConfig(slo=SLOTargets.parse("1000", None), admission=True, max_num_seqs=1,
                               batcher=batcher)
    engine = EngineConfig(num_samples=1, num_backends=1)
    cost = ConstantCost(0.010, num_blocks=1 << 10)
    free = _burst(None)
    res, _ = replay_run(free, sched, cost, engine)
    refused = refused_ids(res, free)
    flip = next(a.request_id for a in free if a.request_id in refused)
    # the "live" run: the simulator's decisions with its first refusal admitted, and the
    # windows a batcher makes of them (the forced replay's)
    live = [replace(a, refused=(a.request_id in refused) != (a.request_id == flip)) for a in free]
    _, windows = replay_run(live, sched, cost, engine, forced=True)
    log = DecisionLog(io.StringIO())
    for a in live:
        log.arrival(a.request_id, a.t, a.num_prompt_tokens, a.max_tokens, a.queue_class,
                    refused=a.refused)
    for w in windows:
        log.batch(w.t, w.request_ids, w.classes)
    path = tmp_path / "live.jsonl"
    path.write_text(log.sink.getvalue())
    assert main([str(path), "--slo-ttft-ms", "1000", "--step-ms", "10", "--max-batch-size", "4",
                 "--min-latency-ms", "400", "--target-throughput", "1", "--no-idle-flush",
                 "--max-num-seqs", "1"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["admission"]["same_decision_share"] == 1.0 - 1 / len(free)
    assert r["same_membership_share"] < 1.0 and not r["sequence_identical"]  # windows regrouped
    wf = r["windows_forced"]
    assert wf["sequence_identical"] and wf["same_membership_share"] == 1.0
    assert wf["mean_window_size"][0] > 3.0
