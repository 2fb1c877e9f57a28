"""`tidegate serve --workers N`: N gateway processes behind one port, so the gateway scales past
one core. The kernel spreads connections over the processes (SO_REUSEPORT); each has its own
event loop, window, class queues, placement and backend connections (backends serve several
gateways: requests are keyed per gateway on the wire). The parent starts the embedded backend
(if any) once, forks the workers, forwards the first SIGTERM/SIGINT to them and waits.

The parent keeps SIGTERM, SIGINT and SIGCHLD blocked from its first line to its end and takes
them with `sigtimedwait`: a signal is then a return value, never a handler run, and never its
default action (a kill) either (gateway.stop_signals says why that matters). Why not a
Python-level handler, as a worker has: CPython runs a pending handler at the start of every
Python function call, the handler's own included, so under a storm of signals the handler
re-enters itself before its first line, again and again. Session 18's parent did (its handler
returned at once after the first signal, which shortened each level but did not stop the
nesting): instrumented under tests/signal_hammer.py's storm it nested up to 92 deep in 18 runs,
and once it reached the recursion limit a RecursionError escaped from its `waitpid` (exit 1, the
workers left unreaped) or from its exit path before `StopSignals.ignore()` ran (the handler left
installed, reset to SIG_DFL by interpreter finalization: -15) -- the codes its storm test saw.
A blocked signal is only a pending bit, however many are sent.

What is per worker: the batching window sees only its own arrivals (N windows fill N times
slower), placement sees its own charged load plus the backends' reports (each worker counts
only its own in-flight tokens), and /metrics answers for the worker that took the connection.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import traceback
from collections.abc import Callable

from gateway.stop_signals import STOP_SIGNALS, StopSignals


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# taken with sigtimedwait in the parent; blocked there from serve_workers' first line to its end
WAIT_SIGNALS = (*STOP_SIGNALS, signal.SIGCHLD)
# sigtimedwait's timeout: a safety net only (a signal taken by a thread of the parent's that does
# not block it -- the parent starts none -- is noticed this late); every wake-up reaps
WAIT_POLL_S = 1.0


def serve_workers(args: argparse.Namespace,
                  run_one: Callable[[argparse.Namespace, StopSignals], int],
                  start_embedded: Callable[..., object]) -> int:
    """Start the workers, forward the first SIGTERM/SIGINT to them, wait for them all; the exit
    code is the worst of theirs (a worker killed by signal N counts as 128 + N, as in a shell)."""
    received: list[int] = []

    def note(signum, frame) -> None:
        # The disposition while the signals are blocked, so that it is never SIG_DFL: it runs
        # only if a thread that does not block them took one (the parent starts none); the wait
        # loop below does the forwarding
        if not received:
            received.append(signum)

    for sig in STOP_SIGNALS:
        signal.signal(sig, note)
    # Blocked before anything starts (the embedded backend, the workers): a storm of signals is
    # one pending bit each, taken by sigtimedwait below (the module's docstring says why).
    # Threads and forked workers inherit the block; the embedded backend is exec'd with `mask`.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, WAIT_SIGNALS)
    live: set[int] = set()  # forked and not yet reaped: never signal a pid that may be reused
    forwarded = False
    embedded = None
    code = 0

    def take(timeout: float) -> None:
        """Wait up to `timeout` for one of WAIT_SIGNALS; forward the first SIGTERM/SIGINT. Once
        forwarded, wait for SIGCHLD alone: a storm stays one pending bit, costing nothing."""
        nonlocal forwarded
        if received and not forwarded:
            timeout = 0  # forward first
        info = signal.sigtimedwait((signal.SIGCHLD,) if forwarded else WAIT_SIGNALS, timeout)
        if info is not None and info.si_signo in STOP_SIGNALS and not received:
            received.append(info.si_signo)
        if received and not forwarded:
            forwarded = True  # once: a worker's stop is idempotent, later signals change nothing
            for pid in live:
                os.kill(pid, received[0])

    try:
        discovers = args.endpoints_file or args.discover_dns or args.discover_k8s
        backends = args.backend or ([] if discovers else ["embedded"])
        if "embedded" in backends:
            embedded = start_embedded(args, signal_mask=mask)
            backends = [b for b in backends if b != "embedded"] + [embedded.address]
        args.backend = backends
        if args.port == 0:  # every worker must bind the same port: choose it here
            args.port = free_port(args.host)
        args.reuse_port = True
        for _ in range(args.workers):
            take(0)  # a stop signal pending: taken now
            if received:  # stopped while starting them: start no more
                break
            pid = os.fork()
            if pid == 0:  # a worker: one ordinary gateway process
                code = 1
                try:
                    # its own handler first, then the signals unblocked (one sent meanwhile was
                    # pending, and is handled now): never the default action, never `note`
                    signals = StopSignals().install()
                    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                    code = run_one(args, signals)
                except Exception:  # noqa: BLE001 -- os._exit would swallow it: say why it exits 1
                    traceback.print_exc()
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            live.add(pid)
        # a signal that came after the last take(0) is still pending: the first take() below
        # forwards it to every worker, this one included
        while True:
            for pid in list(live):  # SIGCHLD coalesces: look at every worker on each wake-up
                try:
                    done, status = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:  # reaped for us (SIGCHLD inherited as SIG_IGN)
                    live.discard(pid)
                    continue
                if done:
                    live.discard(pid)
                    worker_code = os.waitstatus_to_exitcode(status)
                    code = max(code, worker_code if worker_code >= 0 else 128 - worker_code)
            if not live:
                break
            take(WAIT_POLL_S)
    finally:
        if embedded is not None:
            embedded.stop()
        # SIG_IGN while still blocked: the pending ones are discarded, a later one changes
        # nothing; then the mask the process came with
        StopSignals.ignore()
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return code
