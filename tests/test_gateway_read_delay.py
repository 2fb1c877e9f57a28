"""Issue 31, ninth session: the simulator's gateway hears a backend's outputs late
(`EngineConfig.gateway_read_delay_s`), as the live gateway does: a step's first tokens and finishes
reach its wait predictor, placement's load and its in-flight count `d` after the step ends (and not
while its one thread sends a window: `gateway_message_s`), and its predictor notes each dispatch
at its Batch's send. The clients' times do not move. And the forced replay can follow the live
placement (`Workload.forced_backend`). Closed forms on one or two constant-step backends."""
from __future__ import annotations

import numpy as np
import pytest

from scheduler.batcher import BatcherConfig
from scheduler.slo import SLOTargets
from sims.adapters import SimSchedulerConfig
from sims.cost import ConstantCost
from sims.event_loop import EngineConfig, EventLoop
from sims.workload import Workload

STEP = 0.020


def _workload(arrival, output, cls=1, forced_backend=None) -> Workload:
    n = len(arrival)
    return Workload(arrival_time=np.array(arrival, dtype=np.float64),
                    prompt_len=np.full(n, 32, dtype=np.int64),
                    output_len=np.array(output, dtype=np.int64),
                    prefix_group=np.full(n, -1, dtype=np.int64),
                    prefix_len=np.zeros(n, dtype=np.int64),
                    queue_class=np.full(n, cls, dtype=np.int64),
                    priority=np.zeros(n, dtype=np.int64), forced_backend=forced_backend)


def _sched(**kw) -> SimSchedulerConfig:
    # a window of one, flushed at once while a backend is idle (idle flush)
    batcher = BatcherConfig(max_batch_size=1, min_latency_ms=50.0, target_throughput=1.0,
                            hysteresis=0.8, idle_flush=True)
    return SimSchedulerConfig(batcher=batcher, slo=SLOTargets.parse("normal=5000", None),
                              admission=True, waiting_by_class=True, slot_model=True,
                              max_num_seqs=8, **kw)


def _run(wl: Workload, **eng) -> EventLoop:
    loop = EventLoop(wl, ConstantCost(STEP, num_blocks=1 << 12), _sched(),
                     EngineConfig(num_samples=1, record_batches=True, **eng))
    loop.res = loop.run()
    return loop


@pytest.mark.parametrize("delay", [0.0, 0.0011])
def test_the_gateway_hears_a_step_delay_later_and_the_client_does_not(delay):
    """One request of 3 tokens at t = 0: its first token at the first step's end (STEP), its
    last at 3 STEP. The gateway hears them (request_log: what it hears, in order) `delay`
    later; its predictor measures the service dispatch -> heard (STEP + delay); the clients'
    first-token and finish times stay at the steps' ends."""
    loop = _run(_workload([0.0], [3]), gateway_read_delay_s=delay)
    res = loop.res
    assert res.first_token_time[0] == pytest.approx(STEP)
    assert res.finish_time[0] == pytest.approx(3 * STEP)
    log = res.extra["request_log"]
    assert [(round(t, 9), b, i, k) for t, b, i, k in log] == [
        (round(STEP + delay, 9), 0, 0, 0), (round(3 * STEP + delay, 9), 0, 0, 1)]
    be = loop.predictor.backends[0]
    assert be.class_service[1] == pytest.approx(STEP + delay)
    # the step from its tokens: (last heard - first heard) / 2, the delay cancels
    assert be.step == pytest.approx(STEP)
    assert loop.placement.loads.load[0] == 0 and loop.backends[0].outstanding == 0


def test_a_read_waits_for_the_window_the_gateway_is_sending():
    """Two backends, 5 ms of the gateway's thread per Batch. Request 0 at t = 0 is sent at
    5 ms (delivered then) and its first token comes at 5 + 20 = 25 ms; heard 1 ms later, at
    26 ms, unless the gateway is sending then: request 1 arrives at 24 ms and is flushed at
    once (backend 1 is idle), so the thread sends until 29 ms, and reads request 0's token
    then. Its predictor notes each dispatch at the send (5 ms after the flush): request 0's
    service, flush -> heard, is 29 ms."""
    m, d = 0.005, 0.001
    loop = _run(_workload([0.0, 0.024], [2, 2]), gateway_read_delay_s=d, gateway_message_s=m,
                num_backends=2)
    res = loop.res
    assert res.first_token_time[0] == pytest.approx(m + STEP)
    first_heard = {i: t for t, b, i, k in res.extra["request_log"] if k == 0}
    assert first_heard[0] == pytest.approx(0.024 + m)       # not m + STEP + d = 26 ms
    assert first_heard[1] == pytest.approx(0.024 + m + STEP + d)
    assert res.extra["backend_of"] == [0, 1]
    assert loop.predictor.backends[0].class_service[1] == pytest.approx(0.024 + m)
    # without the delay: heard at the step's end, whatever the gateway is doing
    loop0 = _run(_workload([0.0, 0.024], [2, 2]), gateway_message_s=m, num_backends=2)
    first0 = {i: t for t, b, i, k in loop0.res.extra["request_log"] if k == 0}
    assert first0[0] == pytest.approx(m + STEP)


def test_the_forced_replay_follows_the_live_placement():
    """Placement's pick is overridden by `Workload.forced_backend` (-1: its own), the
    request's charge moved with it: every load returns to 0 once all have finished."""
    arrival = [0.0, 0.001, 0.002, 0.003, 0.2, 0.201]
    forced = [1, 1, 1, -1, 0, 1]
    loop = _run(_workload(arrival, [3, 5, 2, 4, 2, 3], forced_backend=forced),
                num_backends=2, gateway_read_delay_s=0.001)
    got = loop.res.extra["backend_of"]
    assert [g for g, f in zip(got, forced) if f >= 0] == [f for f in forced if f >= 0]
    assert list(loop.placement.loads.load[:2]) == [0, 0]
    assert [b.outstanding for b in loop.backends] == [0, 0]


def test_read_delay_refuses_stretches_past_finishes():
    with pytest.raises(ValueError):
        _run(_workload([0.0], [3]), gateway_read_delay_s=0.001, max_stretch_finishes=2)
