"""Service-level objectives per queue class: a TTFT and a TPOT target for Fast, Normal and Slow.

One place for the targets the gateway admits by (`scheduler.admission`), the metrics count
attainment against, the simulator reports and `tidegate sim slo` plans for. A target is in
milliseconds; None means "no target" (never refused for it, always attained).

Written on the command line as one number for every class or per class by name::

    --slo-ttft-ms 500                          # every class
    --slo-ttft-ms fast=200,normal=1000,slow=4000
    --slo-tpot-ms slow=80                      # the others: no target
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from scheduler.classes import CLASS_NAMES

NUM_CLASSES = len(CLASS_NAMES)
Targets = tuple[float | None, ...]  # one per class, index = class value
NO_TARGETS: Targets = (None,) * NUM_CLASSES


def parse_targets(text: str | float | None) -> Targets:
    """'500' -> every class; 'fast=200,slow=4000' -> per class (others None); None/'' -> none.
    Raises ValueError on an unknown class name or a value that is not a positive number."""
    if text is None or (isinstance(text, str) and not text.strip()):
        return NO_TARGETS
    if isinstance(text, (int, float)):
        return (_positive(float(text), "target"),) * NUM_CLASSES
    if "=" not in text:
        return (_positive(float(text), "target"),) * NUM_CLASSES
    out: list[float | None] = [None] * NUM_CLASSES
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name = name.strip().lower()
        if not sep or name not in CLASS_NAMES:
            raise ValueError(f"SLO target {part!r}: want CLASS=MS with CLASS one of "
                             f"{', '.join(CLASS_NAMES)}")
        out[CLASS_NAMES.index(name)] = _positive(float(value), name)
    return tuple(out)


def format_targets(targets: Targets) -> str:
    """The inverse of `parse_targets` (classes without a target left out)."""
    return ",".join(f"{n}={t:g}" for n, t in zip(CLASS_NAMES, targets) if t is not None)


def _positive(x: float, what: str) -> float:
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"SLO target for {what} must be a positive number of ms, got {x}")
    return x


@dataclass(frozen=True)
class SLOTargets:
    """TTFT and TPOT targets (ms) per class; a request may carry its own (`for_request`)."""

    ttft_ms: Targets = NO_TARGETS
    tpot_ms: Targets = NO_TARGETS

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms"):
            v = getattr(self, name)
            if len(v) != NUM_CLASSES:
                raise ValueError(f"{name} needs one target per class ({NUM_CLASSES}), got {v}")
            for t in v:
                if t is not None:
                    _positive(t, name)

    @classmethod
    def parse(cls, ttft: str | float | None, tpot: str | float | None) -> SLOTargets:
        return cls(parse_targets(ttft), parse_targets(tpot))

    @property
    def any_ttft(self) -> bool:
        return any(t is not None for t in self.ttft_ms)

    @property
    def any(self) -> bool:
        return self.any_ttft or any(t is not None for t in self.tpot_ms)

    def ttft_s(self, cls: int, override_ms: float | None = None) -> float | None:
        """The TTFT deadline of a class-`cls` request in seconds (its own, if it gave one)."""
        t = self.ttft_ms[cls] if override_ms is None else override_ms
        return None if t is None else t / 1000.0

    def met(self, cls: int, ttft_s: float | None, tpot_s: float | None,
            ttft_override_ms: float | None = None, tpot_override_ms: float | None = None) -> bool:
        """Whether a finished request met its class's targets (or its own). A request with one
        output token has no TPOT: only its TTFT counts."""
        ttft = self.ttft_ms[cls] if ttft_override_ms is None else ttft_override_ms
        tpot = self.tpot_ms[cls] if tpot_override_ms is None else tpot_override_ms
        if ttft is not None and (ttft_s is None or ttft_s * 1000 > ttft):
            return False
        return not (tpot is not None and tpot_s is not None and tpot_s * 1000 > tpot)

    def describe(self) -> dict:
        return {name: {"ttft_ms": a, "tpot_ms": b}
                for name, a, b in zip(CLASS_NAMES, self.ttft_ms, self.tpot_ms)}
