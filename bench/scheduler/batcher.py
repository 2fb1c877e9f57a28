"""Micro-benchmark of the gateway's policy core: admissions + flushes per second on one core.

    python -m bench.scheduler.batcher [--num-requests 1000000] [--rate 1e6] [--deadline-frac 0]

Drives `ClassQueues` + `DynamicWindowBatcher` on a `ManualClock` exactly as the gateway does
(push -> flush now or a deadline -> take_batch -> poll), with N pre-built requests arriving at
`--rate` requests/s of virtual time, and reports requests/s and µs/request for the whole loop,
plus a breakdown measured in separate runs of the same requests:

  build      constructing the PendingRequest objects incl. the RNG draws (wall; not in the loop)
  clock      the driver advancing the ManualClock once per request (in the loop figure)
  queues     ClassQueues.push + take(128) alone
  push       batcher.push alone (includes ClassQueues.push), no flushes
  flush      take_batch of 128 after those pushes

The cyclic GC is paused while timing: the 1M requests are long-lived and a GC pass over them is
the benchmark's artefact, not scheduler work (the gateway holds a few thousand at a time).
`time.perf_counter` / `process_time` here time the benchmark; the policy code never reads a clock.
"""
from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import time

from scheduler.batcher import BatcherConfig, DynamicWindowBatcher
from scheduler.classes import QueueClass
from scheduler.clock import ManualClock
from scheduler.queues import ClassQueues, PendingRequest, QueueConfig

CLASSES = (QueueClass.FAST,) * 5 + (QueueClass.NORMAL,) * 3 + (QueueClass.SLOW,) * 2


def build_requests(n: int, rate: float, deadline_frac: float, seed: int = 0) -> list[PendingRequest]:
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        t = i / rate
        deadline = t + 1.0 if rng.random() < deadline_frac else None
        reqs.append(PendingRequest(f"r{i}", rng.randrange(1, 2048), 16, t, rng.choice(CLASSES),
                                   deadline=deadline))
    return reqs


def _queue_config(n: int) -> QueueConfig:
    return QueueConfig(max_requests=(n, n, n), max_prompt_tokens=(n * 2048,) * 3)


def run_loop(reqs: list[PendingRequest], config: BatcherConfig) -> tuple[float, float, DynamicWindowBatcher]:
    """The gateway's loop: arrivals and timer deadlines in time order.
    Returns (wall seconds, CPU seconds of this process, batcher)."""
    clock = ManualClock(0.0)
    batcher = DynamicWindowBatcher(config, clock, ClassQueues(_queue_config(len(reqs))))
    push, poll, take, set_time = batcher.push, batcher.poll, batcher.take_batch, clock.set
    deadline = None
    cpu_start = time.process_time()
    start = time.perf_counter()
    for req in reqs:
        t = req.arrival_time
        if deadline is not None and deadline <= t:  # the timer fires before this arrival
            set_time(deadline)
            dec = poll()
            while dec[0]:
                take()
                dec = poll()
            deadline = dec[1]
        set_time(t)
        dec = push(req)
        while dec[0]:
            take()
            dec = poll()
        deadline = dec[1]
    while batcher.queues.size:  # drain the tail at its deadlines
        if deadline is not None:
            set_time(max(deadline, clock.now()))
        dec = poll()
        while dec[0]:
            take()
            dec = poll()
        deadline = dec[1]
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    batcher.take_expired()
    return elapsed, cpu, batcher


def time_clock(reqs: list[PendingRequest]) -> float:
    clock = ManualClock(0.0)
    set_time = clock.set
    start = time.process_time()
    for req in reqs:
        set_time(req.arrival_time)
    return time.process_time() - start


def time_queues(reqs: list[PendingRequest]) -> float:
    queues = ClassQueues(_queue_config(len(reqs)))
    push, take = queues.push, queues.take
    start = time.process_time()
    for i in range(0, len(reqs), 128):
        for req in reqs[i:i + 128]:
            push(req, 0.0)
        take(128, 0.0)
    return time.process_time() - start


def time_push_flush(reqs: list[PendingRequest]) -> tuple[float, float]:
    """batcher.push of 127 (no flush due) then one take_batch, timed apart."""
    clock = ManualClock(0.0)
    batcher = DynamicWindowBatcher(BatcherConfig(), clock, ClassQueues(_queue_config(len(reqs))))
    push, take, perf = batcher.push, batcher.take_batch, time.process_time
    t_push = t_take = 0.0
    for i in range(0, len(reqs), 127):
        chunk = reqs[i:i + 127]
        t0 = perf()
        for req in chunk:
            push(req)
        t1 = perf()
        take()
        t_take += perf() - t1
        t_push += t1 - t0
    return t_push, t_take


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scheduler.batcher", description=__doc__.split("\n")[0])
    parser.add_argument("--num-requests", type=int, default=1_000_000)
    parser.add_argument("--rate", type=float, default=1e6, help="arrivals per second of virtual time")
    parser.add_argument("--deadline-frac", type=float, default=0.0,
                        help="share of requests that carry a deadline (1 s after arrival)")
    parser.add_argument("--repeat", type=int, default=3, help="best of N")
    args = parser.parse_args(argv)
    n = args.num_requests

    t0 = time.perf_counter()
    reqs = build_requests(n, args.rate, args.deadline_frac)
    t_build = time.perf_counter() - t0
    gc.collect()
    gc.disable()  # the requests are long-lived; a cyclic GC pass over 1M objects is not scheduler work
    try:
        runs = [run_loop(reqs, BatcherConfig()) for _ in range(args.repeat)]
        best, _, batcher = min(runs, key=lambda r: r[0])
        best_cpu = min(r[1] for r in runs)
        t_clock = min(time_clock(reqs) for _ in range(args.repeat))
        t_queues = min(time_queues(reqs) for _ in range(args.repeat))
        t_push, t_take = min((time_push_flush(reqs) for _ in range(args.repeat)), key=sum)
    finally:
        gc.enable()

    st = batcher.stats
    assert st.num_requests + st.num_expired == n, "requests lost or duplicated"
    us = 1e6 / n
    print(f"machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print(f"requests={n} rate={args.rate:g}/s deadline_frac={args.deadline_frac} "
          f"batches={st.num_batches} mean_batch={st.mean_batch_size:.1f}")
    print(f"push->flush loop: {n / best:,.0f} requests/s  {best * us:.3f} µs/request wall (best of {args.repeat})")
    print(f"                  {n / best_cpu:,.0f} requests/s  {best_cpu * us:.3f} µs/request CPU time "
          f"(less sensitive to other processes on the core)")
    if hasattr(os, "getloadavg"):
        print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print("breakdown (µs/request, CPU time, separate runs):")
    print(f"  build      {t_build * us:.3f}  (PendingRequest + RNG; not in the loop figure)")
    print(f"  clock      {t_clock * us:.3f}  (driver, in the loop figure)")
    print(f"  queues     {t_queues * us:.3f}  (ClassQueues.push + take only)")
    print(f"  push       {t_push * us:.3f}  (batcher.push incl. ClassQueues.push)")
    print(f"  flush      {t_take * us:.3f}  (take_batch)")


if __name__ == "__main__":
    main()
