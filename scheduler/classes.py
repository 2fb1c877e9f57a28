"""Queue classes: a request's class comes from its remaining tokens (max_tokens - generated).

Fast <= 8, Normal 9..64, Slow > 64 by default. Lower value = served first. This is the one
place the rule is written; the gateway, the backend's step scheduler, the simulator and the
metrics all use it (and `CLASS_NAMES` for the lower-case names on the wire and in reports).
"""
from __future__ import annotations

from enum import IntEnum

DEFAULT_CLASS_BOUNDS: tuple[int, int] = (8, 64)


class QueueClass(IntEnum):
    FAST = 0
    NORMAL = 1
    SLOW = 2


CLASS_NAMES: tuple[str, ...] = tuple(c.name.lower() for c in QueueClass)  # index = class value
_BY_INDEX: tuple[QueueClass, ...] = tuple(QueueClass)  # a tuple index is faster than QueueClass(i)


def class_index(remaining_tokens: int, bounds: tuple[int, int] = DEFAULT_CLASS_BOUNDS) -> int:
    """The class value (0 fast, 1 normal, 2 slow) as a plain int, for hot loops and sort keys."""
    return 0 if remaining_tokens <= bounds[0] else 1 if remaining_tokens <= bounds[1] else 2


def classify(remaining_tokens: int, bounds: tuple[int, int] = DEFAULT_CLASS_BOUNDS) -> QueueClass:
    """Class of a request with `remaining_tokens` still to generate."""
    return _BY_INDEX[class_index(remaining_tokens, bounds)]
