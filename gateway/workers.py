"""`tidegate serve --workers N`: N gateway processes behind one port, so the gateway scales past
one core. The kernel spreads connections over the processes (SO_REUSEPORT); each has its own
event loop, window, class queues, placement and backend connections (backends serve several
gateways: requests are keyed per gateway on the wire). The parent starts the embedded backend
(if any) once, forks the workers, forwards SIGTERM/SIGINT to them and waits; it owns the two
signals from before the first fork to its exit, so that neither is ever left to its default
action (a kill) in between (gateway.stop_signals says why that matters).

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
from collections.abc import Callable

from gateway.stop_signals import STOP_SIGNALS, StopSignals


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def serve_workers(args: argparse.Namespace,
                  run_one: Callable[[argparse.Namespace, StopSignals], int],
                  start_embedded: Callable[[argparse.Namespace], object]) -> int:
    """Start the workers, forward SIGTERM/SIGINT to them, wait for them all; the exit code is
    the worst of theirs (a worker killed by signal N counts as 128 + N, as in a shell)."""
    parent = os.getpid()
    live: set[int] = set()  # forked and not yet reaped: never signal a pid that may be reused
    received: list[int] = []

    def forward(signum, frame) -> None:
        if os.getpid() != parent:
            # a signal the parent had taken but not yet handled when it forked: the parent
            # handles it (and signals this worker: below); a worker owns its signals from
            # StopSignals.install() on
            return
        if signum in received:
            # forwarded once already (a worker's stop is idempotent): return at once, so that a
            # storm of signals does not recurse through this handler (CPython runs it again
            # inside itself when another signal lands: a RecursionError once did)
            return
        received.append(signum)  # before the kills: a signal landing in them returns above
        for pid in list(live):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    for sig in STOP_SIGNALS:  # before the embedded backend and the first fork
        signal.signal(sig, forward)  # (no SA_RESTART: waitpid below must return to run it)
    discovers = args.endpoints_file or args.discover_dns or args.discover_k8s
    backends = args.backend or ([] if discovers else ["embedded"])
    embedded = None
    if "embedded" in backends:
        embedded = start_embedded(args)
        backends = [b for b in backends if b != "embedded"] + [embedded.address]
    args.backend = backends
    if args.port == 0:  # every worker must bind the same port: choose it here
        args.port = free_port(args.host)
    args.reuse_port = True
    children: list[int] = []
    for _ in range(args.workers):
        if received:  # stopped while starting them: start no more
            break
        # blocked across the fork: the worker starts with them blocked and unblocks them once
        # its own handler is installed (a signal meanwhile waits for it), so neither their
        # default action nor `forward` (inherited, a no-op there) ever takes one of its own
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        pid = os.fork()
        if pid == 0:  # a worker: one ordinary gateway process
            code = 1
            try:
                signals = StopSignals().install()
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                code = run_one(args, signals)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        children.append(pid)
        live.add(pid)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if received:  # a signal handled before this worker was in `live`
            os.kill(pid, received[0])
    code = 0
    try:
        for pid in children:
            _, status = os.waitpid(pid, 0)  # retried by Python when a signal interrupts it
            live.discard(pid)
            worker_code = os.waitstatus_to_exitcode(status)
            code = max(code, worker_code if worker_code >= 0 else 128 - worker_code)
    finally:
        if embedded is not None:
            embedded.stop()
        StopSignals.ignore()  # forward -> SIG_IGN in one call: a late signal changes nothing
    return code
