"""Clocks. The scheduler never reads time itself: callers pass a `Clock` (or a time).

The gateway uses `WallClock`; the simulator and the tests use `ManualClock`, so the
same policy code runs on real and virtual time.
"""
from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Current time in seconds (monotonic; the origin is arbitrary)."""
        ...


class WallClock:
    """Monotonic wall time."""

    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to: for tests and the simulator."""

    __slots__ = ("_now",)

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError(f"cannot move a clock backwards (advance by {seconds})")
        self._now += seconds
        return self._now

    def set(self, t: float) -> None:
        if t < self._now:
            raise ValueError(f"cannot move a clock backwards ({self._now} -> {t})")
        self._now = float(t)
