"""The batching path: ClassQueues + DynamicWindowBatcher on the wall clock, with ONE timer.

    submit(handle) ─► batcher.push ─► Decision ─┬─ flush_now ─► take_batch ─► pool.send_batch
                                                └─ deadline ──► loop.call_at(...) ─► poll()

Other wake-ups: a backend reports spare capacity (`on_idle`: idle flush), a request finishes
(`on_capacity`: a held flush may go now), a queued request is cancelled. A flush is held while
no healthy backend has a free slot (`PoolConfig.max_inflight_per_backend`), so under overload
requests wait in the class queues (where Fast goes first and 429 protects memory) rather than
in a backend. With no healthy backend at all, due requests fail with 503 instead of waiting.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from gateway.backend_pool import BackendPool, Dispatch, RequestSink
from gateway.errors import (
    bad_request,
    deadline_exceeded,
    internal_error,
    queue_full,
    slo_unattainable,
    unavailable,
)
from gateway.prometheus_metrics import GatewayMetrics
from proto import tidegate_pb2 as pb
from scheduler.admission import AdmissionConfig, AdmissionControl
from scheduler.batcher import BatcherConfig, DynamicWindowBatcher
from scheduler.classes import CLASS_NAMES
from scheduler.clock import Clock, WallClock
from scheduler.decisions import DecisionLog
from scheduler.queues import ClassQueues, PendingRequest, QueueConfig

log = logging.getLogger("tidegate.gateway.dispatch")


class QueuedRequest(RequestSink, Protocol):
    """What the dispatcher reads of a request (implemented by `gateway.core.RequestHandle`);
    a protocol, so that the dispatcher does not import the core that owns it."""

    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    arrival_time: float
    priority: int
    queue_deadline: float | None
    queue_class: int
    dispatched_at: float | None
    slo_ttft_ms: float | None  # its own TTFT target (None: its class's)
    # (backend id, class, requests unstarted ahead of it there, its uncached prompt tokens there,
    # sequences decoding there, its predicted dispatch -> first token) while sent and without a
    # first token: what the wait predictor counts as unstarted on that backend, fits its service
    # on and calibrates its predictions with (scheduler.admission)
    unstarted: tuple[int, int, int, int, int, float] | None

    def wire_sampling(self) -> pb.SamplingParams: ...

    def on_dispatched(self, now: float, backend: str) -> None: ...


class Dispatcher:
    def __init__(self, pool: BackendPool, metrics: GatewayMetrics,
                 batcher_config: BatcherConfig | None = None,
                 queue_config: QueueConfig | None = None, clock: Clock | None = None,
                 decision_log: DecisionLog | None = None,
                 admission_config: AdmissionConfig | None = None) -> None:
        self.pool = pool
        # opt-in record of arrivals and flushed windows (scheduler.decisions); None: off
        self.decision_log = decision_log
        self.metrics = metrics
        self.clock = clock or WallClock()
        self.queues = ClassQueues(queue_config or QueueConfig())
        self.batcher = DynamicWindowBatcher(batcher_config or BatcherConfig(), self.clock,
                                            self.queues)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_deadline: float | None = None
        # predicts each request's wait (always: headroom and Retry-After); refuses by it only
        # where a class has a TTFT deadline
        self.admission = AdmissionControl(admission_config or AdmissionConfig())
        self.predictor = self.admission.predictor
        self.predictor.clock = self.clock.now  # the slot model's times (scheduler.admission)
        by_pid = getattr(pool, "_by_pid", None)
        if by_pid is not None:  # decode load: the pool's requests on a backend, not finished
            self.predictor.inflight = lambda b: (by_pid[b].num_inflight if b in by_pid else 0)
        placement = getattr(pool, "placement", None)
        if hasattr(placement, "predictor"):  # placement by predicted TTFT: the same predictor
            placement.predictor = self.predictor

    # --- events ---------------------------------------------------------------------------------
    def submit(self, handle: QueuedRequest) -> None:
        """Queue a request, or raise APIError(429) when its class queue is full."""
        batcher = self.batcher
        if batcher.queues.size:
            # A window past its deadline (its timer is late: the loop was busy, by up to 69 ms
            # measured at load average 8 on 2 cores) leaves first, without this request, as it
            # did at its deadline in the simulator; otherwise late arrivals joined it (issue 18).
            dec = batcher.poll()
            if dec.flush_now:
                self._act(True, dec.deadline)
        if not batcher.queues.size and self.pool.has_idle_backend():
            # Idle flush without waiting for a LoadReport: a backend holding none of our
            # requests has spare capacity (as far as this gateway can know), so a lone request
            # goes out at once instead of on the batching window's timer.
            batcher.notify_idle(True)
        # The batcher's arrival is now, the push (scheduler.queues: "the gateway stamps
        # arrival_time when it pushes"), not the handle's HTTP stamp: that one precedes the push
        # by the handle's set-up (~0.2 ms on a loaded CPU, more than a lone request's 0.16 ms
        # window), so a window opened at it was due before it was pushed, and windows came out
        # otherwise than the simulator's, which pushes at the arrival (issue 18). The handle's
        # own stamp still measures the request's latency and goes on the wire. Stamped right
        # before the push (the log's write comes after it), so that the batcher decides at
        # about the instant the log records.
        now = self.clock.now()
        cls = self.queues.config.classify(handle.max_tokens)
        handle.queue_class = int(cls)
        if self.admission.config.enabled:  # refuse now what cannot meet its TTFT deadline
            refusal = self.admission.check(int(cls), self._depths(),
                                           batcher.predicted_wait(now), handle.slo_ttft_ms,
                                           self._live_backends(), now)
            if refusal is not None:
                if self.decision_log is not None:
                    self.decision_log.arrival(handle.request_id, now, len(handle.prompt_ids),
                                              handle.max_tokens, int(cls), handle.arrival_time,
                                              refused=True, slo_ttft_ms=handle.slo_ttft_ms,
                                              **self._logged_prediction())
                self.metrics.observe_refusal(CLASS_NAMES[int(cls)], refusal.predicted_ttft_s)
                raise slo_unattainable(refusal.message(), refusal.retry_after_s)
        req = PendingRequest(
            request_id=handle.request_id, num_prompt_tokens=len(handle.prompt_ids),
            max_tokens=handle.max_tokens, arrival_time=now, queue_class=cls,
            priority=handle.priority, deadline=handle.queue_deadline, payload=handle)
        dec = batcher.push(req)
        if self.decision_log is not None:
            self.decision_log.arrival(req.request_id, req.arrival_time, req.num_prompt_tokens,
                                      req.max_tokens, req.queue_class, handle.arrival_time,
                                      slo_ttft_ms=getattr(handle, "slo_ttft_ms", None),
                                      **self._logged_prediction())
        if dec.rejected is not None:
            # the wait it would have had, as admission predicts it (not a constant)
            wait, b = self.predictor.predict(int(cls), sum(self._depths()[: int(cls) + 1]),
                                             batcher.predicted_wait(now), self._live_backends())
            raise queue_full(CLASS_NAMES[int(req.queue_class)],
                             self.predictor.calibrated(int(cls), wait, b))
        self._act(dec.flush_now, dec.deadline)

    def _logged_prediction(self) -> dict:
        """Admission's prediction for the arrival just checked, for the decision log (ms)."""
        adm = self.admission
        if not adm.config.enabled or adm.last_predicted_s is None:
            return {}
        return {"predicted_ms": adm.last_predicted_s * 1e3, "margin_ms": adm.last_margin_s * 1e3}

    def _live_backends(self) -> list[int]:
        """The backends a prediction may count on: healthy, not draining (a removed or dead
        backend's last figures must not make the wait look short)."""
        return [b.pid for b in self.pool.healthy_backends() if not getattr(b, "draining", False)]

    def _depths(self) -> list[int]:
        depth = self.queues.depth
        return [depth(c) for c in range(len(CLASS_NAMES))]

    # --- what the wait predictor counts (scheduler.admission) -----------------------------------
    def on_backend_info(self, b: int, info: pb.BackendInfo) -> None:
        """Backend `b` introduced itself (again, after a restart: its settings may have
        changed): the slot model counts on its max_num_seqs from now (0: unknown)."""
        self.predictor.set_slots(b, info.max_num_seqs)

    def on_first_token(self, handle: QueuedRequest, now: float) -> None:
        """`handle`'s first token arrived: it has started on its backend."""
        b, cls, ahead, uncached, decoding, predicted = handle.unstarted
        handle.unstarted = None
        handle.started_on = b
        self.predictor.started(b, cls, now, now - (handle.dispatched_at or now), ahead, uncached,
                               decoding, predicted, handle.request_id)

    def on_gone(self, handle: QueuedRequest) -> None:
        """`handle` left its backend before a first token (error, abort)."""
        b, cls = handle.unstarted[:2]
        handle.unstarted = None
        self.predictor.gone(b, cls, handle.request_id)

    def on_finished(self, handle: QueuedRequest, now: float, num_tokens: int) -> None:
        """`handle`, started, ended: finished at `now` after `num_tokens` tokens (0: an error
        or an abort ended it); its slot there is free (the slot model)."""
        b, handle.started_on = handle.started_on, None
        if b is not None:
            self.predictor.finished(b, handle.request_id, now, num_tokens)

    def cancel(self, request_id: str) -> bool:
        """Take a queued request out; False when it was not queued (already sent or done)."""
        if self.batcher.cancel(request_id) is None:
            return False
        self._poll()
        return True

    def on_idle(self) -> None:
        dec = self.batcher.notify_idle(True)
        self._act(dec.flush_now, dec.deadline)

    def on_capacity(self) -> None:
        if self.queues.size:
            self._poll()

    def close(self) -> None:
        if self.decision_log is not None:
            self.decision_log.close()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def depth_and_age(self) -> tuple[dict[str, int], dict[str, float]]:
        now = self.clock.now()
        depth, age = {}, {}
        for cls, name in enumerate(CLASS_NAMES):
            depth[name] = self.queues.depth(cls)
            oldest = self.queues.oldest_arrival(cls)
            age[name] = 0.0 if oldest is None else now - oldest
        return depth, age

    # --- the loop body --------------------------------------------------------------------------
    def _poll(self) -> None:
        dec = self.batcher.poll()
        self._act(dec.flush_now, dec.deadline)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_deadline = None
        self._poll()

    def _act(self, flush_now: bool, deadline: float | None) -> None:
        while flush_now:
            if not self.pool.healthy_backends():
                self._fail_due()
                break
            if self.pool.free_slots() <= 0:
                deadline = self.queues.next_expiry()  # held: only expiry needs the timer now
                break
            batch = self.batcher.take_batch()
            if self.decision_log is not None and batch:
                # the batcher's decision, before placement (a request that then fails to go on
                # the wire was still in this window)
                self.decision_log.batch(self.clock.now(), [r.request_id for r in batch],
                                        [r.queue_class for r in batch])
            self._send(batch)
            dec = self.batcher.poll()
            flush_now, deadline = dec.flush_now, dec.deadline
        for req in self.batcher.take_expired():
            self.metrics.observe_request(504, CLASS_NAMES[int(req.queue_class)])
            req.payload.on_error(deadline_exceeded())
        self._arm(deadline)

    def _fail_due(self) -> None:
        """No healthy backend: everything queued fails now (503) rather than waiting."""
        while self.queues.size:
            for req in self.batcher.take_batch():
                req.payload.on_error(unavailable())

    def _send(self, batch: list[PendingRequest]) -> None:
        """Send one flushed window. The requests have left the queues already, so every one of
        them is either in flight afterwards or failed: a request that cannot be put on the wire
        fails alone, and a bug here fails the window rather than losing it."""
        if not batch:
            return
        try:
            self._send_window(batch)
        except Exception:
            log.exception("sending a batch failed")
            for r in batch:
                if r.payload.dispatched_at is None:
                    r.payload.on_error(internal_error("The request could not be dispatched."))

    def _send_window(self, batch: list[PendingRequest]) -> None:
        """Place the window over the backends (`PoolConfig.placement`): one Batch per backend
        that got requests."""
        now = self.clock.now()
        items = []
        adm = self.admission.config
        deadline_order, slo = adm.send_deadlines, adm.slo
        for r in batch:
            try:
                sampling = r.payload.wire_sampling()
            except (ValueError, TypeError, OverflowError) as exc:
                r.payload.on_error(bad_request(f"Sampling parameters do not fit the wire: {exc}",
                                               None))
                continue
            d = Dispatch(r.request_id, r.payload.prompt_ids, sampling, int(r.queue_class),
                         r.priority, r.payload.arrival_time, r.payload)
            if deadline_order:  # the backend starts it first once its deadline is near
                ttft = slo.ttft_s(int(r.queue_class), getattr(r.payload, "slo_ttft_ms", None))
                if ttft is not None:
                    d.deadline = r.payload.arrival_time + ttft
            prediction = getattr(r.payload, "prediction_ids", None)
            if prediction is not None:
                d.prediction_ids = prediction
            speculation = getattr(r.payload, "wire_speculation", None)
            if speculation is not None:
                d.speculation = speculation()
            items.append(d)
        if not items:
            return
        parts, unplaced = self.pool.place(items, now)
        for backend, part in parts:
            # the decode load there before these are in flight (a stand-in pool's backend: none)
            pid = getattr(backend, "pid", None)
            decoding = 0 if pid is None else self.predictor.decoding(pid)
            sent = self.pool.send_batch(backend, part)
            if sent is None:
                unplaced.extend(part)
                continue
            predictor = self.predictor
            for d in sent:
                d.sink.on_dispatched(now, backend.address)
                if getattr(d.sink, "unstarted", False) is None:  # a sink that counts starts
                    # its prompt tokens not expected cached there: the charge less its outputs
                    uncached = max(0, getattr(d, "charged_left", 0) - d.sampling.max_tokens)
                    cls = d.queue_class
                    predicted = (predictor.backend_ttft(backend.pid, cls, uncached, 0, decoding)
                                 if backend.pid in predictor.backends else 0.0)
                    ahead = predictor.dispatched(backend.pid, cls, d.request_id,
                                                 d.sampling.max_tokens)
                    d.sink.unstarted = (backend.pid, cls, ahead, uncached, decoding, predicted)
            if sent:
                self.metrics.observe_batch(len(sent), [now - d.arrival_time for d in sent],
                                           backend.address)
        for d in unplaced:
            d.sink.on_error(unavailable("Could not send the request to a backend."))

    def _arm(self, deadline: float | None) -> None:
        if deadline == self._timer_deadline and self._timer is not None:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_deadline = deadline
        if deadline is None:
            return
        loop = asyncio.get_running_loop()
        delay = max(0.0, deadline - self.clock.now())
        self._timer = loop.call_at(loop.time() + delay, self._on_timer)
