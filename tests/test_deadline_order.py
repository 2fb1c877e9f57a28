"""The deadline order (scheduler.deadline_order; issue 31, seventeenth session): the last free slot
goes to the waiting request with the earliest TTFT deadline instead of the class order's next one
when the first would miss its deadline waiting for the next slot and the second would not, in
the echo engine, the step scheduler and the simulator alike; with ample slack on that side, none
on the other, no deadline (0) or the rule off, the class order exactly as before. The gateway puts the deadline
(arrival + TTFT target) on the wire with `--send-deadlines`; the worker reads it on its clock."""
from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import numpy as np
import pytest
from test_gateway_fakes import FakeBackend
from test_gateway_http import ipc_address, make_config

from backend.engine.continuous import EngineConfig
from backend.engine.echo import EchoEngine
from backend.runner.sampler import SamplingParams
from proto import tidegate_pb2 as pb
from scheduler.deadline_order import UrgentQueue
from scheduler.slo import SLOTargets
from scheduler.step_scheduler import SchedulerConfig, StepScheduler

FAST, NORMAL = 4, 20  # max_tokens of a Fast and of a Normal request (class bounds 8 / 64)


# ---- the echo engine (the CPU benchmark's backend) -------------------------------------------
STEP = 0.02
T0 = 1000.0  # the echo engine's clock, frozen in these tests (its paced sleeps skipped)


@pytest.fixture
def frozen_clock(monkeypatch):
    from backend.engine import echo

    monkeypatch.setattr(echo, "time", SimpleNamespace(monotonic=lambda: T0, sleep=lambda s: None,
                                                      perf_counter=time.perf_counter))


def _echo_first_starts(deadline_order: bool, normal_dl: float, fast_dl: float,
                       margin_s: float = 0.0) -> list[str]:
    """One slot, held by a running request for one more step; then a Normal request (deadline
    `normal_dl` after T0; 0: none) and after it a Fast one of 4 tokens (`fast_dl`), 20 ms steps.
    If the Fast one takes the slot at T0, the next frees 4 steps later: the Normal one's first
    token would come at T0 + 0.1 s. The order in which the two start."""
    eng = EchoEngine(EngineConfig(max_model_len=512, num_blocks=1024, block_size=16,
                                  max_num_seqs=1), vocab_size=259, step_delay_s=STEP,
                     deadline_order=deadline_order, deadline_margin_s=margin_s)
    assert eng.add_request("blocker", [1, 2], SamplingParams(max_tokens=2)) is None
    eng.step()  # the blocker runs; one token left
    assert eng.add_request("normal", [1, 2], SamplingParams(max_tokens=NORMAL),
                           deadline=T0 + normal_dl if normal_dl else 0.0) is None
    assert eng.add_request("fast", [1, 2], SamplingParams(max_tokens=FAST),
                           deadline=T0 + fast_dl if fast_dl else 0.0) is None
    started: list[str] = []
    while eng.has_unfinished():
        for out in eng.step():
            if out.request_id not in started and out.request_id != "blocker":
                started.append(out.request_id)
        eng.check_integrity()
    return started


def test_echo_starts_a_normal_that_cannot_wait_before_a_fast_that_can(frozen_clock):
    assert _echo_first_starts(True, 0.05, 0.5) == ["normal", "fast"]
    assert _echo_first_starts(True, 0.099, 0.0) == ["normal", "fast"]  # Fast: no deadline
    # already past its deadline: still promoted (a miss by less), the Fast one can wait
    assert _echo_first_starts(True, -0.5, 0.5) == ["normal", "fast"]


def test_echo_keeps_class_order_where_either_side_says_so(frozen_clock):
    assert _echo_first_starts(True, 0.10, 0.5) == ["fast", "normal"]   # Normal can wait a slot
    assert _echo_first_starts(True, 10.0, 0.5) == ["fast", "normal"]   # slack ample
    assert _echo_first_starts(True, 0.05, 0.09) == ["fast", "normal"]  # the Fast one cannot wait
    assert _echo_first_starts(True, 0.0, 0.5) == ["fast", "normal"]    # 0: no deadline
    assert _echo_first_starts(False, 0.05, 0.5) == ["fast", "normal"]  # off: the old order
    # a margin asks more room of the Fast one: 0.5 s is not 0.45 s more than it needs
    assert _echo_first_starts(True, 0.05, 0.5, margin_s=0.45) == ["fast", "normal"]
    assert _echo_first_starts(True, 0.12, 0.5, margin_s=0.05) == ["normal", "fast"]


def test_echo_contests_only_the_last_free_slot_and_forgets_started_requests(frozen_clock):
    eng = EchoEngine(EngineConfig(max_model_len=512, num_blocks=1024, block_size=16,
                                  max_num_seqs=2), vocab_size=259, step_delay_s=STEP,
                     deadline_order=True)
    assert eng.add_request("normal", [1], SamplingParams(max_tokens=NORMAL), deadline=T0) is None
    assert eng.add_request("fast", [1], SamplingParams(max_tokens=FAST)) is None
    eng.step()
    assert set(eng.scheduler.running) == {"normal", "fast"} and eng.num_promoted == 0
    assert eng.urgent.earliest() is None and len(eng.urgent) == 0  # started: dropped


# ---- the step scheduler (our engine's, and the simulator's backends') -----------------------
def _sched(deadline_order: bool = True, margin_s: float = 0.0, max_num_seqs: int = 1) -> StepScheduler:
    return StepScheduler(SchedulerConfig(max_model_len=512, num_blocks=256, block_size=16,
                                         max_num_seqs=max_num_seqs, max_num_batched_tokens=512,
                                         enable_prefix_caching=False, waiting_by_class=True,
                                         deadline_order=deadline_order, deadline_margin_s=margin_s))


def _admitted(s: StepScheduler, now: float | None) -> list[str]:
    return [c.request_id for c in s.schedule(now=now, step_s=STEP).chunks if c.is_prefill]


@pytest.mark.parametrize("now,fast_dl,first", [
    # Normal: first token at 0.95 + 5 steps > 1.0 after the Fast one's 4; the Fast one's at
    # 0.95 + 21 steps = 1.37 after the Normal one's 20
    (0.95, 1.40, "normal"),
    (1.50, 2.00, "normal"),  # past its deadline: still the one that cannot wait
    (0.95, 0.00, "normal"),  # the Fast one has no deadline
    (0.50, 1.40, "fast"),    # the Normal one can wait for the next slot
    (0.95, 1.30, "fast"),    # the Fast one cannot wait either: class order
    (None, 1.40, "fast"),    # no clock given: the queue's order
])
def test_step_scheduler_promotes_exactly_where_the_echo_engine_does(now, fast_dl, first):
    s = _sched()
    assert s.add_request("normal", [1] * 8, NORMAL, 0.0, deadline=1.0) is None
    assert s.add_request("fast", [1] * 8, FAST, 0.1, deadline=fast_dl) is None
    assert _admitted(s, now) == [first]
    assert s.num_promoted == (first == "normal")


def test_step_scheduler_without_deadline_or_rule_is_the_class_order():
    s = _sched()
    assert s.add_request("normal", [1] * 8, NORMAL, 0.0) is None  # deadline 0: none
    assert s.add_request("fast", [1] * 8, FAST, 0.1, deadline=5.0) is None
    assert _admitted(s, 0.95) == ["fast"]
    off = _sched(deadline_order=False)
    assert off.urgent is None
    assert off.add_request("normal", [1] * 8, NORMAL, 0.0, deadline=1.0) is None
    assert off.add_request("fast", [1] * 8, FAST, 0.1) is None
    assert _admitted(off, 0.95) == ["fast"]


def test_step_scheduler_earliest_deadline_takes_the_last_slot():
    s = _sched(max_num_seqs=2)
    assert s.add_request("slow", [1] * 8, 100, 0.0, deadline=1.01) is None
    assert s.add_request("normal2", [1] * 8, NORMAL, 0.1, deadline=5.0) is None
    assert s.add_request("normal", [1] * 8, NORMAL, 0.2, deadline=1.02) is None
    assert s.add_request("fast", [1] * 8, FAST, 0.3) is None
    # the first slot by class order; the last one to the earliest deadline (Slow, not Normal)
    assert _admitted(s, 0.95) == ["fast", "slow"]


def test_step_scheduler_abort_leaves_no_stale_entry():
    s = _sched()
    assert s.add_request("normal", [1] * 8, NORMAL, 0.0, deadline=1.0) is None
    assert s.add_request("fast", [1] * 8, FAST, 0.1, deadline=5.0) is None
    s.abort("normal")
    assert s.urgent.earliest()[1].request_id == "fast"
    assert _admitted(s, 1.0) == ["fast"]


def test_the_next_free_slot_is_counted_alike_by_both_engines():
    """The same requests through the echo engine and the step scheduler in lockstep (the same
    class order, one token a step): before every step, the steps until a slot frees if the
    queue's head took the last one agree (what makes the simulator's choices the live ones)."""
    import random

    from scheduler.step_scheduler import StepResult

    rng = random.Random(7)
    eng = EchoEngine(EngineConfig(max_model_len=512, num_blocks=4096, block_size=16,
                                  max_num_seqs=4), vocab_size=259)
    s = _sched(max_num_seqs=4)
    n = checked = 0
    for _ in range(300):
        for _ in range(rng.choice((0, 0, 1, 2))):
            m = rng.randint(1, 80)
            assert eng.add_request(str(n), [1, 2, 3], SamplingParams(max_tokens=m)) is None
            assert s.add_request(str(n), [1, 2, 3], m, float(n)) is None
            n += 1
        if s.waiting:
            head = s.waiting[0]
            echo_head = min(eng.scheduler.waiting, key=lambda r: eng.states[r].order)
            assert head.request_id == echo_head
            assert s.slot_frees_in(head) == eng.slot_frees_in(eng.states[echo_head])
            checked += 1
        plan = s.schedule()
        s.update(plan, StepResult({c.request_id: 1 for c in plan.chunks if c.sample}))
        eng.step()
        assert set(eng.scheduler.running) == {q.request_id for q in s.running}
    assert checked > 100


# ---- the urgent queue ------------------------------------------------------------------------
def test_urgent_queue_ignores_no_deadline_and_rejects_a_negative_margin():
    waiting = {"a", "b"}
    q = UrgentQueue(0.0, waiting.__contains__)
    q.add(0.0, "a")
    assert len(q) == 0 and q.earliest() is None
    q.add(2.0, "b")
    q.add(1.0, "a")
    assert q.earliest() == (1.0, "a")
    waiting.discard("a")
    assert q.earliest() == (2.0, "b") and len(q) == 1
    with pytest.raises(ValueError):
        UrgentQueue(-0.1, waiting.__contains__)
    with pytest.raises(ValueError):
        SchedulerConfig(max_model_len=16, num_blocks=4, deadline_margin_s=-1.0)


def test_promote_is_both_sides():
    from scheduler.deadline_order import promote
    assert promote(1.0, 2.0, 0.99, 1.5, first_token_s=0.02)
    assert not promote(1.0, 2.0, 0.97, 1.5, first_token_s=0.02)   # U can wait
    assert not promote(1.0, 2.0, 0.99, 1.99, first_token_s=0.02)  # H cannot (after U)
    assert promote(1.0, 0.0, 0.99, 9.0, first_token_s=0.02)       # H has no deadline
    assert not promote(1.0, 1.7, 0.99, 1.5, first_token_s=0.02, margin_s=0.2)


# ---- the simulator ---------------------------------------------------------------------------
def _sim_first_tokens(deadline_order: bool, normal_ttft_ms: int = 400) -> list[float]:
    """One backend, one slot, 20 ms steps: r0 (Normal, 20 tokens) holds the slot until 0.4 s;
    r1 (Normal, 10 tokens) arrives at 0.01 s (deadline 0.41 s), r2 (Fast, 4 tokens, target
    350 ms) at 0.30 s (deadline 0.65 s: it can wait the 10 steps of r1, r1 not its 4). The
    first-token times."""
    from sims.adapters import SimSchedulerConfig
    from sims.cost import ConstantCost
    from sims.event_loop import EngineConfig as SimEngineConfig
    from sims.event_loop import simulate
    from sims.workload import Workload

    n = 3
    w = Workload(arrival_time=np.array([0.0, 0.01, 0.30]), prompt_len=np.full(n, 8),
                 output_len=np.array([NORMAL, 10, FAST]), prefix_group=np.full(n, -1),
                 prefix_len=np.zeros(n, dtype=np.int64), queue_class=np.full(n, -1),
                 priority=np.zeros(n, dtype=np.int64))
    sched = SimSchedulerConfig(max_num_seqs=1, waiting_by_class=True, enable_prefix_caching=False,
                               slo=SLOTargets.parse(f"fast=350,normal={normal_ttft_ms}", None),
                               deadline_order=deadline_order)
    res = simulate(w, ConstantCost(STEP, num_blocks=1 << 12), sched, SimEngineConfig(num_backends=1))
    return [float(t) for t in res.first_token_time]


def test_simulator_makes_the_same_choice():
    on, off = _sim_first_tokens(True), _sim_first_tokens(False)
    assert off[2] < off[1]  # class order: the later Fast one passes the Normal one
    assert on[1] < on[2]    # the Normal one cannot wait, the Fast one can: it starts first
    assert on[1] < off[1] and on[2] - 0.30 <= 0.35  # and the Fast one still meets 350 ms
    ample = _sim_first_tokens(True, normal_ttft_ms=5000)
    assert ample[2] < ample[1]  # slack ample: unchanged


# ---- the wire and the worker's clock ---------------------------------------------------------
def test_the_deadline_round_trips_the_codec():
    from proto import codec

    req = pb.GenerateRequest(request_id="r", prompt_frame=0, arrival_time=12.5, deadline=12.9)
    env = pb.Envelope(batch=pb.Batch(requests=[req], batch_id=1))
    got = codec.decode(codec.encode(env, [[1, 2, 3]])).envelope.batch.requests[0]
    assert got.deadline == pytest.approx(12.9) and got.arrival_time == pytest.approx(12.5)
    assert pb.GenerateRequest().deadline == 0.0  # unset: none


def test_the_worker_reads_a_gateways_deadline_on_its_own_clock():
    from backend.server.worker import Worker

    w = SimpleNamespace(_clock_offset={})
    now = time.monotonic()
    # a gateway whose clock reads 1000 s ahead of ours; the request left it 5 ms ago
    far = pb.GenerateRequest(arrival_time=now + 1000 - 0.005, deadline=now + 1000 + 0.4)
    got = Worker._local_deadline(w, b"gw", far)
    assert now + 0.4 <= got <= now + 0.4 + 0.005 + 0.05
    # a later request with a faster path tightens the offset; another gateway has its own
    near = pb.GenerateRequest(arrival_time=time.monotonic() - 0.001, deadline=time.monotonic() + 0.3)
    assert Worker._local_deadline(w, b"gw2", near) == pytest.approx(near.deadline, abs=0.05)
    assert set(w._clock_offset) == {b"gw", b"gw2"}


class _Recorder(FakeBackend):
    def _admit(self, peer, r, prompt) -> None:
        self.deadlines = getattr(self, "deadlines", {})
        self.deadlines[r.request_id] = (r.arrival_time, r.deadline, r.sampling.max_tokens)
        super()._admit(peer, r, prompt)


@pytest.mark.parametrize("send", [True, False])
async def test_the_gateway_sends_arrival_plus_target(aiohttp_client, send):
    from gateway.app import create_app

    b = await _Recorder(ipc_address(), step_s=0.005).start()
    try:
        app = create_app(make_config(b.address, slo=SLOTargets.parse("fast=150", None),
                                     send_deadlines=send), startup_wait_s=5.0)
        client = await aiohttp_client(app)
        for body in ({"max_tokens": 2}, {"max_tokens": 2, "slo_ttft_ms": 500},
                     {"max_tokens": 20}):
            resp = await client.post("/v1/completions", json={"prompt": "hi", "ignore_eos": True,
                                                              **body})
            assert resp.status == 200
            await resp.read()
        await asyncio.sleep(0)
        got = sorted(b.deadlines.values(), key=lambda v: v[0])
        spans = [(round(dl - arr, 6) if dl else 0.0) for arr, dl, _ in got]
        # Fast: its class's 150 ms; its own 500 ms; Normal: no target, no deadline
        assert spans == ([0.15, 0.5, 0.0] if send else [0.0, 0.0, 0.0])
    finally:
        await b.stop()


# ---- the flags -------------------------------------------------------------------------------
def test_the_flags_reach_the_engines_the_gateway_and_the_simulator():
    from backend.engine.args import backend_config
    from backend.engine.assemble import engine_config
    from backend.engine.echo import create_echo_engine
    from backend.server.cli import serve_parser
    from gateway.serve import build_parser, embedded_backend_argv, gateway_config
    from sims.options import add_run_args, parse_with_config, spec_from_args

    class Runner:
        max_model_len = 256

        class kv:
            num_blocks = 64

    on = backend_config(serve_parser().parse_args(["--deadline-order", "--deadline-margin-ms", "50"]))
    off = backend_config(serve_parser().parse_args([]))
    assert on.deadline_order and on.deadline_margin_ms == 50 and not off.deadline_order
    sc = engine_config(on, Runner, None).scheduler_config()
    assert sc.deadline_order and sc.deadline_margin_s == pytest.approx(0.05)
    assert not engine_config(off, Runner, None).scheduler_config().deadline_order
    from dataclasses import replace
    eng, _ = create_echo_engine(replace(on, model="echo"))
    assert eng.urgent is not None and eng.urgent.margin_s == pytest.approx(0.05)
    assert create_echo_engine(replace(off, model="echo"))[0].urgent is None

    args = build_parser().parse_args(["--send-deadlines", "--deadline-order"])
    assert gateway_config(args, ["ipc:///tmp/z.sock"]).send_deadlines
    assert "--deadline-order" in embedded_backend_argv(args, "ipc:///tmp/z.sock")
    assert not gateway_config(build_parser().parse_args([]), ["ipc:///tmp/z.sock"]).send_deadlines

    import argparse
    p = argparse.ArgumentParser()
    add_run_args(p)
    spec = spec_from_args(parse_with_config(p, ["--deadline-order", "--deadline-margin-ms", "70"]))
    assert spec.scheduler.deadline_order and spec.scheduler.deadline_margin_s == pytest.approx(0.07)
    assert not spec_from_args(parse_with_config(p, [])).scheduler.deadline_order
