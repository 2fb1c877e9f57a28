"""`tidegate serve --workers N`: N gateway processes behind one port, so the gateway scales past
one core. The kernel spreads connections over the processes (SO_REUSEPORT); each has its own
event loop, window, class queues, placement and backend connections (backends serve several
gateways: requests are keyed per gateway on the wire). The parent starts the embedded backend
(if any) once, forks the workers, forwards SIGTERM/SIGINT to them and waits.

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


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def serve_workers(args: argparse.Namespace, run_one: Callable[[argparse.Namespace], int],
                  start_embedded: Callable[[argparse.Namespace], object]) -> int:
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
        pid = os.fork()
        if pid == 0:  # a worker: one ordinary gateway process
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            code = 1
            try:
                code = run_one(args)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        children.append(pid)

    def forward(signum, frame) -> None:
        for pid in children:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = 0
    try:
        for pid in children:
            while True:
                try:
                    _, status = os.waitpid(pid, 0)
                    break
                except InterruptedError:
                    continue
            code = max(code, os.waitstatus_to_exitcode(status))
    finally:
        if embedded is not None:
            embedded.stop()
    return code
