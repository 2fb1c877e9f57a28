"""Admission that predicts the wait: refuse at once what cannot meet its TTFT deadline.

The gateway (wall clock) and the simulator (virtual clock) run this same code; time is an
argument. A new class-`c` request's time to first token is predicted as

    ttft = window + gateway_ahead / capacity + min over backends b of (ahead_b * gap_b + service_b)
           ──────   ──────────────────────────   ─────────────────────────────────────────────────
           the batching   requests of class <= c       the backend it would be placed on: requests
           window still   queued in the gateway,       of class <= c sent there and not started
           to wait        at every backend's rate      (no first token yet), one start every gap_b,
                          (sum of 1 / gap_b)           then its own prefill (service_b)

Two figures per backend, both measured from what the gateway sees (dispatches and first tokens):

- ``gap_b``: the mean time between first tokens while requests were waiting to start there
  (a start is *paced* when another request sent there was still unstarted at the previous start:
  the gap between the two measured the backend, not the arrivals). An exponentially weighted
  mean of those gaps (weight `gap_weight`), so it follows the backend's speed under load without
  being lowered by idle spells. 1 / gap_b is the backend's start capacity (requests/s).
- ``service_b``: what a request's dispatch → first token took beyond its queue: that time minus
  (requests ahead of it at dispatch) x gap_b, over every started request (only those that found
  nothing ahead until gap_b is known), weighted the same way. It follows the backend's current
  step time: under decode load a step is slower, and the start of a request with nothing ahead
  waits for the step in progress and then its own. (Measured only from requests that found an
  empty queue, it stayed at its light-load value under saturation: on the CPU at 2x capacity
  a third of the admitted requests then missed their deadline.) Kept per class: a fast request
  with nothing fast ahead still waits for the step in progress, which a slow request's figure,
  or the average over classes, does not say; a class with no sample yet uses the backend's
  all-class figure.

Until a backend has `min_samples` paced gaps its term is ``service_b`` alone (it admits: no
evidence of a queue). Classes: the backends serve Fast first (their step scheduler uses the same
classes), so only requests of the same or a higher class count as ahead; a Slow request sees
every queue and is refused first as load rises, then Normal, then Fast — shedding by class,
gradually, with no extra rule.

A refusal carries the predicted TTFT as its retry-after: the wait the request would have had
(the time for the work ahead of it to start), which the gateway sends as `Retry-After` (whole
seconds, rounded up) and `retry-after-ms`.

The service is not one number per class: a request whose prompt is mostly in the backend's
prefix cache starts sooner, and a backend decoding many sequences runs slower steps. Each start
also records its uncached prompt tokens u and the backend's decoding sequences d at dispatch;
`scheduler.service_fit` fits the slopes of the service on u and d over the backend's recent
starts, and a prediction is ``class service + k_u (u - class mean u) + k_d (d - class mean d)``
(the class's figure alone while the slopes are unknown: u and d never varied). Placement
(`scheduler.ttft_placement`) compares backends by this prediction with each backend's own u.
`decoding(b)` is ``inflight(b) - unstarted there``: `inflight` is the owner's count of requests
on b not yet finished (the gateway's pool, the simulator's outstanding count).

Calibration: each start also compares its measured service with what was predicted for it at
dispatch (`started(..., predicted_s)`), per class, over the last `calibration_window` starts:
error = measured - predicted, in seconds, kept apart by how many requests were ahead of it
(none, 1-3, more: `AHEAD_BUCKETS`), as a queue's errors are larger than a lone start's and a
burst's should not be charged to the starts that follow it. Admission refuses a request unless its prediction
plus the `calibration_quantile` of those errors meets the deadline (a request admitted at a
prediction just under its deadline missed it whenever the prediction was low: 14.5% of the
accepted missed by > 10% on the CPU), and the Retry-After is the prediction plus their median
(the point estimate of the wait). Additive, not a ratio: the errors come from discrete events
(the step in progress, when a running sequence frees a slot) whose size does not scale with
the prediction; as ratios, a 20 ms prediction that waited 100 ms for a slot made every later
prediction five times longer (4 echo backends at 1.5x capacity: 62% of normal requests
refused with Retry-After p50 1.67x the wait they had). Both are 0 until a class has
`calibration_min_samples` errors. Errors older than `calibration_horizon_s` are dropped (at
each check): only admitted requests measure one, so a class whose every request a burst's
errors refused would otherwise keep those errors, and be refused, for good (seen in the
simulator: after a burst at 0.8x capacity every normal request was refused to the end).

`headroom(now)`: per backend and in total, 1 / gap_b (the start rate the SLOs can take) minus
the recent start rate: the extra requests/s before queues grow and deadlines start to fail.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from scheduler.classes import CLASS_NAMES
from scheduler.service_fit import ServiceFit
from scheduler.slo import NUM_CLASSES, SLOTargets


@dataclass(frozen=True)
class AdmissionConfig:
    slo: SLOTargets = field(default_factory=SLOTargets)
    gap_weight: float = 0.05      # EWMA weight of one paced gap (~20 starts of memory)
    service_weight: float = 0.1   # EWMA weight of one start's service time (module doc)
    min_samples: int = 8          # paced gaps before a backend's queue counts in predictions
    rate_window_s: float = 2.0    # time constant of the recent start rate (headroom)
    # the service fit's slopes are used once u / d spread this much (scheduler.service_fit)
    min_spread_tokens: float = 16.0
    min_spread_decoding: float = 1.0
    # calibration (module doc): measured - predicted service of the last starts per class
    calibration_quantile: float = 0.9
    calibration_window: int = 200
    calibration_min_samples: int = 20
    calibration_horizon_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("gap_weight", "service_weight"):
            w = getattr(self, name)
            if not 0 < w <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {w}")
        if self.min_samples < 1:
            raise ValueError(f"min_samples must be >= 1, got {self.min_samples}")
        if not self.rate_window_s > 0:
            raise ValueError(f"rate_window_s must be > 0, got {self.rate_window_s}")
        if not 0.5 <= self.calibration_quantile <= 1.0 or self.calibration_window < 1:
            raise ValueError("calibration_quantile must be in [0.5, 1], calibration_window >= 1")

    @property
    def enabled(self) -> bool:
        """Admission refuses only where some class has a TTFT deadline."""
        return self.slo.any_ttft


AHEAD_BUCKETS = 3  # calibration pools by requests ahead: none, 1-3, more


def pool(cls: int, ahead: int) -> int:
    return cls * AHEAD_BUCKETS + (0 if ahead <= 0 else 1 if ahead <= 3 else 2)


class Refusal(NamedTuple):
    queue_class: int
    predicted_ttft_s: float   # what it would have waited for its first token
    deadline_s: float         # its class's (or its own) TTFT target

    @property
    def retry_after_s(self) -> float:
        return self.predicted_ttft_s

    def message(self) -> str:
        return (f"The {CLASS_NAMES[self.queue_class]} class's time-to-first-token deadline "
                f"({self.deadline_s * 1000:.0f} ms) cannot be met: the predicted wait is "
                f"{self.predicted_ttft_s * 1000:.0f} ms. Retry after that long.")


class _Backend:
    __slots__ = (
        "class_d",
        "class_service",
        "class_u",
        "fit",
        "gap",
        "last_start",
        "num_gaps",
        "paced",
        "rate",
        "rate_t",
        "service",
        "unstarted",
    )

    def __init__(self, config: AdmissionConfig) -> None:
        self.unstarted = [0] * NUM_CLASSES  # sent here, no first token yet, by class
        self.gap = 0.0          # EWMA of paced gaps, s
        self.num_gaps = 0
        self.service = 0.0      # EWMA of the service time (module doc) over every class, s
        self.class_service = [0.0] * NUM_CLASSES  # the same per class (0: no sample yet)
        self.class_u = [0.0] * NUM_CLASSES  # the class's mean uncached tokens, same weights
        self.class_d = [0.0] * NUM_CLASSES  # ... and decoding sequences at dispatch
        self.fit = ServiceFit(config.service_weight, config.min_spread_tokens,
                              config.min_spread_decoding)
        self.last_start = -math.inf
        self.paced = False      # at the last start, another request here was still unstarted
        self.rate = 0.0         # decayed count of starts (rate = count / window)
        self.rate_t = 0.0


class WaitPredictor:
    """Per-backend queues and speeds as the gateway sees them; see the module doc."""

    def __init__(self, config: AdmissionConfig = AdmissionConfig()) -> None:
        self.config = config
        self.backends: dict[int, _Backend] = {}
        # the owner's count of requests on a backend not yet finished (module doc); None: 0
        self.inflight: Callable[[int], int] | None = None
        # calibration per class: recent measured - predicted errors (s) and their quantiles
        # per (class, requests ahead bucket): index cls * AHEAD_BUCKETS + ahead_bucket(ahead)
        pools = NUM_CLASSES * AHEAD_BUCKETS
        self.errors = [deque(maxlen=config.calibration_window) for _ in range(pools)]
        self.error_high = [0.0] * pools  # the calibration quantile (admission)
        self.error_mid = [0.0] * pools   # the median (Retry-After)
        self.num_errors = [0] * pools

    # ---- membership ------------------------------------------------------------------------
    def add_backend(self, b: int) -> None:
        self.backends[b] = _Backend(self.config)

    def remove_backend(self, b: int) -> None:
        self.backends.pop(b, None)

    # ---- events ----------------------------------------------------------------------------
    def dispatched(self, b: int, cls: int) -> int:
        """A class-`cls` request was sent to `b`. Returns how many requests of its class or a
        higher one were unstarted there (pass it back to `started`)."""
        be = self.backends.get(b)
        if be is None:  # a backend seen for the first time (it joined the pool)
            be = self.backends[b] = _Backend(self.config)
        ahead = sum(be.unstarted[: cls + 1])
        be.unstarted[cls] += 1
        return ahead

    def decoding(self, b: int) -> int:
        """Requests on `b` past their first token and not finished (0 without `inflight`)."""
        be = self.backends.get(b)
        if be is None or self.inflight is None:
            return 0
        return max(0, self.inflight(b) - sum(be.unstarted))

    def started(self, b: int, cls: int, now: float, service_s: float, ahead: int,
                uncached: int = 0, decoding: int = 0, predicted_s: float = 0.0) -> None:
        """Its first token arrived at `now`, `service_s` after it was sent, with `ahead`
        requests ahead of it then (`dispatched`'s answer), `uncached` of its prompt tokens not
        expected in the prefix cache, `decoding` sequences decoding there at dispatch, and
        `predicted_s` what `backend_ttft` predicted for it then (0: none; calibration)."""
        be = self.backends.get(b)
        if be is None:
            return
        cfg = self.config
        if predicted_s > 0.0:
            self._calibrate(pool(cls, ahead), service_s - predicted_s, now)
        if be.unstarted[cls] > 0:
            be.unstarted[cls] -= 1
        if be.paced and be.last_start > -math.inf:
            gap = now - be.last_start
            be.gap = gap if not be.num_gaps else be.gap + cfg.gap_weight * (gap - be.gap)
            be.num_gaps += 1
        if not ahead or be.num_gaps >= cfg.min_samples:
            residual = max(0.0, service_s - ahead * be.gap) if ahead else service_s
            w = cfg.service_weight
            be.service = residual if be.service == 0.0 else be.service + w * (residual - be.service)
            cs = be.class_service[cls]
            if cs == 0.0:
                be.class_service[cls] = residual
                be.class_u[cls], be.class_d[cls] = float(uncached), float(decoding)
            else:
                be.class_service[cls] = cs + w * (residual - cs)
                be.class_u[cls] += w * (uncached - be.class_u[cls])
                be.class_d[cls] += w * (decoding - be.class_d[cls])
            be.fit.add(uncached, decoding, residual)
        be.last_start = now
        be.paced = any(be.unstarted)
        be.rate = be.rate * math.exp(-(now - be.rate_t) / cfg.rate_window_s) + 1.0
        be.rate_t = now

    def _calibrate(self, cls: int, error: float, now: float) -> None:
        e = self.errors[cls]
        e.append((now, error))
        self.num_errors[cls] += 1
        # the quantiles are re-read every 8th sample: a sort of <= 200 floats, not per arrival
        if self.num_errors[cls] % 8 == 0:
            self._quantiles(cls)

    def _quantiles(self, cls: int) -> None:
        e = self.errors[cls]
        n = len(e)
        if n < self.config.calibration_min_samples:
            self.error_high[cls] = self.error_mid[cls] = 0.0
            return
        s = sorted(err for _, err in e)
        self.error_high[cls] = s[min(n - 1, int(self.config.calibration_quantile * n))]
        self.error_mid[cls] = s[n // 2]

    def expire(self, now: float) -> None:
        """Drop calibration errors older than the horizon (module doc)."""
        horizon = now - self.config.calibration_horizon_s
        for cls, e in enumerate(self.errors):
            if e and e[0][0] < horizon:
                while e and e[0][0] < horizon:
                    e.popleft()
                self._quantiles(cls)

    def pool_at(self, cls: int, b: int) -> int:
        """The calibration pool of a class-`cls` request sent to `b` now."""
        be = self.backends.get(b)
        return pool(cls, sum(be.unstarted[: cls + 1]) if be is not None else 0)

    def calibrated(self, cls: int, predicted_s: float, b: int = -1) -> float:
        """The point estimate of a class-`cls` wait predicted at `predicted_s` on `b`
        (Retry-After)."""
        return max(0.0, predicted_s + self.error_mid[self.pool_at(cls, b)])

    def gone(self, b: int, cls: int) -> None:
        """A request sent to `b` left before its first token (error, abort, refusal)."""
        be = self.backends.get(b)
        if be is not None and be.unstarted[cls] > 0:
            be.unstarted[cls] -= 1

    # ---- predictions -----------------------------------------------------------------------
    def known(self, b: int) -> bool:
        be = self.backends.get(b)
        return be is not None and be.num_gaps >= self.config.min_samples

    def capacity(self, b: int) -> float:
        """Starts per second `b` sustains under load (0 until measured)."""
        be = self.backends.get(b)
        if be is None or be.num_gaps < self.config.min_samples or be.gap <= 0:
            return 0.0
        return 1.0 / be.gap

    def backend_ttft(self, b: int, cls: int, uncached: int | None = None,
                     extra_ahead: int = 0, decoding: int | None = None) -> float:
        """Predicted dispatch -> first token of a class-`cls` request sent to `b` now, with
        `uncached` prompt tokens to prefill there (None: the class's mean), `extra_ahead`
        more requests ahead than were dispatched (placed earlier in the same window) and
        `decoding` sequences decoding there (None: `decoding(b)`)."""
        be = self.backends[b]
        service = self._service(be, cls, uncached, b, decoding)
        if be.num_gaps < self.config.min_samples:
            return service
        return (sum(be.unstarted[: cls + 1]) + extra_ahead) * be.gap + service

    def _service(self, be: _Backend, cls: int, uncached: int | None, b: int,
                 decoding: int | None) -> float:
        fit = be.fit
        cs = be.class_service[cls]
        if not cs:
            return be.service
        if not (fit.k_u or fit.k_d):
            return cs
        s = cs
        if uncached is not None:
            s += fit.k_u * (uncached - be.class_u[cls])
        if fit.k_d and (decoding is not None or self.inflight is not None):
            s += fit.k_d * ((self.decoding(b) if decoding is None else decoding) - be.class_d[cls])
        return max(0.0, s)

    def predict(self, cls: int, gateway_ahead: int, window_s: float,
                live: Iterable[int] | None = None) -> tuple[float, int]:
        """(predicted TTFT in seconds, the backend it would best go to; (window_s, -1) with no
        backend). Backends at their in-flight cap count too: the gateway holds the request
        until one has room, which is part of the wait predicted. `live`: the backends to consider
        (the gateway's healthy ones; None: every backend seen). Its prompt's prefill counts as
        its class's mean: where it goes, and so what is cached, is decided at the flush."""
        best, best_t = -1, math.inf
        total_capacity = 0.0
        for b in self.backends if live is None else live:
            if b not in self.backends:
                continue
            t = self.backend_ttft(b, cls)
            if t < best_t:
                best, best_t = b, t
            total_capacity += self.capacity(b)
        if best < 0:
            return window_s, -1
        queued = gateway_ahead / total_capacity if gateway_ahead and total_capacity else 0.0
        return window_s + queued + best_t, best

    def recent_rate(self, b: int, now: float) -> float:
        be = self.backends[b]
        w = self.config.rate_window_s
        return be.rate * math.exp(-max(0.0, now - be.rate_t) / w) / w

    def headroom(self, now: float) -> dict[int, float]:
        """Per backend: capacity minus the recent start rate, requests/s (0 until measured)."""
        return {b: max(0.0, self.capacity(b) - self.recent_rate(b, now)) if self.known(b) else 0.0
                for b in self.backends}


class AdmissionControl:
    """The admission rule over a `WaitPredictor`: refuse a request whose predicted TTFT passes
    its deadline. `check` is what the gateway's dispatcher and the simulator's gateway call."""

    def __init__(self, config: AdmissionConfig = AdmissionConfig(),
                 predictor: WaitPredictor | None = None) -> None:
        self.config = config
        self.predictor = predictor or WaitPredictor(config)
        self.num_refused = [0] * NUM_CLASSES
        self.num_admitted = [0] * NUM_CLASSES
        # the last check's predicted TTFT and calibration margin (s; None: no deadline), which
        # the decision logs record beside each arrival (simulator vs live, input by input)
        self.last_predicted_s: float | None = None
        self.last_margin_s = 0.0

    def check(self, cls: int, gateway_depths: list[int] | tuple[int, ...], window_s: float,
              ttft_override_ms: float | None = None, live: Iterable[int] | None = None,
              now: float | None = None) -> Refusal | None:
        """None to admit; a Refusal (with the predicted TTFT) to answer 429 now.
        `gateway_depths`: requests queued in the gateway per class; `window_s`: how long the
        batching window would hold this request (`DynamicWindowBatcher.predicted_wait`)."""
        deadline = self.config.slo.ttft_s(cls, ttft_override_ms)
        if deadline is None:
            self.num_admitted[cls] += 1
            self.last_predicted_s = None
            return None
        pred = self.predictor
        if now is not None:
            pred.expire(now)
        ttft, b = pred.predict(cls, sum(gateway_depths[: cls + 1]), window_s, live)
        k = pred.pool_at(cls, b)
        self.last_predicted_s, self.last_margin_s = ttft, pred.error_high[k]
        if ttft + pred.error_high[k] > deadline:
            self.num_refused[cls] += 1
            return Refusal(cls, max(0.0, ttft + pred.error_mid[k]), deadline)
        self.num_admitted[cls] += 1
        return None
