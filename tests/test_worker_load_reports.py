"""The worker's LoadReport promise (DESIGN; backend/server/worker.py): at most ~100 ms apart
while busy, the busy -> idle edge at once, about 1 s apart while idle — on an engine whose steps
take a fixed 5 ms (`--model echo --echo-step-ms 5`), so the busy stretch is as long on a fast
machine as on a slow one.

Issue 27 item 6: `test_protocol_behaviour` saw a 1.0 s gap "while busy" on a fast machine. Its
request (900 tokens of the tiny model) finished inside the 1.5 s window there, and the gap was
the idle cadence after the finish (reproduced here by a shorter request: the last two reports
said num_running 0, 1.015 s apart), not a wait in the busy loop. These tests pin the three
cadences on their own, each report checked against what the worker was doing when it sent it.
"""
from __future__ import annotations

import time

import numpy as np
import pytest
from backend_helpers import DealerClient, WorkerProcess

from proto import codec

STEP_S = 0.005
BUSY_GAP_S = 0.1 + 3 * STEP_S + 0.1  # the promise, plus a step or three and scheduling slack


@pytest.fixture
def echo_worker(tmp_path):
    w = WorkerProcess(["--model", "echo", "--echo-step-ms", str(STEP_S * 1000),
                       "--max-model-len", "1024", "--num-blocks", "512"],
                      f"ipc://{tmp_path}/w.sock")
    yield w
    w.kill()


def _read(c: DealerClient, until: float, stop_on_finish: str | None = None):
    """(receipt time, kind, num_running or finish) until `until`, or the finish of a request."""
    events = []
    while time.monotonic() < until:
        m = c.recv(timeout_s=max(0.01, until - time.monotonic() + 1.5))
        now = time.monotonic()
        if m.kind == "load_report":
            events.append((now, "report", m.envelope.load_report.num_running))
        elif m.kind == "step_output":
            for o in m.envelope.step_output.outputs:
                if o.finish_reason:
                    events.append((now, "finish", o.request_id))
                    if o.request_id == stop_on_finish:
                        return events
    return events


def _after_idle_report(c: DealerClient) -> float:
    """Wait for an idle LoadReport: the worker then sleeps in its poll for up to a second."""
    while True:
        m = c.recv(timeout_s=3)
        if m.kind == "load_report" and m.envelope.load_report.num_running == 0:
            return time.monotonic()


def test_reports_every_100ms_while_busy_and_at_once_on_both_edges(echo_worker):
    c = DealerClient(echo_worker.endpoint)
    c.hello()
    for phase_s in (0.0, 0.3, 0.7):  # a Batch arrives at various points of the idle second
        seen = _after_idle_report(c)
        time.sleep(max(0.0, seen + phase_s - time.monotonic()))
        rid = f"r{phase_s}"
        sent = time.monotonic()
        c.batch({rid: [256, 1, 2]}, max_tokens=200, ignore_eos=True)  # >= 1 s of 5 ms steps
        events = _read(c, sent + 10, stop_on_finish=rid)
        assert events[-1][1:] == ("finish", rid), events[-3:]
        finished = events[-1][0]
        assert finished - sent >= 200 * STEP_S
        busy = [t for t, kind, running in events if kind == "report" and running == 1]
        # idle -> busy: the Batch wakes the worker's poll; a report follows within the promise
        assert busy and busy[0] - sent < BUSY_GAP_S, (phase_s, busy[:1], sent)
        # busy: no gap between reports (nor before the finish) past the promise
        gaps = np.diff([sent, *busy, finished])
        assert len(busy) >= 8 and gaps.max() < BUSY_GAP_S, (phase_s, gaps.max())
        # busy -> idle: the edge is reported at once, not at the next idle tick
        after = _read(c, finished + 0.3)
        idle = [t for t, kind, running in after if kind == "report" and running == 0]
        assert idle and idle[0] - finished < 0.1, (phase_s, idle[:1], finished)


def test_idle_reports_about_one_second_apart(echo_worker):
    c = DealerClient(echo_worker.endpoint)
    c.hello()
    start = _after_idle_report(c)
    events = _read(c, start + 3.2)
    times = [start] + [t for t, kind, running in events if kind == "report" and running == 0]
    gaps = np.diff(times)
    assert 3 <= len(gaps) <= 4 and all(0.9 < g < 1.3 for g in gaps), gaps


def test_health_ping_answered_at_once_while_idle(echo_worker):
    """A message to an idle worker wakes its one-second poll (no missed wake-up)."""
    c = DealerClient(echo_worker.endpoint)
    c.hello()
    _after_idle_report(c)
    for nonce in (1, 2, 3):
        time.sleep(0.25)
        sent = time.monotonic()
        c.send(codec.make_health(nonce, time.time()))
        while True:
            m = c.recv(timeout_s=3)
            if m.kind == "health":
                break
        assert m.envelope.health.nonce == nonce and time.monotonic() - sent < 0.1
