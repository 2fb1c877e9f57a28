"""Which cores a CPU backend's threads run on (`--cpu-affinity`).

On a small machine the gateway, the backend and a load generator share a few cores. Left to the
OS, the backend's compute thread is moved around and shares its core with the others; pinned to
its own cores, with the rest of the machine left to everything else, it keeps a core to itself
(vLLM's CPU build does the same: `VLLM_CPU_OMP_THREADS_BIND=auto` binds its OpenMP workers and
leaves a core to its API server). `tidegate serve` starts its embedded backend with `auto`.

    auto   the last N cores this process may use, N = the engine's torch threads, when at least
           one core is left over (else nothing is pinned)
    none   no pinning (the default of `tidegate backend`)
    LIST   explicit cores: "1", "2-3", "0,2"

Set on the main thread before torch starts its thread pool: threads created later inherit it.
"""
from __future__ import annotations

import logging
import os

log = logging.getLogger("tidegate.backend")


def parse_cores(spec: str) -> list[int]:
    cores: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"--cpu-affinity: {spec!r} is not auto, none or a core list (0,2-3)")
        cores += range(int(lo), int(hi or lo) + 1)
    return sorted(set(cores))


def choose_cores(spec: str, allowed: list[int], threads: int) -> list[int] | None:
    """The cores to pin to, or None (leave the affinity as it is)."""
    if spec == "none":
        return None
    if spec == "auto":
        allowed = sorted(allowed)
        return allowed[-threads:] if 0 < threads < len(allowed) else None
    cores = parse_cores(spec)
    if not set(cores) <= set(allowed):
        raise ValueError(f"--cpu-affinity {spec}: not among this process's cores {allowed}")
    return cores


def apply_cpu_affinity(spec: str, device: str, threads: int) -> list[int] | None:
    """Pin this process's main thread (and the threads it starts later) for a CPU engine;
    returns the cores, or None when nothing was pinned (GPU engines are never pinned)."""
    if not device.startswith("cpu") or not hasattr(os, "sched_setaffinity"):
        return None
    cores = choose_cores(spec, sorted(os.sched_getaffinity(0)), threads)
    if cores:
        os.sched_setaffinity(0, cores)
        log.info("CPU engine pinned to cores %s", cores)
    return cores
