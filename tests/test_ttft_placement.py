"""Placement by predicted TTFT (scheduler.ttft_placement, scheduler.service_fit): closed forms on
hand-made predictor states, and the gateway's own code (Dispatcher + BackendPool) making the same
placement decisions as the simulator on the same trace and the same start/finish events."""
from __future__ import annotations

import random

import numpy as np
import pytest

from proto import tidegate_pb2 as pb
from scheduler.admission import AdmissionConfig, WaitPredictor
from scheduler.placement import DEPTHS, PlacementConfig, PlacementItem
from scheduler.placements import create_placement
from scheduler.service_fit import ServiceFit
from scheduler.ttft_placement import TTFTPlacement

FAST, NORMAL, SLOW = 0, 1, 2
BS = 16


def _policy(n: int, min_samples: int = 2, **cfg) -> tuple[TTFTPlacement, WaitPredictor]:
    p = create_placement(PlacementConfig(policy="ttft", block_size=BS, **cfg))
    assert isinstance(p, TTFTPlacement)
    pred = WaitPredictor(AdmissionConfig(min_samples=min_samples))
    p.predictor = pred
    for b in range(n):
        p.add_backend(b)
        pred.add_backend(b)
    return p, pred


def _measure(pred: WaitPredictor, b: int, gap: float, service: float, n: int = 6,
             cls: int = FAST, uncached: int = 32) -> None:
    """n requests to an empty backend started one every `gap`, the first after `service`."""
    ahead = [pred.dispatched(b, cls) for _ in range(n)]
    t0 = 100.0 * (b + 1)
    for k in range(n):
        t = t0 + service + k * gap
        # each one's own service (beyond its queue of k x gap) is `service`
        pred.started(b, cls, t, t - t0, ahead[k], uncached, 0)


# ---- the service fit -------------------------------------------------------------------------
def test_service_fit_recovers_both_slopes_and_only_those_that_varied():
    rng = random.Random(0)
    f = ServiceFit(0.05)
    for _ in range(400):
        u, d = rng.randint(0, 2000), rng.randint(0, 40)
        f.add(u, d, 0.02 + 3e-4 * u + 2e-3 * d)
    assert f.k_u == pytest.approx(3e-4, rel=1e-6) and f.k_d == pytest.approx(2e-3, rel=1e-6)
    # every prompt the same length: nothing says what a token costs
    g = ServiceFit(0.05)
    for _ in range(100):
        d = rng.randint(0, 40)
        g.add(512, d, 0.02 + 2e-3 * d)
    assert g.k_u == 0.0 and g.k_d == pytest.approx(2e-3, rel=1e-6)
    # a slope never goes negative
    h = ServiceFit(0.05)
    for _ in range(100):
        u = rng.randint(0, 2000)
        h.add(u, 0, 1.0 - 1e-4 * u)
    assert h.k_u == 0.0 and h.k_d == 0.0


def test_prediction_with_the_fit_is_class_mean_plus_slopes_times_the_difference():
    pred = WaitPredictor(AdmissionConfig(min_samples=2))
    pred.add_backend(0)
    rng = random.Random(1)
    for _ in range(50):  # alone each time: service = 5 ms + 0.1 ms per uncached token
        u = rng.randint(0, 1000)
        a = pred.dispatched(0, FAST)
        pred.started(0, FAST, 1.0, 0.005 + 1e-4 * u, a, u, 0)
    last_u = pred.backends[0].class_u[FAST]
    assert pred.backends[0].fit.k_u == pytest.approx(1e-4, rel=1e-3)
    assert pred.backend_ttft(0, FAST, 300) == pytest.approx(
        pred.backends[0].class_service[FAST] + 1e-4 * (300 - last_u), rel=1e-6)
    assert pred.backend_ttft(0, FAST, 300) == pytest.approx(0.005 + 0.03, rel=1e-3)
    assert pred.backend_ttft(0, FAST) == pred.backends[0].class_service[FAST]  # no length: mean


# ---- decisions -------------------------------------------------------------------------------
def test_fast_request_goes_where_fewer_fast_requests_wait_not_where_fewer_tokens_are():
    p, pred = _policy(2)
    _measure(pred, 0, gap=0.05, service=0.05)
    _measure(pred, 1, gap=0.05, service=0.05)
    # backend 0: three short fast requests unstarted (few tokens); backend 1: one long slow one
    for _ in range(3):
        p.charge(0, 40)
        pred.dispatched(0, FAST)
    p.charge(1, 4000)
    pred.dispatched(1, SLOW)
    assert p.loads.least() == 0  # least-tokens and prefix would pick backend 0
    it = PlacementItem(40, (), None, None, FAST, 32)
    p.place([it], 0.0)
    assert it.backend == 1 and p.num_predicted == 1
    # a slow request sees every queue: 3 x 50 ms on 0, 1 x 50 ms on 1: backend 1 again
    it = PlacementItem(200, (), None, None, SLOW, 32)
    p.place([it], 0.0)
    assert it.backend == 1


def test_a_slower_backend_gets_less_work():
    p, pred = _policy(2)
    _measure(pred, 0, gap=0.2, service=0.2)   # 5 starts/s
    _measure(pred, 1, gap=0.02, service=0.02)  # 50 starts/s
    placed = []
    for _ in range(11):
        it = PlacementItem(40, (), None, None, NORMAL, 32)
        p.place([it], 0.0)
        pred.dispatched(it.backend, NORMAL)
        placed.append(it.backend)
    # backend 0's first request starts after 0.2 s; backend 1's k-th after k x 20 ms + 20 ms:
    # the first 10 go to backend 1 (its tenth: 9 x 20 + 20 = 200 ms, a tie -> fewer tokens)
    assert placed[:9] == [1] * 9 and placed.count(0) == 1


def test_held_prefix_wins_when_its_saved_prefill_outweighs_the_queue():
    p, pred = _policy(2, min_samples=2)
    rng = random.Random(2)
    for b in (0, 1):  # both: 10 ms + 1 ms per uncached token, paced at 50 ms
        pred.backends[b].gap, pred.backends[b].num_gaps = 0.05, 2
        for _ in range(40):
            u = rng.randint(0, 512)
            a = pred.dispatched(b, NORMAL)
            pred.gone(b, NORMAL)
            pred.started(b, NORMAL, 1.0, 0.010 + 1e-3 * u, 0, u, 0)
            del a
    prompt = list(range(600))
    from scheduler.prefix_index import prefix_hashes
    prefix = prefix_hashes(prompt, BS)
    p.index.report(0, prefix, 0.0)  # backend 0 holds all 32 sampled blocks (512 tokens)
    held = DEPTHS[len(prefix) - 1] * BS
    assert held == 512
    pred.dispatched(0, NORMAL)  # one ahead on the holder: +50 ms, saves 512 ms of prefill
    it = PlacementItem(600 + 16, prefix, None, None, NORMAL, 600)
    p.place([it], 1.0)
    assert it.backend == 0 and it.charged == 616 - 512
    for _ in range(12):  # 13 ahead: 650 ms of queue > 512 ms saved
        pred.dispatched(0, NORMAL)
    it = PlacementItem(600 + 16, prefix, None, None, NORMAL, 600)
    p.place([it], 1.0)
    assert it.backend == 1 and it.charged == 616


def test_a_window_counts_its_own_earlier_requests_as_queued():
    p, pred = _policy(2)
    _measure(pred, 0, gap=0.05, service=0.05)
    _measure(pred, 1, gap=0.05, service=0.05)
    items = [PlacementItem(40, (), k, None, FAST, 32) for k in range(6)]
    p.place(items, 0.0)
    assert sorted(it.backend for it in items) == [0, 0, 0, 1, 1, 1]
    assert p._window is None  # nothing left over for the next window


def test_unmeasured_backend_leaves_the_decision_to_the_prefix_rule():
    p, pred = _policy(3)
    ref = create_placement(PlacementConfig(policy="window", block_size=BS))
    for b in range(3):
        ref.add_backend(b)
    _measure(pred, 0, gap=0.05, service=0.05)  # backends 1 and 2 never started anything
    rng = random.Random(3)
    for _ in range(30):
        prompt = [rng.randint(0, 5) for _ in range(rng.randint(20, 90))]
        from scheduler.prefix_index import prefix_hashes
        pre = prefix_hashes(prompt, BS)
        a, b = (PlacementItem(len(prompt) + 8, pre, None, None, NORMAL, len(prompt))
                for _ in range(2))
        p.place([a], 0.0)
        ref.place([b], 0.0)
        assert (a.backend, a.charged) == (b.backend, b.charged)
    assert p.num_predicted == 0


def test_config_rejects_a_negative_tolerance():
    with pytest.raises(ValueError):
        PlacementConfig(policy="ttft", ttft_tolerance=-0.1)


# ---- the gateway's code and the simulator, the same decisions ---------------------------------
class _Conn:
    """A backend connection the pool can place on and send to (nothing leaves the process)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.healthy, self.draining, self.info, self.sock = True, False, None, None
        self.inflight: dict = {}

    @property
    def num_inflight(self) -> int:
        return len(self.inflight)

    def send(self, envelope, arrays) -> bool:
        return True


class _Handle:
    def __init__(self, request_id: str, t: float, prompt_len: int, max_tokens: int) -> None:
        self.request_id, self.arrival_time = request_id, t
        self.prompt_ids = [1] * prompt_len
        self.max_tokens, self.priority, self.queue_deadline = max_tokens, 0, None
        self.queue_class, self.dispatched_at, self.error = -1, None, None
        self.slo_ttft_ms, self.unstarted, self.backend = None, None, ""
        self.started_on = None

    def wire_sampling(self):
        from proto import tidegate_pb2 as pb
        return pb.SamplingParams(max_tokens=self.max_tokens)

    def on_dispatched(self, now, backend) -> None:
        self.dispatched_at, self.backend = now, backend

    def on_error(self, err) -> None:
        self.error = err


@pytest.mark.parametrize("slot_model", [False, True])
def test_gateway_places_as_the_simulator_does_on_the_same_trace_and_events(slot_model):
    """The simulator runs the trace on 3 backends (a measured CPU profile: irregular step times)
    and records each request's backend, its windows and, in order, every first token and finish
    the gateway would hear. The gateway's Dispatcher and BackendPool (the real classes, with
    connections that send nowhere) are then fed the same arrivals and those events at the same
    virtual times: every request must land on the backend the simulator chose."""
    from gateway.backend_pool import BackendPool, PoolConfig
    from gateway.dispatcher import Dispatcher
    from scheduler.batcher import BatcherConfig
    from scheduler.clock import ManualClock
    from scheduler.queues import QueueConfig
    from sims.adapters import SimSchedulerConfig
    from sims.event_loop import EngineConfig, simulate
    from sims.profile_cost import ProfileCost
    from sims.workload import Workload

    rng = np.random.default_rng(4)
    n = 400
    arrival = 50.0 + np.cumsum(rng.exponential(1 / 90.0, n))
    prompt = rng.integers(16, 400, n)
    output = rng.choice([4, 8, 30, 64, 120], n)
    wl = Workload(arrival_time=arrival, prompt_len=prompt, output_len=output,
                  prefix_group=np.full(n, -1), prefix_len=np.zeros(n, dtype=np.int64),
                  queue_class=np.full(n, -1), priority=np.zeros(n, dtype=np.int64))
    batcher = BatcherConfig(max_batch_size=8, min_latency_ms=5.0, target_throughput=2000.0,
                            hysteresis=0.8, idle_flush=False)
    placement = PlacementConfig(policy="ttft")
    cost = ProfileCost.from_json("docs/window_defaults/cpu_tiny_coder_profile.json")
    res = simulate(wl, cost, SimSchedulerConfig(batcher=batcher, enable_prefix_caching=False,
                                                slot_model=slot_model),
                   EngineConfig(num_backends=3, num_samples=1, record_batches=True,
                                placement=placement))
    sim_backend = res.extra["backend_of"]
    events = res.extra["request_log"]
    assert res.extra["placement"]["num_predicted"] > n // 2  # decided by prediction, mostly
    assert res.extra["placement"]["num_near_ties"] < res.extra["placement"]["num_predicted"]

    pool = BackendPool([], PoolConfig(placement=placement))
    conns = [_Conn(f"b{k}") for k in range(3)]
    for c in conns:
        pool._register(c)
        pool.placement.set_accepting(c.pid, True)

    class _Metrics:
        def observe_batch(self, *a) -> None: ...
        def observe_request(self, *a) -> None: ...

    class _Virtual(Dispatcher):
        def _arm(self, deadline):
            self._timer_deadline = deadline

    clock = ManualClock(0.0)
    d = _Virtual(pool, _Metrics(), batcher, QueueConfig(), clock,
                 admission_config=AdmissionConfig(slot_model=slot_model))
    for c in conns:  # each introduces itself with its max_num_seqs, as the simulator's backends
        d.on_backend_info(c.pid, pb.BackendInfo(max_num_seqs=SimSchedulerConfig().max_num_seqs))
    handles = [_Handle(str(i), float(arrival[i]), int(prompt[i]), int(output[i])) for i in range(n)]
    by_address = {c.address: c for c in conns}

    def fire_timers(until: float, inclusive: bool) -> None:
        while d._timer_deadline is not None and (d._timer_deadline < until or
                                                 (inclusive and d._timer_deadline <= until)):
            clock.set(max(clock.now(), d._timer_deadline))
            d._on_timer()

    e, i = 0, 0
    while i < n or e < len(events):
        t_ev = events[e][0] if e < len(events) else float("inf")
        t_arr = arrival[i] if i < n else float("inf")
        if t_ev <= t_arr:  # the simulator's heap events at t run before an arrival at t
            fire_timers(t_ev, False)
            t, _, r, kind = events[e]
            e += 1
            clock.set(t)
            h = handles[r]
            conn = by_address[h.backend]
            if kind == 0:
                d.on_first_token(h, t)
            else:  # its last token (RequestHandle.on_tokens: on_finished), then the pool's
                d.on_finished(h, t, int(output[r]))
                pool._owner.pop(h.request_id, None)
                pool._forget(conn, h.request_id)
        else:
            fire_timers(t_arr, True)
            clock.set(t_arr)
            d.submit(handles[i])
            i += 1
    fire_timers(float("inf"), True)
    if slot_model:  # the slot model decided: measured its step and the backends' concurrency
        assert all(be.step > 0 and be.slots > 0 for be in d.predictor.backends.values())
    live_backend = [int(h.backend[1:]) for h in handles]
    assert all(h.error is None for h in handles)
    assert live_backend == sim_backend
    assert len(set(live_backend)) == 3
