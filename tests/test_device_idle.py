"""Device idle per step from CUDA timing events (issue 32), with stand-in events on the CPU:
the runner's bookkeeping of which events belong to which step, the step log's field, and the
serving suite's summary of it."""
import json

import torch

from backend.runner.step import TIMING_RING, StaticBuffers
from backend.server.step_log import StepLog
from bench.serving.suite import device_idle_summary
from scheduler.step_plan import StepPlan


class FakeEvent:
    """A CUDA event on a hand-set device clock (ms)."""
    now = 0.0

    def __init__(self) -> None:
        self.t = None

    def record(self) -> None:
        self.t = FakeEvent.now

    def elapsed_time(self, end: "FakeEvent") -> float:
        assert self.t is not None and end.t is not None
        return end.t - self.t

    def synchronize(self) -> None:
        pass


def _buffers() -> StaticBuffers:
    b = StaticBuffers(8, 4, 4, torch.device("cpu"))
    b.step_started = [FakeEvent() for _ in range(TIMING_RING)]
    b.sampled_ready = [FakeEvent() for _ in range(TIMING_RING)]
    return b


def _launch(b: StaticBuffers, start: float, end: float) -> int:
    FakeEvent.now = start
    b.mark_step_start()
    FakeEvent.now = end
    return b.queue_readback(2)


def test_idle_is_the_gap_between_one_steps_readback_and_the_next_start():
    b = _buffers()
    s0 = _launch(b, 0.0, 5.0)
    b.read_sampled(s0, 2)
    assert b.device_seconds(s0) == 0.005 and b.device_idle_seconds(s0) is None  # no step before
    s1 = _launch(b, 7.0, 12.0)
    s2 = _launch(b, 12.0, 16.0)  # async: launched before step 1 is read back, same slot as s0
    assert s2 == s0
    b.read_sampled(s1, 2)
    assert b.device_seconds(s1) == 0.005 and b.device_idle_seconds(s1) == 0.002
    b.read_sampled(s2, 2)
    assert b.device_seconds(s2) == 0.004 and b.device_idle_seconds(s2) == 0.0


def test_idle_is_unknown_after_an_untimed_step_or_one_that_read_nothing_back():
    b = _buffers()
    _launch(b, 0.0, 5.0)
    b.mark_untimed_launch()  # a step sampled on the host: its device time is not idle
    s = _launch(b, 30.0, 35.0)
    assert b.device_idle_seconds(s) is None and b.device_seconds(s) == 0.005
    FakeEvent.now = 40.0
    b.mark_step_start()  # a greedy step whose chunks sampled nothing: no read-back
    s = _launch(b, 45.0, 50.0)
    assert b.device_idle_seconds(s) is None and b.device_seconds(s) == 0.005
    s = _launch(b, 51.0, 52.0)
    assert b.device_idle_seconds(s) == 0.001


def test_cpu_buffers_report_no_device_times():
    b = StaticBuffers(8, 4, 4, torch.device("cpu"))
    b.mark_step_start()
    slot = b.queue_readback(1)
    assert b.read_sampled(slot, 1) == [0]
    assert b.device_seconds(slot) is None and b.device_idle_seconds(slot) is None


def test_step_log_writes_device_idle_and_the_suite_sums_it(tmp_path):
    log = StepLog(tmp_path / "steps.jsonl")
    plan = StepPlan(chunks=[])
    log.record(1.0, 0.010, plan, device_s=0.009, device_idle_s=0.0005)
    log.record(1.1, 0.010, plan, device_s=0.009)
    log.write()
    rows = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert rows[0]["device_idle_ms"] == 0.5 and "device_idle_ms" not in rows[1]
    steps = [{"prefill_tokens": 0, "decodes": 64, "device_ms": 4.0, "device_idle_ms": 0.2},
             {"prefill_tokens": 0, "decodes": 60, "device_ms": 4.0, "device_idle_ms": 0.6},
             {"prefill_tokens": 512, "decodes": 3, "device_ms": 8.0, "device_idle_ms": 0.0},
             {"prefill_tokens": 0, "decodes": 8, "device_ms": 2.0}]
    s = device_idle_summary(steps)
    assert s["num_device_idle_steps"] == 3 and s["device_idle_ms_sum"] == 0.8
    assert s["device_idle_fraction"] == 0.8 / 16.0
    assert s["num_b64_steps"] == 2 and s["b64_device_idle_fraction"] == 0.1
