"""Prometheus metrics of one gateway app, in its own `CollectorRegistry`.

Our series are `tidegate_*`; the ones routers scrape from vLLM are mirrored under vLLM's
names (`vllm:*`, labelled `model_name` and `engine`: `gateway.vllm_metrics`) so a vLLM-aware
router can scrape us unchanged.
Gauges that describe current state (queues, backend load) are refreshed at scrape time by
`refresh()`, so they are never stale and cost nothing between scrapes.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
from bisect import bisect_left
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

from gateway.gie_metrics import GieMetrics, pod_totals
from gateway.vllm_metrics import EngineReport, VllmMetrics
from scheduler.classes import CLASS_NAMES
from scheduler.slo import SLOTargets

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                   1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
               0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 96, 128)


@dataclass(frozen=True, slots=True)
class BackendLoad:
    """One backend's last load report, as the metrics see it."""

    address: str
    healthy: bool
    num_running: int
    num_waiting: int
    kv_cache_usage: float  # 0..1
    outstanding_tokens: int
    held_messages: int = 0  # the backend's back-pressure: messages that waited for room
    dropped_peers: int = 0  # peers it dropped (gone or not reading) with their requests
    draining: bool = False
    preemptions: int = 0  # cumulative, as it reports
    swap_preemptions: int = 0  # of which swapped to its host KV tier
    host_hit_tokens: int = 0  # prompt tokens found in its host KV tier
    host_kv_usage: float = 0.0  # 0..1 of its host tier (0 without one)


def SLOConfig(ttft_ms: float | str | None = None, tpot_ms: float | str | None = None
              ) -> SLOTargets:
    """The targets of every class at once (or per class, 'fast=200,slow=4000'): scheduler.slo."""
    return SLOTargets.parse(ttft_ms, tpot_ms)


FOLD_EVERY = 1024  # records kept before they are folded into the series between scrapes


class _Hist:
    """Bucket counts and a sum gathered for one or more histogram series with the same buckets
    (added to the series in one increment per non-empty bucket by `flush_to`)."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, like: Histogram) -> None:
        self.bounds = like._upper_bounds  # sorted, +Inf last
        self.counts = [0] * len(self.bounds)
        self.total = 0.0

    def add(self, x: float) -> None:
        self.counts[bisect_left(self.bounds, x)] += 1  # the first bound >= x: observe()'s rule
        self.total += x

    def extend(self, xs) -> None:
        bounds, counts = self.bounds, self.counts
        for x in xs:
            counts[bisect_left(bounds, x)] += 1
            self.total += x

    def flush_to(self, *series: Histogram) -> None:
        if not any(self.counts):
            return
        for h in series:
            h._raise_if_not_observable()
            h._sum.inc(self.total)
            for i, n in enumerate(self.counts):
                if n:
                    h._buckets[i].inc(n)


class _EngineFold:
    """One engine's share of a fold of finished requests."""

    __slots__ = ("e2e", "gen", "itl", "prompt", "reasons", "tpot", "ttft")

    def __init__(self, m: GatewayMetrics) -> None:
        self.e2e, self.ttft, self.itl = _Hist(m.e2e), _Hist(m.ttft), _Hist(m.itl)
        self.tpot = _Hist(m.vllm.tpot)
        self.prompt = self.gen = 0
        self.reasons: dict[str, int] = {}


class GatewayMetrics:
    def __init__(self, model_name: str, slo: SLOTargets | None = None) -> None:
        self.registry = CollectorRegistry()
        self._model_name = model_name
        # events not folded into the series yet (see fold())
        self._request_counts: dict[tuple[int, str], int] = {}
        self._batches: list[tuple[int, list[float], str]] = []
        self._finished: list[tuple] = []
        self.slo = slo if slo is not None else SLOTargets()
        r = self.registry
        self.requests = Counter("tidegate_requests", "Finished HTTP/ZMQ requests by status and "
                                "queue class.", ["status", "queue_class"], registry=r)
        self.queue_depth = Gauge("tidegate_queue_depth", "Requests waiting in the gateway's class "
                                 "queues.", ["queue_class"], registry=r)
        self.queue_age = Gauge("tidegate_queue_oldest_age_seconds", "Age of the oldest request in "
                               "each class queue.", ["queue_class"], registry=r)
        self.batch_size = Histogram("tidegate_batch_size", "Requests per Batch sent to a backend.",
                                    buckets=BATCH_BUCKETS, registry=r)
        self.batches = Counter("tidegate_batches", "Batches sent to backends.", registry=r)
        self.queue_time = Histogram("tidegate_queue_time_seconds", "Time from arrival to dispatch.",
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("tidegate_time_to_first_token_seconds", "Time to first token.",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("tidegate_inter_token_latency_seconds", "Time between output tokens.",
                             buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram("tidegate_e2e_request_latency_seconds", "End-to-end request latency.",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("tidegate_prompt_tokens", "Prompt tokens.", registry=r)
        self.generation_tokens = Counter("tidegate_generation_tokens", "Generated tokens.",
                                         registry=r)
        self.slo_met = Counter("tidegate_goodput_requests", "Successful requests that met the "
                               "TTFT and TPOT SLOs.", registry=r)
        self.slo_total = Counter("tidegate_slo_evaluated_requests", "Successful requests checked "
                                 "against the SLOs.", registry=r)
        self.goodput = Gauge("tidegate_goodput_ratio", "Share of successful requests that met the "
                             "SLOs (1 when none finished yet).", registry=r)
        # per class (scheduler.slo, scheduler.admission)
        self.slo_attained = Counter("tidegate_slo_attained_requests", "Successful requests that "
                                    "met their class's (or their own) TTFT and TPOT targets.",
                                    ["queue_class"], registry=r)
        self.slo_checked = Counter("tidegate_slo_checked_requests", "Successful requests checked "
                                   "against their class's targets.", ["queue_class"], registry=r)
        self.slo_attainment = Gauge("tidegate_slo_attainment_ratio", "Share of a class's "
                                    "successful requests that met its targets (1 when none yet).",
                                    ["queue_class"], registry=r)
        self.slo_refused = Counter("tidegate_admission_refused_requests", "Requests refused at "
                                   "once (429) because their predicted TTFT passed their "
                                   "deadline.", ["queue_class"], registry=r)
        self.predicted_ttft = Histogram("tidegate_refused_predicted_ttft_seconds", "The predicted "
                                        "TTFT of refused requests (their Retry-After).",
                                        buckets=LATENCY_BUCKETS, registry=r)
        self.headroom = Gauge("tidegate_slo_headroom_requests_per_second", "Extra requests/s a "
                              "backend can start before its queue grows and TTFT deadlines start "
                              "to fail: its measured start capacity under load minus its recent "
                              "start rate (0 until measured); backend=\"total\" sums them.",
                              ["backend"], registry=r)
        self.window_mean = Gauge("tidegate_window_size_mean", "Mean requests per flushed "
                                 "batching window since start (the batcher's own count).",
                                 registry=r)
        self._class_met = [0] * len(CLASS_NAMES)
        self._class_checked = [0] * len(CLASS_NAMES)
        self.backend_draining = Gauge("tidegate_backend_draining", "1 while the backend takes no "
                                      "new requests and leaves after its last one.", ["backend"],
                                      registry=r)
        self._backend_addresses: set[str] = set()
        self.backend_up = Gauge("tidegate_backend_healthy", "1 while the backend answers within "
                                "the heartbeat window.", ["backend"], registry=r)
        self.backend_running = Gauge("tidegate_backend_num_requests_running", "Requests running "
                                     "on the backend.", ["backend"], registry=r)
        self.backend_waiting = Gauge("tidegate_backend_num_requests_waiting", "Requests waiting "
                                     "on the backend.", ["backend"], registry=r)
        self.backend_kv = Gauge("tidegate_backend_kv_cache_usage_perc", "KV-cache usage (0..1).",
                                ["backend"], registry=r)
        self.backend_outstanding = Gauge("tidegate_backend_outstanding_tokens", "Tokens the "
                                         "gateway still expects from the backend.", ["backend"],
                                         registry=r)
        self.dropped_frames = Counter("tidegate_dropped_frames", "Malformed ZMQ messages dropped.",
                                      ["socket"], registry=r)
        self.retried = Counter("tidegate_retried_requests", "Requests re-dispatched to another "
                               "backend after theirs died before producing a token.", registry=r)
        self.unsent_aborts = Gauge("tidegate_unsent_aborts", "Aborts waiting for room in their "
                                   "backend's socket (re-sent until queued).", registry=r)
        self.backend_held = Gauge("tidegate_backend_held_messages", "Messages the backend held "
                                  "for a full peer queue (cumulative, as it reports).",
                                  ["backend"], registry=r)
        self.backend_dropped_peers = Gauge("tidegate_backend_dropped_peers", "Peers the backend "
                                           "dropped with their requests (cumulative).",
                                           ["backend"], registry=r)
        self.backend_preemptions = Gauge("tidegate_backend_preemptions", "Sequences the backend "
                                         "preempted (cumulative, as it reports), by how: "
                                         "recompute or swap (to its host KV tier).",
                                         ["backend", "mode"], registry=r)
        self.backend_host_hits = Gauge("tidegate_backend_host_kv_hit_tokens", "Prompt tokens "
                                       "found in the backend's host KV tier (cumulative).",
                                       ["backend"], registry=r)
        self.backend_host_kv = Gauge("tidegate_backend_host_kv_usage_perc", "Host KV tier usage "
                                     "(0..1; 0 without a tier).", ["backend"], registry=r)
        self.loop_tasks = Gauge("tidegate_event_loop_tasks", "asyncio tasks alive in the gateway "
                                "process (a leak shows as growth; see bench/reliability/soak.py).",
                                registry=r)
        # RSS, open file descriptors, CPU of this process (Linux), for the same reason.
        ProcessCollector(registry=r)
        self.frontdoor_open = Gauge("tidegate_frontdoor_open_requests", "Requests the ZMQ front "
                                    "door is serving (each has one forwarding task).", registry=r)
        self.frontdoor_backpressure = Counter("tidegate_frontdoor_backpressure", "Front-door "
                                              "messages held because a client's queue was full.",
                                              registry=r)
        self.frontdoor_dropped_clients = Counter("tidegate_frontdoor_dropped_clients", "Clients "
                                                 "whose requests were aborted because they left "
                                                 "or stopped reading.", ["reason"], registry=r)
        # vLLM's names, per engine (backend), for routers that scrape vLLM
        self.vllm = VllmMetrics(r, LATENCY_BUCKETS, ITL_BUCKETS)
        # speculative decoding by request: "prediction" (requests with a Predicted Output) or
        # "auto" (drafts the engine found alone: prompt lookup, the session's earlier output);
        # by draft source the backend reports: vllm:spec_decode_*{source}
        self.spec_drafts = Counter("tidegate_spec_decode_num_drafts", "Drafts verified (one "
                                   "sequence's draft tokens in one step), by source.",
                                   ["source"], registry=r)
        self.spec_draft_tokens = Counter("tidegate_spec_decode_num_draft_tokens", "Draft tokens "
                                         "verified, by source.", ["source"], registry=r)
        self.spec_accepted_tokens = Counter("tidegate_spec_decode_num_accepted_tokens", "Draft "
                                            "tokens accepted, by source.", ["source"], registry=r)
        self.prediction_tokens = Counter("tidegate_prediction_tokens", "Predicted Outputs: the "
                                         "predictions' tokens the outputs used (accepted) or not "
                                         "(rejected).", ["outcome"], registry=r)
        # agent sessions and prefix pins (issue 30: scheduler.sessions, gateway.sessions)
        self.session_requests = Gauge("tidegate_session_requests", "Requests placed as part of a "
                                      "known session (a key, or a prompt extending an earlier "
                                      "one), by outcome: stayed on the session's backend, or "
                                      "moved (it had no slack) (cumulative).", ["outcome"],
                                      registry=r)
        self.sessions_known = Gauge("tidegate_sessions", "Sessions the placement remembers, by "
                                    "kind: key (a session key) or prompt (last prompts).",
                                    ["kind"], registry=r)
        self.pin_requests = Counter("tidegate_pin_requests", "Requests that asked for a pin, by "
                                    "outcome: pinned, over_budget (served unpinned), "
                                    "unsupported.", ["outcome"], registry=r)
        self.backend_pins = Gauge("tidegate_backend_pins", "Live prefix pins on the backend.",
                                  ["backend"], registry=r)
        self.backend_pinned_blocks = Gauge("tidegate_backend_pinned_blocks", "KV blocks held by "
                                           "pins, and the pin budget.", ["backend", "kind"],
                                           registry=r)
        self.backend_pin_events = Gauge("tidegate_backend_pin_events", "Pins refused over the "
                                        "budget and pins expired (cumulative, as it reports).",
                                        ["backend", "event"], registry=r)
        self.gie = GieMetrics(r)  # the pod's totals, as GIE's endpoint picker reads them
        self.goodput.set(1.0)
        self._num_met = self._num_evaluated = 0
        for cls in CLASS_NAMES:
            self.queue_depth.labels(cls).set(0)
            self.queue_age.labels(cls).set(0)
            self.slo_attainment.labels(cls).set(1.0)

    # --- events: recorded as plain tuples, folded into the Prometheus series in bulk --------
    # A Prometheus observe() is a lock, a linear bucket scan and two value updates; a 1-token
    # request made ~25 of them. The hot path now appends one tuple; `fold()` (at every scrape,
    # and every FOLD_EVERY records) turns the records into a few bulk increments per series.
    @property
    def model_name(self) -> str:
        return self._model_name

    @model_name.setter
    def model_name(self, name: str) -> None:
        if name != self._model_name:
            self.fold()  # what was recorded so far belongs to the old name
            self._model_name = name

    def observe_batch(self, size: int, queue_times: list[float], engine: str = "") -> None:
        self._batches.append((size, queue_times, engine))
        if len(self._batches) >= FOLD_EVERY:
            self.fold()

    def observe_request(self, status: int, queue_class: str) -> None:
        key = (status, queue_class)
        counts = self._request_counts
        counts[key] = counts.get(key, 0) + 1

    def observe_finished(self, *, num_prompt_tokens: int, token_times: list[float],
                         arrival: float, finished: float, finish_reason: str,
                         engine: str = "", queue_class: int = 0,
                         slo_ms: tuple[float | None, float | None] = (None, None)) -> None:
        """A successful request: `token_times` are the arrival times of its output tokens
        (kept, not copied: the caller must not change the list afterwards); `engine` is the
        backend that served it; `slo_ms` its own (TTFT, TPOT) targets, None: its class's."""
        self._finished.append((num_prompt_tokens, token_times, arrival, finished, finish_reason,
                               engine, queue_class, slo_ms))
        if len(self._finished) >= FOLD_EVERY:
            self.fold()

    def observe_speculation(self, engine: str, source: str, drafts: int, draft_tokens: int,
                            accepted_tokens: int, accepted_prediction: int,
                            rejected_prediction: int, engine_reports_sources: bool = False,
                            ) -> None:
        """One request's speculation, when it ends (the backend's cumulative counters). vLLM's
        series come from the backend's LoadReports by draft source where it reports them
        (`engine_reports_sources`), else from here (source "unknown")."""
        if draft_tokens:
            if not engine_reports_sources:
                self.vllm.observe_request((self._model_name, engine), drafts, draft_tokens,
                                          accepted_tokens)
            self.spec_drafts.labels(source).inc(drafts)
            self.spec_draft_tokens.labels(source).inc(draft_tokens)
            self.spec_accepted_tokens.labels(source).inc(accepted_tokens)
        if accepted_prediction:
            self.prediction_tokens.labels("accepted").inc(accepted_prediction)
        if rejected_prediction:
            self.prediction_tokens.labels("rejected").inc(rejected_prediction)

    def fold(self) -> None:
        """Move the recorded events into the Prometheus series."""
        m = self._model_name
        if self._request_counts:
            counts, self._request_counts = self._request_counts, {}
            for (status, cls), n in counts.items():
                self.requests.labels(str(status), cls).inc(n)
        if self._batches:
            batches, self._batches = self._batches, []
            sizes = _Hist(self.batch_size)
            queue = _Hist(self.queue_time)
            per_engine: dict[str, _Hist] = {}
            for size, queue_times, engine in batches:
                sizes.add(size)
                queue.extend(queue_times)
                h = per_engine.get(engine)
                if h is None:
                    h = per_engine[engine] = _Hist(self.queue_time)
                h.extend(queue_times)
            self.batches.inc(len(batches))
            sizes.flush_to(self.batch_size)
            queue.flush_to(self.queue_time)
            for engine, h in per_engine.items():
                h.flush_to(self.vllm.queue.labels(m, engine))
        if self._finished:
            self._fold_finished(m)

    def _fold_finished(self, m: str) -> None:
        finished, self._finished = self._finished, []
        e2e, ttft, itl = _Hist(self.e2e), _Hist(self.ttft), _Hist(self.itl)
        v = self.vllm
        engines: dict[str, _EngineFold] = {}
        prompt = gen = 0
        met = 0
        slo = self.slo
        class_met = [0] * len(CLASS_NAMES)
        class_checked = [0] * len(CLASS_NAMES)
        for num_prompt, times, arrival, end, reason, engine, cls, own in finished:
            f = engines.get(engine)
            if f is None:
                f = engines[engine] = _EngineFold(self)
            latency = end - arrival
            e2e.add(latency)
            f.e2e.add(latency)
            prompt += num_prompt
            f.prompt += num_prompt
            n = len(times)
            gen += n
            f.gen += n
            f.reasons[reason] = f.reasons.get(reason, 0) + 1
            first = times[0] - arrival if n else None
            if first is not None:
                ttft.add(first)
                f.ttft.add(first)
            per_token = None
            if n > 1:
                gaps = [b - a for a, b in itertools.pairwise(times)]
                itl.extend(gaps)
                f.itl.extend(gaps)
                per_token = (times[-1] - times[0]) / (n - 1)
                f.tpot.add(per_token)
            class_checked[cls] += 1
            if slo.met(cls, first, per_token, own[0], own[1]):
                met += 1
                class_met[cls] += 1
        e2e.flush_to(self.e2e)
        ttft.flush_to(self.ttft)
        itl.flush_to(self.itl)
        for engine, f in engines.items():
            labels = (m, engine)
            f.e2e.flush_to(v.e2e.labels(*labels))
            f.ttft.flush_to(v.ttft.labels(*labels))
            f.itl.flush_to(v.itl.labels(*labels))
            f.tpot.flush_to(v.tpot.labels(*labels))
            v.prompt_tokens.labels(*labels).inc(f.prompt)
            v.generation_tokens.labels(*labels).inc(f.gen)
            for reason, k in f.reasons.items():
                v.success.labels(m, engine, reason).inc(k)
        self.prompt_tokens.inc(prompt)
        self.generation_tokens.inc(gen)
        self.slo_total.inc(len(finished))
        self.slo_met.inc(met)
        self._num_evaluated += len(finished)
        self._num_met += met
        self.goodput.set(self._num_met / self._num_evaluated)
        for cls, name in enumerate(CLASS_NAMES):
            if class_checked[cls]:
                self.slo_checked.labels(name).inc(class_checked[cls])
                self.slo_attained.labels(name).inc(class_met[cls])
                self._class_met[cls] += class_met[cls]
                self._class_checked[cls] += class_checked[cls]
                self.slo_attainment.labels(name).set(self._class_met[cls]
                                                     / self._class_checked[cls])

    def observe_refusal(self, queue_class: str, predicted_ttft_s: float) -> None:
        """Admission refused a request (scheduler.admission) with this predicted TTFT."""
        self.slo_refused.labels(queue_class).inc()
        if predicted_ttft_s < float("inf"):
            self.predicted_ttft.observe(predicted_ttft_s)

    def refresh_scheduling(self, window_mean: float, headroom: dict[str, float]) -> None:
        """At scrape time: the batcher's mean window size and each backend's SLO headroom."""
        self.window_mean.set(window_mean)
        for address, h in headroom.items():
            self.headroom.labels(address).set(h)
        self.headroom.labels("total").set(sum(headroom.values()))

    def observe_pin(self, status: int) -> None:
        """A request's pin became pinned (1), over budget (2) or unsupported (3)."""
        name = {1: "pinned", 2: "over_budget", 3: "unsupported"}.get(status)
        if name is not None:
            self.pin_requests.labels(name).inc()

    def refresh_sessions(self, sessions, loads) -> None:
        """At scrape time: the placement's session figures (`scheduler.sessions`, None for a
        policy without sessions) and each backend's pins from its LoadReport."""
        if sessions is not None:
            self.session_requests.labels("stayed").set(sessions.num_stays)
            self.session_requests.labels("moved").set(sessions.num_moves)
            self.sessions_known.labels("key").set(len(sessions.homes))
            self.sessions_known.labels("prompt").set(len(sessions.tails))
        for address, load in loads:
            if load.pin_budget_blocks:
                self.backend_pins.labels(address).set(load.num_pins)
                self.backend_pinned_blocks.labels(address, "pinned").set(load.num_pinned_blocks)
                self.backend_pinned_blocks.labels(address, "budget").set(load.pin_budget_blocks)
                self.backend_pin_events.labels(address, "refused").set(load.num_pins_refused)
                self.backend_pin_events.labels(address, "expired").set(load.num_pins_expired)

    # --- scrape -------------------------------------------------------------------------------
    def refresh(self, depth: dict[str, int], age: dict[str, float],
                backends: list[BackendLoad], engines: list[EngineReport] = ()) -> None:
        self.fold()
        with contextlib.suppress(RuntimeError):  # no running loop: nothing to count
            self.loop_tasks.set(len(asyncio.all_tasks()))
        for cls in CLASS_NAMES:
            self.queue_depth.labels(cls).set(depth.get(cls, 0))
            self.queue_age.labels(cls).set(age.get(cls, 0.0))
        gone = self._backend_addresses - {b.address for b in backends}
        if gone:
            self._forget_backends(gone)
        self._backend_addresses = {b.address for b in backends}
        for b in backends:
            self.backend_draining.labels(b.address).set(1 if b.draining else 0)
            self.backend_up.labels(b.address).set(1 if b.healthy else 0)
            self.backend_running.labels(b.address).set(b.num_running)
            self.backend_waiting.labels(b.address).set(b.num_waiting)
            self.backend_kv.labels(b.address).set(b.kv_cache_usage)
            self.backend_outstanding.labels(b.address).set(b.outstanding_tokens)
            self.backend_held.labels(b.address).set(b.held_messages)
            self.backend_dropped_peers.labels(b.address).set(b.dropped_peers)
            self.backend_preemptions.labels(b.address, "recompute").set(
                b.preemptions - b.swap_preemptions)
            self.backend_preemptions.labels(b.address, "swap").set(b.swap_preemptions)
            self.backend_host_hits.labels(b.address).set(b.host_hit_tokens)
            self.backend_host_kv.labels(b.address).set(b.host_kv_usage)
        engines = list(engines)
        self.vllm.refresh(self.model_name, engines, sum(depth.values()))
        self.gie.refresh(self.model_name, pod_totals(
            engines, sum(depth.values()),
            accepting=[b.address for b in backends if b.healthy and not b.draining]))

    def _forget_backends(self, addresses: set[str]) -> None:
        """A backend removed from the pool: every series labelled with it goes (whatever other
        labels the series has). prometheus_client has no public way to list a metric's label
        sets, so this reads its `_labelnames` / `_metrics`."""
        for collector in list(self.registry._collector_to_names):
            names = getattr(collector, "_labelnames", ())
            if "backend" not in names:
                continue
            k = names.index("backend")
            for key in list(getattr(collector, "_metrics", {})):
                if key[k] in addresses:
                    collector.remove(*key)

    def render(self) -> bytes:
        self.fold()
        return generate_latest(self.registry)
