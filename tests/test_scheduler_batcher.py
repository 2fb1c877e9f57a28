"""DynamicWindowBatcher on a ManualClock: every DESIGN rule, plus property tests over random traffic."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.batcher import FLUSH, IDLE, BatcherConfig, Decision, DynamicWindowBatcher
from scheduler.classes import QueueClass
from scheduler.clock import ManualClock
from scheduler.queues import ClassQueues, PendingRequest, QueueConfig

F, N, S = QueueClass.FAST, QueueClass.NORMAL, QueueClass.SLOW
# The rules' arithmetic is tested at the design card's target (8,000 req/s), where a window of
# one is due 0.16 ms after it opens; the default (250, chosen by `tidegate sim window`) has its
# own test below.
RULES = BatcherConfig(target_throughput=8000.0)
RATE = 8000.0 * 0.8  # target_throughput * hysteresis of RULES


def make(config: BatcherConfig | None = None, queue_config: QueueConfig | None = None, start=0.0):
    clock = ManualClock(start)
    return DynamicWindowBatcher(config or RULES, clock, ClassQueues(queue_config)), clock


def req(rid, t, cls=F, deadline=None, tokens=4):
    return PendingRequest(rid, tokens, 8, t, cls, deadline=deadline)


@dataclass
class Trace:
    batches: list = field(default_factory=list)  # (flush time, window_start, [requests])
    expired: list = field(default_factory=list)
    rejected: list = field(default_factory=list)
    cancelled: list = field(default_factory=list)


def drive(batcher: DynamicWindowBatcher, clock: ManualClock, events) -> Trace:
    """A tiny event loop: events are (time, kind, arg) in time order; the batcher's single
    deadline is honoured between them, and every flush-now is served at once."""
    trace = Trace()

    def settle(dec: Decision):
        for _ in range(10_000):
            if not dec.flush_now:
                break
            window_start = batcher.window_start
            batch = batcher.take_batch()
            assert batch, "flush-now with nothing to take"
            trace.batches.append((clock.now(), window_start, batch))
            dec = batcher.poll()
        else:
            raise AssertionError("flush loop does not end")
        trace.expired += batcher.take_expired()
        return dec.deadline

    def fire_until(t):
        nonlocal deadline
        for _ in range(100_000):
            if deadline is None or deadline > t:
                return
            clock.set(max(deadline, clock.now()))
            deadline = settle(batcher.poll())
        raise AssertionError("timer loop does not end")

    deadline = None
    for t, kind, arg in events:
        fire_until(t)
        clock.set(max(t, clock.now()))
        if kind == "arrive":
            dec = batcher.push(arg)
            if dec.rejected is not None:
                trace.rejected.append(arg)
        elif kind == "cancel":
            got = batcher.cancel(arg)
            if got is not None:
                trace.cancelled.append(got)
            dec = batcher.poll()
        else:  # "idle"
            dec = batcher.notify_idle(arg)
        deadline = settle(dec)
    fire_until(float("inf"))
    assert batcher.queues.size == 0 and deadline is None
    return trace


def arrivals(n, rate, cls=F, start=0.0):
    return [(start + i / rate, "arrive", req(f"r{i}", start + i / rate, cls)) for i in range(n)]


def batch_sizes(trace):
    return [len(b) for _, _, b in trace.batches]


# -- config ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [
    {"max_batch_size": 0}, {"max_batch_size": 129}, {"max_batch_size": 2.0}, {"max_batch_size": True},
    {"min_latency_ms": -1.0}, {"min_latency_ms": float("nan")}, {"target_throughput": 0.0},
    {"target_throughput": float("inf")}, {"hysteresis": 0.0},
])
def test_config_validation(kwargs):
    with pytest.raises(ValueError):
        BatcherConfig(**kwargs)


def test_config_bounds_accepted():
    assert BatcherConfig(max_batch_size=1).max_batch_size == 1
    assert BatcherConfig(max_batch_size=128, target_throughput=8000.0).flush_rate == RATE
    assert BatcherConfig().min_latency_s == 0.005


def test_default_window_holds_what_arrives_in_5_ms():
    """The default (docs/window_defaults.md): 250 req/s x 0.8 = 200/s, so any window waits its
    5 ms unless a backend is idle; at 1,000 arrivals/s that is 5 requests a window, where the
    design card's 8,000 sent each alone."""
    cfg = BatcherConfig()
    assert (cfg.target_throughput, cfg.min_latency_ms, cfg.hysteresis) == (250.0, 5.0, 0.8)
    sizes = {}
    for name, config in (("default", cfg), ("card", RULES)):
        b, clock = make(config)
        events = [(i * 0.001, "arrive", req(f"r{i}", i * 0.001)) for i in range(200)]
        trace = drive(b, clock, events)
        sizes[name] = [len(r) for _, _, r in trace.batches]
    assert max(sizes["card"]) == 1
    assert sum(sizes["default"]) == 200 and sum(sizes["default"]) / len(sizes["default"]) >= 4.5


# -- the three rules ---------------------------------------------------------------------------
def test_lone_request_flushes_at_one_over_rate():
    b, clock = make(start=10.0)
    dec = b.push(req("a", 10.0))
    assert dec == Decision(False, 10.0 + 1 / RATE, None)
    assert dec.deadline - 10.0 == pytest.approx(0.15625e-3)
    assert b.window_start == 10.0
    clock.set(dec.deadline - 1e-9)
    assert not b.poll().flush_now
    clock.set(dec.deadline)  # inclusive boundary: the timer it was given flushes
    assert b.poll() is FLUSH
    assert [r.request_id for r in b.take_batch()] == ["a"]
    assert b.poll() is IDLE and b.window_start is None


def test_deadline_grows_with_size_up_to_min_latency():
    b, _ = make()
    for i in range(40):
        dec = b.push(req(f"r{i}", 0.0))
        assert dec.deadline == min(0.005, (i + 1) / RATE)  # 32 requests reach the 5 ms cap


def test_size_cap_flushes_at_once():
    b, _ = make(BatcherConfig(target_throughput=8000.0, max_batch_size=4))
    assert [b.push(req(f"r{i}", 0.0)).flush_now for i in range(4)] == [False, False, False, True]
    assert len(b.take_batch()) == 4


def test_thousand_at_40k_per_s_leave_in_batches_of_128():
    b, clock = make()
    trace = drive(b, clock, arrivals(1000, 40_000.0))
    assert batch_sizes(trace) == [128] * 7 + [1000 - 7 * 128]
    assert b.stats.num_batches == 8 and b.stats.mean_batch_size == 125.0


def test_thousand_at_20k_per_s():
    # 20k req/s x 5 ms = 100 arrivals per window, so with the defaults min_latency flushes first
    # (~100 per batch); with a 10 ms window the 128 cap is reached first.
    b, clock = make()
    trace = drive(b, clock, arrivals(1000, 20_000.0))
    assert all(100 <= n <= 101 for n in batch_sizes(trace)[:-1])
    assert all(t - ws <= 0.005 + 1e-12 for t, ws, _ in trace.batches)
    b, clock = make(BatcherConfig(target_throughput=8000.0, min_latency_ms=10.0))
    trace = drive(b, clock, arrivals(1000, 20_000.0))
    assert batch_sizes(trace) == [128] * 7 + [104]


def test_at_2k_per_s_nothing_waits_past_5ms():
    b, clock = make()
    trace = drive(b, clock, arrivals(1000, 2_000.0))
    waits = [t - r.arrival_time for t, _, batch in trace.batches for r in batch]
    assert len(waits) == 1000 and max(waits) <= 0.005
    # arrivals 0.5 ms apart are slower than target*hysteresis: each leaves alone after 1/rate
    assert batch_sizes(trace) == [1] * 1000
    assert max(waits) == pytest.approx(1 / RATE)


def test_service_order_in_a_batch_and_next_window_at_oldest_remaining():
    b, clock = make(BatcherConfig(target_throughput=8000.0, max_batch_size=3))
    b.push(req("s", 0.0, S))
    clock.set(0.00001)
    b.push(req("n", 0.00001, N))
    clock.set(0.00002)
    b.push(req("f1", 0.00002, F))
    dec = b.push(req("f2", 0.00002, F))
    assert dec.flush_now
    assert [r.request_id for r in b.take_batch()] == ["f1", "f2", "n"]
    assert b.window_start == 0.0  # "s" is left and arrived at 0.0
    dec = b.poll()
    assert dec.deadline == 0.0 + 1 / RATE


def test_aging_in_batches():
    b, clock = make(BatcherConfig(target_throughput=8000.0, max_batch_size=2), QueueConfig(max_wait_s=(0.05, 0.2, 1.0)))
    b.push(req("s", 0.0, S))
    clock.set(2.0)
    b.push(req("f1", 2.0, F))
    b.push(req("f2", 2.0, F))
    assert [r.request_id for r in b.take_batch()] == ["s", "f1"]


# -- idle flush --------------------------------------------------------------------------------
def test_idle_flush():
    b, _ = make()
    assert b.push(req("a", 0.0)).deadline is not None
    assert b.notify_idle(True) is FLUSH
    assert len(b.take_batch()) == 1
    # the spare capacity was used by that batch: the next request waits for its window
    assert not b.push(req("b", 0.0)).flush_now
    b.take_batch()
    assert b.notify_idle(True) is IDLE  # nothing waiting; remembered for the next arrival
    assert b.push(req("c", 0.0)) is FLUSH
    b.take_batch()
    b.notify_idle(True)
    assert b.notify_idle(False) is IDLE
    assert not b.push(req("d", 0.0)).flush_now


def test_idle_flush_off():
    b, _ = make(BatcherConfig(target_throughput=8000.0, idle_flush=False))
    b.push(req("a", 0.0))
    assert not b.notify_idle(True).flush_now
    assert not b.push(req("b", 0.0)).flush_now


# -- cancel, expiry, rejection -----------------------------------------------------------------
def test_cancel():
    b, _ = make()
    b.push(req("a", 0.0))
    b.push(req("b", 0.0))
    assert b.poll().deadline == 2 / RATE
    assert b.cancel("a").request_id == "a" and b.cancel("a") is None
    assert b.poll().deadline == 1 / RATE  # one request: the window is due sooner
    b.cancel("b")
    assert b.window_start is None and b.poll() is IDLE
    assert b.stats.num_cancelled == 2 and b.take_batch() == []


def test_expiry_is_reported_through_the_same_timer():
    b, clock = make(BatcherConfig(max_batch_size=128, min_latency_ms=5.0, target_throughput=1.0))
    dec = b.push(req("a", 0.0, deadline=0.001))
    assert dec.deadline == 0.001  # earlier than the 5 ms window
    b.push(req("b", 0.0))
    clock.set(0.001)
    dec = b.poll()
    assert dec == Decision(False, 0.005, None)
    assert [r.request_id for r in b.take_expired()] == ["a"]
    clock.set(0.005)
    assert b.poll().flush_now
    assert [r.request_id for r in b.take_batch()] == ["b"]
    assert b.stats.num_expired == 1


def test_expired_request_never_in_a_batch():
    b, clock = make()
    b.push(req("a", 0.0, deadline=0.0001))
    b.push(req("b", 0.0))
    clock.set(0.0002)
    assert [r.request_id for r in b.take_batch()] == ["b"]
    assert [r.request_id for r in b.take_expired()] == ["a"]


def test_dead_on_arrival_and_expired_window_owner():
    b, clock = make()
    assert b.push(req("doa", 0.0, deadline=0.0)) is IDLE  # deadline already reached: no window
    assert [r.request_id for r in b.take_expired()] == ["doa"]
    b.push(req("a", 0.0, deadline=0.001))
    clock.set(0.002)  # the caller's timer was late: "a" expired before "b" arrived
    dec = b.push(req("b", 0.002))
    assert b.window_start == 0.002 and dec.deadline == 0.002 + 1 / RATE
    assert [r.request_id for r in b.take_expired()] == ["a"]


def test_rejection_keeps_the_window():
    b, _ = make(queue_config=QueueConfig(max_requests=(1, 1, 1)))
    first = b.push(req("a", 0.0))
    dec = b.push(req("b", 0.0))
    assert dec.rejected == (False, "queue_full", F)
    assert dec.deadline == first.deadline and not dec.flush_now
    assert b.stats.num_rejected == 1


# -- property tests ----------------------------------------------------------------------------
event = st.tuples(
    st.floats(0.0, 0.002),  # gap to the previous event, seconds
    st.sampled_from(["arrive"] * 8 + ["cancel", "idle"]),
    st.sampled_from(list(QueueClass)),
    st.one_of(st.none(), st.floats(0.0, 0.01)),  # deadline offset
    st.integers(0, 10_000),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(event, max_size=300), st.integers(1, 128), st.floats(0.1, 10.0),
       st.sampled_from([1e3, 8e3, 1e5]), st.booleans(), st.sampled_from(["fifo", "priority"]))
def test_random_traffic(raw, max_batch, min_latency_ms, target, idle_flush, policy):
    cfg = BatcherConfig(max_batch_size=max_batch, min_latency_ms=min_latency_ms,
                        target_throughput=target, idle_flush=idle_flush)
    b, clock = make(cfg, QueueConfig(max_requests=(40, 40, 40), policy=policy))
    events, pushed, t = [], [], 0.0
    for gap, kind, cls, dl, k in raw:
        t += gap
        if kind == "arrive":
            r = PendingRequest(f"r{len(pushed)}", 1, 8, t, cls, priority=k % 3,
                               deadline=None if dl is None else t + dl)
            pushed.append(r)
            events.append((t, kind, r))
        elif kind == "cancel":
            events.append((t, kind, f"r{k % max(1, len(pushed))}"))
        else:
            events.append((t, kind, bool(k % 2)))
    trace = drive(b, clock, events)

    # nothing lost, nothing duplicated
    served = [r for _, _, batch in trace.batches for r in batch]
    outcomes = served + trace.expired + trace.rejected + trace.cancelled
    assert len(outcomes) == len(pushed)
    assert {id(r) for r in outcomes} == {id(r) for r in pushed}
    # no batch above the cap; expired requests were past their deadline and never served
    assert all(1 <= len(batch) <= max_batch for _, _, batch in trace.batches)
    assert all(r.deadline is not None and r.deadline <= clock.now() for r in trace.expired)
    assert all(r.deadline is None or t_out < r.deadline for t_out, _, batch in trace.batches for r in batch)
    # latency: a batch leaves at most min_latency after its window opened; a request that waited
    # longer than min_latency was passed over only by full batches
    ml = cfg.min_latency_s
    for i, (t_out, ws, batch) in enumerate(trace.batches):
        assert t_out - ws <= ml + 1e-12
        for r in batch:
            assert r.arrival_time >= ws
            if t_out - r.arrival_time > ml + 1e-12:
                ahead = [bb for tt, _, bb in trace.batches[:i] if tt >= r.arrival_time]
                assert ahead and all(len(bb) == max_batch for bb in ahead)
    # FIFO within a class (fifo policy)
    if policy == "fifo":
        for cls in QueueClass:
            seqs = [r.seq for r in served if r.queue_class == cls]
            assert seqs == sorted(seqs)
    st_ = b.stats
    assert st_.num_requests == len(served) and st_.num_batches == len(trace.batches)
    assert st_.num_expired == len(trace.expired) and st_.num_rejected == len(trace.rejected)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.0, 0.0005), min_size=1, max_size=600), st.integers(1, 128))
def test_bursts_same_timestamp(gaps, max_batch):
    """Many arrivals at the same instant: only full batches may pass a request over."""
    b, clock = make(BatcherConfig(target_throughput=8000.0, max_batch_size=max_batch))
    t, events = 0.0, []
    for i, g in enumerate(gaps):
        t += g if i % 7 else 0.0
        events.append((t, "arrive", req(f"r{i}", t)))
    trace = drive(b, clock, events)
    served = [r for _, _, batch in trace.batches for r in batch]
    assert [r.request_id for r in served] == [f"r{i}" for i in range(len(gaps))]
    assert all(t_out - r.arrival_time <= 0.005 + 1e-12 for t_out, _, bb in trace.batches for r in bb)
