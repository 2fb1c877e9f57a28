"""Prometheus metrics of one gateway app, in its own `CollectorRegistry`.

Our series are `tidegate_*`; the ones routers scrape from vLLM are mirrored under vLLM's
names (`vllm:*`, labelled `model_name`) so a vLLM-aware router can scrape us unchanged.
Gauges that describe current state (queues, backend load) are refreshed at scrape time by
`refresh()`, so they are never stale and cost nothing between scrapes.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                   1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
               0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 96, 128)
QUEUE_CLASSES = ("fast", "normal", "slow")


@dataclass(frozen=True, slots=True)
class BackendLoad:
    """One backend's last load report, as the metrics see it."""

    address: str
    healthy: bool
    num_running: int
    num_waiting: int
    kv_cache_usage: float  # 0..1
    outstanding_tokens: int


@dataclass(frozen=True, slots=True)
class SLOConfig:
    ttft_ms: float | None = None
    tpot_ms: float | None = None

    def met(self, ttft_s: float | None, tpot_s: float | None) -> bool:
        if self.ttft_ms is not None and (ttft_s is None or ttft_s * 1000 > self.ttft_ms):
            return False
        return not (self.tpot_ms is not None and tpot_s is not None
                    and tpot_s * 1000 > self.tpot_ms)


class GatewayMetrics:
    def __init__(self, model_name: str, slo: SLOConfig = SLOConfig()) -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        self.slo = slo
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
        # vLLM's names, for routers that scrape vLLM.
        self.v_running = Gauge("vllm:num_requests_running", "Requests running on the backends.",
                               ["model_name"], registry=r)
        self.v_waiting = Gauge("vllm:num_requests_waiting", "Requests waiting (gateway queues and "
                               "backends).", ["model_name"], registry=r)
        self.v_kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage (0..1), mean over healthy "
                          "backends.", ["model_name"], registry=r)
        self.v_ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token.",
                                ["model_name"], buckets=LATENCY_BUCKETS, registry=r)
        self.v_itl = Histogram("vllm:inter_token_latency_seconds", "Inter-token latency.",
                               ["model_name"], buckets=ITL_BUCKETS, registry=r)
        self.v_tpot = Histogram("vllm:time_per_output_token_seconds", "Mean time per output "
                                "token of a request.", ["model_name"], buckets=ITL_BUCKETS,
                                registry=r)
        self.v_e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency.",
                               ["model_name"], buckets=LATENCY_BUCKETS, registry=r)
        self.v_queue = Histogram("vllm:request_queue_time_seconds", "Time in the gateway queue.",
                                 ["model_name"], buckets=LATENCY_BUCKETS, registry=r)
        self.v_success = Counter("vllm:request_success", "Successful requests by finish reason.",
                                 ["model_name", "finished_reason"], registry=r)
        self.v_prompt = Counter("vllm:prompt_tokens", "Prompt tokens.", ["model_name"], registry=r)
        self.v_gen = Counter("vllm:generation_tokens", "Generated tokens.", ["model_name"],
                             registry=r)
        self.goodput.set(1.0)
        self._num_met = self._num_evaluated = 0
        for cls in QUEUE_CLASSES:
            self.queue_depth.labels(cls).set(0)
            self.queue_age.labels(cls).set(0)

    # --- events -------------------------------------------------------------------------------
    def observe_batch(self, size: int, queue_times: list[float]) -> None:
        self.batches.inc()
        self.batch_size.observe(size)
        for t in queue_times:
            self.queue_time.observe(t)
            self.v_queue.labels(self.model_name).observe(t)

    def observe_request(self, status: int, queue_class: str) -> None:
        self.requests.labels(str(status), queue_class).inc()

    def observe_finished(self, *, num_prompt_tokens: int, token_times: list[float],
                         arrival: float, finished: float, finish_reason: str) -> None:
        """A successful request: `token_times` are the arrival times of its output tokens."""
        m = self.model_name
        e2e = finished - arrival
        self.e2e.observe(e2e)
        self.v_e2e.labels(m).observe(e2e)
        self.prompt_tokens.inc(num_prompt_tokens)
        self.v_prompt.labels(m).inc(num_prompt_tokens)
        self.generation_tokens.inc(len(token_times))
        self.v_gen.labels(m).inc(len(token_times))
        self.v_success.labels(m, finish_reason).inc()
        ttft = token_times[0] - arrival if token_times else None
        if ttft is not None:
            self.ttft.observe(ttft)
            self.v_ttft.labels(m).observe(ttft)
        for a, b in itertools.pairwise(token_times):
            self.itl.observe(b - a)
            self.v_itl.labels(m).observe(b - a)
        tpot = None
        if len(token_times) > 1:
            tpot = (token_times[-1] - token_times[0]) / (len(token_times) - 1)
            self.v_tpot.labels(m).observe(tpot)
        self.slo_total.inc()
        self._num_evaluated += 1
        if self.slo.met(ttft, tpot):
            self.slo_met.inc()
            self._num_met += 1
        self.goodput.set(self._num_met / self._num_evaluated)

    # --- scrape -------------------------------------------------------------------------------
    def refresh(self, depth: dict[str, int], age: dict[str, float],
                backends: list[BackendLoad]) -> None:
        for cls in QUEUE_CLASSES:
            self.queue_depth.labels(cls).set(depth.get(cls, 0))
            self.queue_age.labels(cls).set(age.get(cls, 0.0))
        running = waiting = 0
        kv: list[float] = []
        for b in backends:
            self.backend_up.labels(b.address).set(1 if b.healthy else 0)
            self.backend_running.labels(b.address).set(b.num_running)
            self.backend_waiting.labels(b.address).set(b.num_waiting)
            self.backend_kv.labels(b.address).set(b.kv_cache_usage)
            self.backend_outstanding.labels(b.address).set(b.outstanding_tokens)
            if b.healthy:
                running += b.num_running
                waiting += b.num_waiting
                kv.append(b.kv_cache_usage)
        self.v_running.labels(self.model_name).set(running)
        self.v_waiting.labels(self.model_name).set(waiting + sum(depth.values()))
        self.v_kv.labels(self.model_name).set(sum(kv) / len(kv) if kv else 0.0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
