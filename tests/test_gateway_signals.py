"""SIGTERM/SIGINT in `tidegate serve`: the first drains, the rest change nothing, exit 0.

The defect these guard against (session 18): the loop's `remove_signal_handler` put SIG_DFL back
before `signal.signal(sig, SIG_IGN)` ran, so a second SIGTERM in that window killed a gateway
that had drained (-15), and a second SIGINT raised KeyboardInterrupt (-2); a `--workers` parent
left its Python-level handler installed, which interpreter finalization resets to SIG_DFL.
gateway.stop_signals owns the two signals from start-up to exit instead. The window is
microseconds wide: tests/signal_hammer.py signals each gateway as fast as it can, many times.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_gateway_http import ipc_address
from test_gateway_limits import start_fake_process
from test_gateway_serve import ServeProcess, stream_in_background

from gateway.stop_signals import STOP_SIGNALS, StopSignals

ROOT = Path(__file__).parents[1]
HAMMER = Path(__file__).with_name("signal_hammer.py")


@pytest.fixture
def fake_backend():
    address = ipc_address()
    proc = start_fake_process(address)
    yield address
    proc.kill()
    proc.wait()


@pytest.fixture
def restore_signals():
    """StopSignals changes this process's dispositions: put pytest's back."""
    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def _run_loop(kind: str, coro):
    if kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        return uvloop.run(coro)
    return asyncio.run(coro)


@pytest.mark.parametrize("kind", ["uvloop", "asyncio"])
@pytest.mark.parametrize("sig", STOP_SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_a_signal_taken_by_another_thread_wakes_the_idle_loop(kind, sig, restore_signals):
    """The kernel may hand the signal to any thread; the handler runs in the main thread, which
    sleeps in epoll: only a wakeup fd wakes it (uvloop's own; ours under plain asyncio)."""
    signals = StopSignals().install()

    async def main() -> float:
        stop = asyncio.Event()
        signals.attach(asyncio.get_running_loop(), stop)
        try:
            def other_thread() -> None:
                time.sleep(0.2)  # the main thread is asleep in the loop by now
                signal.pthread_kill(threading.get_ident(), sig)  # delivered to this thread

            t0 = time.monotonic()
            thread = threading.Thread(target=other_thread)
            thread.start()
            await asyncio.wait_for(stop.wait(), 5.0)  # nothing else would wake it before 5 s
            thread.join()
            return time.monotonic() - t0
        finally:
            signals.detach()

    assert _run_loop(kind, main()) < 2.0
    assert signals.received == sig
    signals.ignore()
    assert all(signal.getsignal(s) is signal.SIG_IGN for s in STOP_SIGNALS)


def test_a_signal_before_the_loop_runs_is_not_lost(restore_signals):
    signals = StopSignals().install()
    os.kill(os.getpid(), signal.SIGTERM)  # not our default action: we are still here

    async def main() -> bool:
        stop = asyncio.Event()
        signals.attach(asyncio.get_running_loop(), stop)
        try:
            return stop.is_set()
        finally:
            signals.detach()

    assert asyncio.run(main()) and signals.received == signal.SIGTERM


def _hammer(backend: str, sig: str, runs: int, budget_s: float, *flags: str,
            serve_args: tuple[str, ...] = ()) -> dict:
    done = subprocess.run(
        [sys.executable, str(HAMMER), "--runs", str(runs), "--budget-s", str(budget_s),
         "--signal", sig, *flags, "--", "--backend", backend, *serve_args],
        cwd=ROOT, capture_output=True, text=True, timeout=budget_s + 120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# (signal, hammer flags, `serve` flags, runs, seconds): on main's code SIGINT failed 19 of 60
# runs (KeyboardInterrupt), SIGTERM 1 of 30 on a quiet machine and 27 of 150 on a loaded one,
# a --workers 2 parent 10 of 10; the fix, none of 100+ each (tests/signal_hammer.py's numbers,
# /work/brief/s18/H36S_note.md)
# The seconds cap a slow machine (no new run starts past them); ~15 s in all on a 2-core one.
# The --workers storm runs at recursion limit 60: session 18's parent (a handler that re-entered
# itself under the storm) then failed 4 of 30 and 7 of 18 runs (1 in hundreds at the default
# 1000); session 19's (no handler in the parent), none of 80 (/work/brief/s19/H37S_note.md).
STORMS = {
    "sigterm": ("SIGTERM", (), (), 40, 10.0),
    "sigint": ("SIGINT", (), (), 20, 6.0),
    # the pure-Python loop under the storm: ~2.9 s a run in a loaded fresh-clone CI (session 20:
    # 4 runs in 11.7 s, every one exit 0), so its cap leaves room for its 5
    "sigterm-asyncio": ("SIGTERM", ("--no-uvloop",), (), 5, 20.0),
    "sigterm-workers": ("SIGTERM", ("--recursion-limit", "60"), ("--workers", "2"), 6, 8.0),
}


# The --workers storm failed now and then until session 19 (codes -15, 0, 0, 1, 0, 0 and two workers
# left behind in session 18's last fresh-clone CI): the parent's Python-level handler re-entered
# itself under the storm until a RecursionError escaped (gateway/workers.py's docstring). The parent
# now keeps the signals blocked and takes them with sigtimedwait: no handler runs there.
@pytest.mark.parametrize("storm", list(STORMS))
def test_a_signal_storm_through_the_drain_still_exits_0(fake_backend, storm):
    """From the "serving model" line until the process is gone, signal after signal: the first
    starts the drain, the rest land during and after it; every run must exit 0 and leave no
    process behind."""
    sig, flags, serve_args, runs, budget_s = STORMS[storm]
    result = _hammer(fake_backend, sig, runs, budget_s, *flags, serve_args=serve_args)
    done = result["runs"]
    assert len(done) >= min(runs, 5), result  # enough runs for the window to be met
    assert all(r["ready"] for r in done), result
    assert result["codes"] == [0] * len(done), result
    assert result["left_behind"] == 0, result


@pytest.mark.parametrize("sig", STOP_SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_repeated_signals_during_the_drain_change_nothing(fake_backend, sig):
    """A stream in flight, then a signal every millisecond until the gateway is gone: the
    stream still ends normally, new requests get 503, exit 0 (a second signal is no
    'stop harder')."""
    server = ServeProcess("--backend", fake_backend, "--drain-timeout", "20")
    t, started, result = stream_in_background(
        server, {"prompt": "a", "max_tokens": 400, "ignore_eos": True, "stream": True})
    assert started.wait(30)
    stop_storm = threading.Event()

    def storm() -> None:
        pid = server.proc.pid
        # waitid(WNOWAIT): the process is not reaped (its pid not reusable) while we signal it
        while not stop_storm.is_set() and os.waitid(
                os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            os.kill(pid, sig)
            time.sleep(0.001)

    storm_thread = threading.Thread(target=storm)
    storm_thread.start()
    try:
        deadline = time.monotonic() + 10
        while True:
            time.sleep(0.05)
            status, body = server.post("/v1/completions", {"prompt": "b", "max_tokens": 2})
            if status != 200 or time.monotonic() > deadline:
                break
        assert status == 503 and body["error"]["code"] == "shutting_down"
        t.join(30)
        status, raw = result["long"]
        assert status == 200 and raw.rstrip().endswith("data: [DONE]")
        assert raw.count('"finish_reason": "length"') == 1
        storm_thread.join(30)  # ends once the gateway has exited
    finally:
        stop_storm.set()
        storm_thread.join()
    code, err = server.stop()
    assert code == 0, err[-2000:]


@pytest.mark.parametrize("sig", STOP_SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_a_signal_during_start_up_stops_there_with_exit_0(sig):
    """No backend answers: the gateway waits for one (up to 5 s for a remote backend); a signal
    then ends the wait and the process at once, exit 0, without serving."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.tidegate_cli", "serve", "--port", "0",
         "--backend", ipc_address(), "--startup-timeout", "60"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    guard = threading.Timer(60, proc.kill)  # a gateway that never logs the wait: no hang
    guard.start()
    try:
        line = proc.stderr.readline()
        while line and "waiting for the backends" not in line:
            line = proc.stderr.readline()
        assert line, proc.stderr.read()
        t0 = time.monotonic()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err[-2000:]
        assert time.monotonic() - t0 < 3.0  # not the 5 s wait
        assert not re.search(r"serving model", out) and "stopping during start-up" in err
    finally:
        guard.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
