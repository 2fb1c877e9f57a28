"""The pod-level gauges of the Gateway API Inference Extension's model-server protocol.

GIE's endpoint picker (EPP) scrapes each model-server pod's `/metrics` and reads one series per
metric: the first of the family that carries the labels its flag names (`name` or
`name{label=value}`; `pkg/epp/backend/metrics`). The protocol fixes the types and meaning, not the
names (docs/proposals/003-model-server-protocol):

    protocol metric        type    meaning                                  here
    TotalQueuedRequests    gauge   requests in the queue                    tidegate:num_requests_waiting
    TotalRunningRequests   gauge   requests being served                    tidegate:num_requests_running
    KVCacheUtilization     gauge   KV-cache use, 0..1 (vLLM's scale)        tidegate:kv_cache_usage_perc
    [optional] BlockSize   label   tokens per KV block                      tidegate:cache_config_info{block_size}
    [optional] NumGPUBlocks label  KV blocks in GPU memory                  tidegate:cache_config_info{num_gpu_blocks}

Each is ONE series per pod (label `model_name` only), the pod's total over everything behind it:
requests waiting in the gateway's class queues plus those waiting inside the backends, the
backends' running requests, and their KV use weighted by capacity. The vLLM-named families
(`gateway.vllm_metrics`) stay per engine, as vLLM labels them; an EPP reading those without a
label picks the first series, which is not the pod's total — hence these, and the EPP flags in
deploy/ that name them (`--total-queued-requests-metric=tidegate:num_requests_waiting`, ...).

`tidegate:headroom_ratio` is ours, for autoscaling (KEDA, deploy/): the share of the pod's KV
capacity still free on backends that take new work, and 0 while any request waits for room.
`tidegate:load_backends` = (backends taking work) x (1 - headroom) is the demand counted in
backends: KEDA scales the backends to ceil(load / target) for a target below 1 (deploy/).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Gauge

from gateway.vllm_metrics import EngineReport

POD_LABELS = ["model_name"]
GIE_CACHE_LABELS = ["model_name", "block_size", "num_gpu_blocks"]

# the EPP flags that point GIE at these series (deploy/ passes them; docs/deploy.md shows them)
EPP_METRIC_FLAGS = {
    "total-queued-requests-metric": "tidegate:num_requests_waiting",
    "total-running-requests-metric": "tidegate:num_requests_running",
    "kv-cache-usage-percentage-metric": "tidegate:kv_cache_usage_perc",
    "cache-info-metric": "tidegate:cache_config_info",
    "lora-info-metric": "",  # no LoRA adapters: the EPP skips the metric
}


@dataclass(frozen=True, slots=True)
class PodTotals:
    num_waiting: int
    num_running: int
    kv_cache_usage: float  # 0..1, over the healthy backends' blocks
    block_size: int  # 0: unknown or the backends disagree (no cache_config_info series)
    num_gpu_blocks: int
    headroom: float  # 0..1
    num_accepting: int = 0  # healthy backends that take new requests

    @property
    def load_backends(self) -> float:
        """Demand in backends: all of them when requests wait, else the used share of them."""
        return self.num_accepting * (1.0 - self.headroom)


def pod_totals(engines: Iterable[EngineReport], gateway_waiting: int,
               accepting: Iterable[str] = ()) -> PodTotals:
    """The pod's totals from its backends' last reports. `accepting`: the addresses of backends
    that take new requests (healthy, not draining); only their free blocks are headroom."""
    up = [e for e in engines if e.healthy]
    accepting = set(accepting)
    waiting = gateway_waiting + sum(e.num_waiting for e in up)
    running = sum(e.num_running for e in up)
    sized = [e for e in up if e.num_blocks > 0]
    total = sum(e.num_blocks for e in sized)
    used = sum(e.kv_cache_usage * e.num_blocks for e in sized)
    usage = used / total if total else 0.0
    sizes = {e.block_size for e in sized}
    block_size = sizes.pop() if len(sizes) == 1 else 0
    open_ = [e for e in sized if e.engine in accepting]
    open_total = sum(e.num_blocks for e in open_)
    free = sum((1.0 - e.kv_cache_usage) * e.num_blocks for e in open_)
    headroom = 0.0 if waiting or not open_total else max(0.0, free / open_total)
    return PodTotals(waiting, running, min(1.0, max(0.0, usage)), block_size,
                     total if block_size else 0, min(1.0, headroom), len(open_))


class GieMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.waiting = Gauge("tidegate:num_requests_waiting", "GIE TotalQueuedRequests: requests "
                             "queued in this pod (gateway class queues + backends' queues).",
                             POD_LABELS, registry=r)
        self.running = Gauge("tidegate:num_requests_running", "GIE TotalRunningRequests: "
                             "requests running on this pod's backends.", POD_LABELS, registry=r)
        self.kv_usage = Gauge("tidegate:kv_cache_usage_perc", "GIE KVCacheUtilization: KV-cache "
                              "use over this pod's backends, 1 = full.", POD_LABELS, registry=r)
        self.cache_config = Gauge("tidegate:cache_config_info", "GIE BlockSize / NumGPUBlocks: "
                                  "the pod's KV cache (value 1, the configuration in the labels).",
                                  GIE_CACHE_LABELS, registry=r)
        self.headroom = Gauge("tidegate:headroom_ratio", "Share of the pod's KV capacity free on "
                              "backends taking new requests; 0 while requests wait (autoscaling).",
                              POD_LABELS, registry=r)
        self.load = Gauge("tidegate:load_backends", "Demand counted in backends: backends taking "
                          "requests x (1 - headroom_ratio) (autoscaling).", POD_LABELS, registry=r)
        self._cache_labels: tuple[str, str, str] | None = None
        self._model: str | None = None

    def refresh(self, model: str, t: PodTotals) -> None:
        if model != self._model:  # the model's name arrived (or changed): no stale series first
            for g in (self.waiting, self.running, self.kv_usage, self.headroom, self.load,
                      self.cache_config):
                g.clear()
            self._model, self._cache_labels = model, None
        self.waiting.labels(model).set(t.num_waiting)
        self.running.labels(model).set(t.num_running)
        self.kv_usage.labels(model).set(t.kv_cache_usage)
        self.headroom.labels(model).set(t.headroom)
        self.load.labels(model).set(t.load_backends)
        labels = (model, str(t.block_size), str(t.num_gpu_blocks)) if t.block_size else None
        if labels != self._cache_labels:  # one series, never a stale one beside it
            self.cache_config.clear()
            if labels is not None:
                self.cache_config.labels(*labels).set(1)
            self._cache_labels = labels
