"""Per-backend load with the least-loaded backend found in O(log backends).

A backend's *load* is the number of tokens it still has to process for us (prompt tokens not yet
prefilled + output tokens not yet generated), as charged by the placement policy and released by
its caller. The least-loaded pick is a lazy min-heap of ``(load, backend)`` entries:

    add_load(b, d)   load[b] += d; push (load[b], b)            O(log n), in C (heapq)
    least()          pop entries that no longer match load[b] or  amortized O(log n)
                     whose backend takes no requests; peek the top

An entry is valid while its load equals the backend's current load and the backend accepts
requests; stale entries are dropped when they reach the top, and the heap is rebuilt from the
current loads when it grows past 4x the number of backends (so memory stays O(backends)). Ties go
to the lower backend id (tuples compare the id second), which makes every pick deterministic.
"""
from __future__ import annotations

import heapq


class LoadIndex:
    """Loads of backends named by small non-negative ints (ids are the caller's)."""

    __slots__ = ("_heap", "_live", "_ordered", "accepting", "load")

    def __init__(self) -> None:
        self.load: list[int] = []          # by backend id; ids not in use hold 0
        self.accepting: list[bool] = []    # False: draining, full, down or removed
        self._live: set[int] = set()       # ids added and not removed
        self._heap: list[tuple[int, int]] = []
        self._ordered: list[int] | None = []  # sorted live ids; None: rebuild at next read

    # ---- membership --------------------------------------------------------------------------
    def add(self, b: int) -> None:
        if b < 0:
            raise ValueError(f"backend ids are non-negative, got {b}")
        if b in self._live:
            raise ValueError(f"backend {b} is already placed on")
        while len(self.load) <= b:
            self.load.append(0)
            self.accepting.append(False)
        self._live.add(b)
        self._ordered = None
        self.load[b] = 0
        self.accepting[b] = True
        self._push(0, b)

    def remove(self, b: int) -> None:
        self._live.discard(b)
        self._ordered = None
        if b < len(self.accepting):
            self.accepting[b] = False
            self.load[b] = 0

    def set_accepting(self, b: int, accepting: bool) -> None:
        """A backend that does not accept (draining, at its in-flight cap, down) is never picked;
        its load is still tracked."""
        if b not in self._live or self.accepting[b] == accepting:
            return
        self.accepting[b] = accepting
        if accepting:
            self._push(self.load[b], b)

    def __contains__(self, b: int) -> bool:
        return b in self._live

    @property
    def backends(self) -> list[int]:
        """Live ids in increasing order (kept between membership changes: O(1) to read)."""
        if self._ordered is None:
            self._ordered = sorted(self._live)
        return self._ordered

    @property
    def num_accepting(self) -> int:
        return sum(1 for b in self._live if self.accepting[b])

    # ---- load --------------------------------------------------------------------------------
    def add_load(self, b: int, delta: int) -> None:
        if b not in self._live:
            return  # removed meanwhile: its late releases change nothing
        load = self.load[b] + delta
        self.load[b] = load
        if self.accepting[b]:  # _push, inlined: this runs at every placement and release
            heap = self._heap
            heapq.heappush(heap, (load, b))
            if len(heap) > 4 * len(self._live) + 64:
                self._rebuild()

    def _push(self, load: int, b: int) -> None:
        heap = self._heap
        heapq.heappush(heap, (load, b))
        if len(heap) > 4 * len(self._live) + 64:
            self._rebuild()

    def least(self) -> int | None:
        """The accepting backend with the least load (lowest id on ties); None if none accepts."""
        heap, load, accepting = self._heap, self.load, self.accepting
        while heap:
            top_load, b = heap[0]
            if accepting[b] and load[b] == top_load:
                return b
            heapq.heappop(heap)
        return None

    def _rebuild(self) -> None:
        load = self.load
        self._heap = [(load[b], b) for b in self._live if self.accepting[b]]
        heapq.heapify(self._heap)
