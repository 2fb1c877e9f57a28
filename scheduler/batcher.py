"""The dynamic-window batcher: when to send what is waiting in `ClassQueues` as one Batch.

A window opens when a request arrives at an empty batcher (`window_start` = its `arrival_time`).
With `size` requests queued and `rate = target_throughput * hysteresis`, the window is due at

    deadline = window_start + min(min_latency, size / rate)

which is the instant the DESIGN rules `age > min_latency` or `size / age < rate` become true;
`size >= max_batch_size` makes it due at once. Boundaries are inclusive (`now >= deadline`
flushes), so a timer that fires exactly at the deadline it was given always flushes. Idle flush
(on by default): while the caller has reported spare backend capacity, the window is due at once;
one flush consumes that report (the batch just sent uses the capacity).

The caller runs one timer, never polls:

    dec = batcher.push(req)                 # or .poll() when the timer fires, .notify_idle(...)
    if dec.rejected: answer 429             # the request was not queued
    while dec.flush_now:
        send(batcher.take_batch())          # <= max_batch_size, service order of ClassQueues
        dec = batcher.poll()
    answer 504 for batcher.take_expired()   # deadlines that passed while queued
    arm_timer(dec.deadline)                 # None: nothing waiting

`Decision.deadline` is the window deadline or, if earlier, the earliest request deadline, so the
same timer also reports expiry. After `take_batch` the next window starts at the oldest remaining
arrival (so a backlog is due at once). `cancel` and expiry leave `window_start` as it is (the window
opened then) and close it when nothing is left; call `poll()` after `cancel` for the new deadline.

Time: `now` always comes from the injected `Clock`; window starts come from `arrival_time`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from scheduler.clock import Clock
from scheduler.queues import ACCEPTED, ClassQueues, PendingRequest, PushResult

MAX_BATCH_SIZE_LIMIT = 128


@dataclass(frozen=True)
class BatcherConfig:
    max_batch_size: int = 128  # hard cap on requests per Batch, 1..128
    min_latency_ms: float = 5.0  # the longest a window stays open
    # requests/s; slower arrivals are not worth waiting for. Chosen by `tidegate sim window`
    # over the embedded CPU backend and two H200 presets with the measured per-message cost
    # (docs/window_defaults.md): the design card's 8,000 flushed every window after ~0.16 ms,
    # so at every measured rate a window held one request
    target_throughput: float = 250.0
    hysteresis: float = 0.8  # the window waits only while arrivals beat target * hysteresis
    idle_flush: bool = True  # flush at once while a backend reports spare capacity

    def __post_init__(self) -> None:
        if isinstance(self.max_batch_size, bool) or not isinstance(self.max_batch_size, int):
            raise ValueError(f"max_batch_size must be an int, got {self.max_batch_size!r}")  # noqa: TRY004
        if not 1 <= self.max_batch_size <= MAX_BATCH_SIZE_LIMIT:
            raise ValueError(f"max_batch_size must be in 1..{MAX_BATCH_SIZE_LIMIT}, got {self.max_batch_size}")
        if not (math.isfinite(self.min_latency_ms) and self.min_latency_ms >= 0):
            raise ValueError(f"min_latency_ms must be finite and >= 0, got {self.min_latency_ms}")
        if not (math.isfinite(self.target_throughput) and self.target_throughput > 0):
            raise ValueError(f"target_throughput must be finite and > 0, got {self.target_throughput}")
        if not (math.isfinite(self.hysteresis) and self.hysteresis > 0):
            raise ValueError(f"hysteresis must be finite and > 0, got {self.hysteresis}")

    @property
    def min_latency_s(self) -> float:
        return self.min_latency_ms / 1000.0

    @property
    def flush_rate(self) -> float:
        """target_throughput * hysteresis: the arrival rate below which the window flushes."""
        return self.target_throughput * self.hysteresis


class Decision(NamedTuple):
    flush_now: bool  # a batch is due: call take_batch() (then poll() again)
    deadline: float | None  # when to call poll() next; None when nothing is waiting
    rejected: PushResult | None = None  # set when push refused the request (it was not queued)


FLUSH = Decision(True, None)
IDLE = Decision(False, None)
_new_decision = tuple.__new__  # Decision(...) through NamedTuple.__new__ costs ~3x more


@dataclass(slots=True)
class BatcherStats:
    num_batches: int = 0
    num_requests: int = 0  # handed out in batches
    num_rejected: int = 0
    num_cancelled: int = 0
    num_expired: int = 0

    @property
    def mean_batch_size(self) -> float:
        return self.num_requests / self.num_batches if self.num_batches else 0.0


class DynamicWindowBatcher:
    __slots__ = (
        "_last_deadline",
        "_last_decision",
        "_max_batch",
        "_min_latency",
        "_now",
        "_rate",
        "_spare",
        "clock",
        "config",
        "queues",
        "stats",
        "window_start",
    )

    def __init__(self, config: BatcherConfig, clock: Clock, queues: ClassQueues) -> None:
        self.config = config
        self.clock = clock
        self._now = clock.now
        self.queues = queues
        self.stats = BatcherStats()
        self.window_start: float | None = None  # None: no window open
        self._spare = False  # a backend reported spare capacity (only set when idle_flush is on)
        self._max_batch = config.max_batch_size
        self._min_latency = config.min_latency_s
        self._rate = config.flush_rate
        self._last_deadline = -math.inf  # one cached Decision: under load the deadline repeats
        self._last_decision = IDLE

    # -- events ------------------------------------------------------------------------------
    def push(self, req: PendingRequest) -> Decision:
        """Admit one request; answer flush-now or the next deadline (or the 429 refusal)."""
        now = self._now()
        queues = self.queues
        expiry = queues.expiry_heap
        if expiry and expiry[0][0] <= now:  # expired before this arrival: out first, so an
            queues.collect_expired(now)     # empty batcher is seen as empty
        result = queues.push(req, now)
        if result is not ACCEPTED:
            self.stats.num_rejected += 1
            dec = self._decide(now)
            return _new_decision(Decision, (dec.flush_now, dec.deadline, result))
        if req.deadline is not None and req.deadline <= now:  # dead on arrival: expire, no window
            queues.collect_expired(now)
            return self._decide(now)
        size = queues.size
        if size == 1 or self.window_start is None:
            self.window_start = req.arrival_time  # the window opens at an arrival to an empty batcher
        if size >= self._max_batch or self._spare:
            return FLUSH
        # _deadline_decision, inlined: this is the per-request hot path
        wait = size / self._rate
        if wait > self._min_latency:  # noqa: PLR1730 (min() is a call on the hot path)
            wait = self._min_latency
        deadline = self.window_start + wait
        if now >= deadline:
            return FLUSH
        expiry = queues.expiry_heap
        if expiry and expiry[0][0] < deadline:
            deadline = expiry[0][0]
        if deadline == self._last_deadline:
            return self._last_decision
        dec = self._last_decision = _new_decision(Decision, (False, deadline, None))
        self._last_deadline = deadline
        return dec

    def poll(self) -> Decision:
        """Call when the timer fires (or any time): collects expired requests, answers as push does."""
        now = self._now()
        queues = self.queues
        if queues.expiry_heap and queues.expiry_heap[0][0] <= now:
            queues.collect_expired(now)
        return self._decide(now)

    def notify_idle(self, has_spare_capacity: bool = True) -> Decision:
        """A backend reports (or withdraws) spare capacity; with idle_flush on, that makes the window due."""
        self._spare = bool(has_spare_capacity) and self.config.idle_flush
        return self.poll()

    def predicted_wait(self, now: float) -> float:
        """How long a request pushed now would wait for its window to flush, with no further
        arrivals: 0 when the window would flush at once (idle flush, a full window), else
        window_start (or now) + min(min_latency, (size + 1) / rate) - now. What admission
        (scheduler.admission) adds for the window; no state changes."""
        size = self.queues.size + 1
        if self._spare or size >= self._max_batch:
            return 0.0
        start = self.window_start if self.window_start is not None and self.queues.size else now
        wait = size / self._rate
        if wait > self._min_latency:  # noqa: PLR1730
            wait = self._min_latency
        return max(0.0, start + wait - now)

    def cancel(self, request_id: str) -> PendingRequest | None:
        """Take a queued request out (client gone). Call poll() afterwards for the new deadline."""
        req = self.queues.remove(request_id)
        if req is not None:
            self.stats.num_cancelled += 1
            if not self.queues.size:
                self.window_start = None
        return req

    # -- draining ----------------------------------------------------------------------------
    def take_batch(self) -> list[PendingRequest]:
        """Up to max_batch_size requests in service order; the next window starts at the oldest left."""
        queues = self.queues
        batch = queues.take(self._max_batch, self._now())
        if batch:
            stats = self.stats
            stats.num_batches += 1
            stats.num_requests += len(batch)
            self._spare = False
        self.window_start = queues.oldest_arrival() if queues.size else None
        return batch

    def take_expired(self) -> list[PendingRequest]:
        """Requests whose deadline passed while queued (answer them 504); never in a batch."""
        expired = self.queues.take_expired(self._now())
        if expired:
            self.stats.num_expired += len(expired)
            if not self.queues.size:
                self.window_start = None
        return expired

    # -- the rule ----------------------------------------------------------------------------
    def _decide(self, now: float) -> Decision:
        size = self.queues.size
        if not size:
            self.window_start = None
            return IDLE
        if self.window_start is None:  # requests were queued behind the batcher's back
            self.window_start = self.queues.oldest_arrival()
        if size >= self._max_batch or self._spare:
            return FLUSH
        return self._deadline_decision(now, size)

    def _deadline_decision(self, now: float, size: int) -> Decision:
        wait = size / self._rate
        if wait > self._min_latency:  # noqa: PLR1730 (min() is a call on the hot path)
            wait = self._min_latency
        deadline = self.window_start + wait
        if now >= deadline:
            return FLUSH
        expiry = self.queues.expiry_heap  # peek only: the earliest request deadline
        if expiry and expiry[0][0] < deadline:
            deadline = expiry[0][0]
        if deadline == self._last_deadline:
            return self._last_decision
        dec = self._last_decision = _new_decision(Decision, (False, deadline, None))
        self._last_deadline = deadline
        return dec
