"""Deadline order: a waiting request near its TTFT deadline starts before higher classes.

With the waiting queue by class (`SchedulerConfig.waiting_by_class`, the echo engine's order) a
Fast or Normal request that reaches a backend after a Normal or Slow one starts before it. The
gateway's admission decided on the queue it saw, so those later arrivals are what made most of
the admitted requests that still missed their TTFT target by more than 10% miss (issue 31,
sixteenth session: 87 of 95 traced live misses; Fast passing Normal 1-4 each, Normal and Fast
passing Slow 10-16 each). Admission can only refuse on their probability; the backend sees them.

The rule (`SchedulerConfig.deadline_order`, `tidegate backend --deadline-order`): each request
may carry its TTFT deadline (`GenerateRequest.deadline`: the gateway's arrival + the TTFT target
of its class or its own, read on the backend's clock). When the last free slot is to be filled, the
class order's next request H and the waiting request U with the earliest deadline are compared:
U takes the slot instead of H exactly when U would miss its deadline if it waited for the next
slot to free after H took this one, and H would not miss its own waiting for the next slot after
U (`promote`). The next slot's time is known to the backend: the fewest tokens left to its
running requests and to the one that takes the slot (the echo engine's exactly; the step
scheduler's by length, an upper bound where a stop token ends one sooner), one step each; a
request's first token comes one step after its start. `margin_s` asks that much more room on both sides. So a
higher class still passes a waiting request while its slack is ample, and a request is promoted
only over one that can afford to wait one more slot: at 1.5x capacity a slot frees about every
100 ms on a backend of 8, Fast's whole target is 150 ms, and a plain "urgent first" rule (a
fixed lead before the deadline) turned each Normal miss it removed into a Fast one (simulated:
bench/results/slo_deadline_s17/sim_summary.txt).

Why the TTFT deadline on the wire, not a start-by time computed by the gateway: what must fit
between a start and the deadline is the backend's own business (its first step: one paced step
for the echo engine, a prefill for a model) and the wait for the next free slot, which only the
backend sees coming (its running requests' ends). The deadline itself is what the client was
promised, the same for every backend.

Cost: a heap of (deadline, tie, item) beside the waiting queue, lazily cleaned: O(log n) per
request added, O(1) to look at the earliest; the next free slot's time is O(1) in the step
scheduler (its heap of length finishes) and O(running) in the echo engine (which scans its
waiting queue per admission anyway). A request with no deadline (0) is never promoted and never
refused the wait: the old order exactly.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
from heapq import heappop, heappush
from typing import Generic, TypeVar

T = TypeVar("T")

# extra room asked on both sides of `promote` (see the module doc)
DEFAULT_MARGIN_S = 0.0


def promote(urgent_deadline: float, head_deadline: float, urgent_next: float, head_next: float,
            first_token_s: float, margin_s: float = DEFAULT_MARGIN_S) -> bool:
    """Whether the earliest-deadline request U takes the slot instead of the class order's next
    request H: started at the next slot to free if H took this one (`urgent_next`), U would get
    its first token past its deadline; started at the next one if U took it (`head_next`), H
    would not (or H has no deadline, 0)."""
    if urgent_deadline >= urgent_next + first_token_s + margin_s:
        return False
    return head_deadline <= 0.0 or head_deadline >= head_next + first_token_s + margin_s


class UrgentQueue(Generic[T]):
    """Waiting requests that carry a deadline, earliest first (a heap with lazy deletion).

    `waiting(item)` says whether an entry still waits (not started, not aborted): entries that
    no longer do are dropped when they reach the top."""

    __slots__ = ("_heap", "_tie", "margin_s", "waiting")

    def __init__(self, margin_s: float, waiting: Callable[[T], bool]) -> None:
        if not margin_s >= 0.0:
            raise ValueError(f"the deadline margin must be >= 0 s, got {margin_s}")
        self.margin_s = margin_s
        self.waiting = waiting
        self._heap: list[tuple[float, int, T]] = []
        self._tie = 0

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, deadline: float, item: T) -> None:
        """Track `item` (deadline on the scheduler's clock); a deadline <= 0 means none."""
        if deadline > 0.0:
            self._tie += 1
            heappush(self._heap, (deadline, self._tie, item))

    def earliest(self) -> tuple[float, T] | None:
        """(deadline, item) of the waiting item with the earliest deadline, or None. The item
        stays tracked until it stops waiting."""
        heap, waiting = self._heap, self.waiting
        while heap:
            deadline, _, item = heap[0]
            if not waiting(item):
                heappop(heap)
                continue
            return deadline, item
        return None


def add_deadline_order_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The simulator's (and decision fidelity's) `--deadline-order` / `--deadline-lead-ms`: its
    backends run the rule and its gateway sends the deadlines (live: `tidegate backend
    --deadline-order --deadline-lead-ms`, `tidegate serve --send-deadlines`)."""
    p.add_argument("--deadline-order", action="store_true",
                   help="the backends start a waiting request that would miss its TTFT deadline "
                   "if it waited for the next free slot before the class order's next one, when "
                   "that one would not (tidegate backend --deadline-order with tidegate serve "
                   "--send-deadlines; scheduler.deadline_order)")
    p.add_argument("--deadline-margin-ms", type=float, default=DEFAULT_MARGIN_S * 1000,
                   metavar="MS", help="with --deadline-order: extra room asked on both sides "
                   f"(default {DEFAULT_MARGIN_S * 1000:g})")


def deadline_order_from_args(a: argparse.Namespace) -> dict:
    """SimSchedulerConfig's deadline_order / deadline_margin_s from those flags (absent: off)."""
    margin_ms = getattr(a, "deadline_margin_ms", DEFAULT_MARGIN_S * 1000)
    if not margin_ms >= 0:
        raise ValueError(f"--deadline-margin-ms must be >= 0, got {margin_ms}")
    return {"deadline_order": bool(getattr(a, "deadline_order", False)),
            "deadline_margin_s": margin_ms / 1000}
