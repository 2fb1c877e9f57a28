"""Queue classes: a request's class comes from its remaining tokens (max_tokens - generated).

Fast <= 8, Normal 9..64, Slow > 64 by default. Lower value = served first.
"""
from __future__ import annotations

from enum import IntEnum

DEFAULT_CLASS_BOUNDS: tuple[int, int] = (8, 64)


class QueueClass(IntEnum):
    FAST = 0
    NORMAL = 1
    SLOW = 2


def classify(remaining_tokens: int, bounds: tuple[int, int] = DEFAULT_CLASS_BOUNDS) -> QueueClass:
    """Class of a request with `remaining_tokens` still to generate."""
    fast_max, normal_max = bounds
    if remaining_tokens <= fast_max:
        return QueueClass.FAST
    if remaining_tokens <= normal_max:
        return QueueClass.NORMAL
    return QueueClass.SLOW
