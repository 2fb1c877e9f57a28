"""vLLM's Prometheus names, so a router built for vLLM (the production-stack router, llm-d's
scheduler) can drive tidegate unchanged.

vLLM V1 labels its engine series `{model_name, engine}`; here each backend is an engine and its
label is the backend's address. Requests still in the gateway's own class queues are waiting on
no engine yet: they are counted under `engine="gateway"` in `vllm:num_requests_waiting`.
Counters that the backends keep cumulatively (prefix-cache queries and hits, preemptions, and
speculative decoding by draft source) come in the LoadReports and are added here as the increase
since the last report; a backend that restarted (its count went down) starts again from its new
count.

Speculative decoding: `vllm:spec_decode_num_drafts`, `_num_draft_tokens`, `_num_accepted_tokens`
and `_num_accepted_tokens_per_pos` (vLLM's names) carry one more label, `source`: the draft
source as the backend reports it (`prediction`, `prompt`, `session`: LoadReport.spec_decode), or
`unknown` for a backend that does not report by source, whose requests' own counters
(RequestOutput 9 and 12) are added when each request ends (`observe_request`).
"""
from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

GATEWAY_ENGINE = "gateway"
ENGINE_LABELS = ["model_name", "engine"]
CACHE_CONFIG_LABELS = ["engine", "block_size", "cache_dtype", "enable_prefix_caching",
                       "num_gpu_blocks", "num_cpu_blocks"]


@dataclass(frozen=True, slots=True)
class EngineReport:
    """What the metrics read from one backend's BackendInfo and last LoadReport."""

    engine: str  # the backend's address
    healthy: bool
    num_running: int
    num_waiting: int
    kv_cache_usage: float  # 0..1
    num_prefix_queries: int = 0  # cumulative, in tokens (as vLLM counts them)
    num_prefix_hits: int = 0
    num_preemptions: int = 0
    block_size: int = 0
    cache_dtype: str = "auto"
    enable_prefix_caching: bool = False
    num_blocks: int = 0
    # speculative decoding by draft source, cumulative: (source, drafts, draft tokens, accepted
    # tokens, accepted tokens per draft position); () where the backend does not report it
    spec_decode: tuple[tuple[str, int, int, int, tuple[int, ...]], ...] = ()


class VllmMetrics:
    def __init__(self, registry: CollectorRegistry, latency_buckets, itl_buckets) -> None:
        r = registry

        def gauge(name, doc):
            return Gauge(name, doc, ENGINE_LABELS, registry=r)

        def counter(name, doc, extra=()):
            return Counter(name, doc, ENGINE_LABELS + list(extra), registry=r)

        def hist(name, doc, buckets):
            return Histogram(name, doc, ENGINE_LABELS, buckets=buckets, registry=r)

        self.running = gauge("vllm:num_requests_running", "Requests running on the engine.")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting (engine=\"gateway\": "
                             "in the gateway's class queues).")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 1 = full.")
        self.gpu_cache_usage = gauge("vllm:gpu_cache_usage_perc", "KV-cache usage, 1 = full "
                                     "(vLLM's older name of kv_cache_usage_perc).")
        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prompt tokens looked up in "
                                      "the prefix cache.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix "
                                   "cache.")
        self.preemptions = counter("vllm:num_preemptions", "Sequences preempted by the engine.")
        self.cache_config = Gauge("vllm:cache_config_info", "The engine's KV-cache configuration "
                                  "(value 1, the configuration in the labels).",
                                  CACHE_CONFIG_LABELS, registry=r)
        self.ttft = hist("vllm:time_to_first_token_seconds", "Time to first token.",
                         latency_buckets)
        self.itl = hist("vllm:inter_token_latency_seconds", "Inter-token latency.", itl_buckets)
        self.tpot = hist("vllm:time_per_output_token_seconds", "Mean time per output token of a "
                         "request.", itl_buckets)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "End-to-end request latency.",
                        latency_buckets)
        self.queue = hist("vllm:request_queue_time_seconds", "Time from arrival until the "
                          "request was sent to its engine.", latency_buckets)
        self.success = counter("vllm:request_success", "Successful requests by finish reason.",
                               ["finished_reason"])
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens.")
        self.generation_tokens = counter("vllm:generation_tokens", "Generated tokens.")
        # speculative decoding (vLLM's spec-decode names), by draft source: a draft is one
        # verify of >= 1 draft token for one sequence
        src = ["source"]
        self.spec_drafts = counter("vllm:spec_decode_num_drafts", "Drafts verified (one "
                                   "sequence's draft tokens in one step), by draft source.", src)
        self.spec_draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Draft tokens "
                                         "verified, by draft source.", src)
        self.spec_accepted_tokens = counter("vllm:spec_decode_num_accepted_tokens", "Draft "
                                            "tokens accepted, by draft source.", src)
        self.spec_accepted_per_pos = counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos", "Draft tokens accepted at each "
            "position of their draft (0: the first), by draft source.", src + ["position"])
        self._last: dict[str, tuple[int, int, int]] = {}  # engine -> counters last reported
        # (engine, source) -> (drafts, draft tokens, accepted, per position) last reported
        self._last_spec: dict[tuple[str, str], tuple] = {}

    def refresh(self, model: str, engines: list[EngineReport], gateway_waiting: int) -> None:
        self.waiting.labels(model, GATEWAY_ENGINE).set(gateway_waiting)
        for e in engines:
            labels = (model, e.engine)
            up = e.healthy
            self.running.labels(*labels).set(e.num_running if up else 0)
            self.waiting.labels(*labels).set(e.num_waiting if up else 0)
            self.kv_usage.labels(*labels).set(e.kv_cache_usage)
            self.gpu_cache_usage.labels(*labels).set(e.kv_cache_usage)
            now = (e.num_prefix_queries, e.num_prefix_hits, e.num_preemptions)
            last = self._last.get(e.engine, (0, 0, 0))
            for series, new, old in zip((self.prefix_queries, self.prefix_hits,
                                         self.preemptions), now, last):
                series.labels(*labels).inc(new - old if new >= old else new)
            self._last[e.engine] = now
            for source, drafts, tokens, accepted, per_pos in e.spec_decode:
                self._add_spec(labels, source, drafts, tokens, accepted, per_pos)
            if e.block_size:
                self.cache_config.labels(e.engine, str(e.block_size), e.cache_dtype,
                                         str(e.enable_prefix_caching), str(e.num_blocks),
                                         "0").set(1)

    def _add_spec(self, labels: tuple[str, str], source: str, drafts: int, tokens: int,
                  accepted: int, per_pos: tuple[int, ...]) -> None:
        """One backend's cumulative counters of one source: the increase since its last report."""
        key = (labels[1], source)
        old = self._last_spec.get(key)
        if old is not None and (drafts < old[0] or tokens < old[1]):
            old = None  # the backend restarted: its counts start again
        old_drafts, old_tokens, old_accepted, old_pos = old or (0, 0, 0, ())
        lab = (*labels, source)
        self.spec_drafts.labels(*lab).inc(drafts - old_drafts)
        self.spec_draft_tokens.labels(*lab).inc(tokens - old_tokens)
        self.spec_accepted_tokens.labels(*lab).inc(max(0, accepted - old_accepted))
        for pos, n in enumerate(per_pos):
            prev = old_pos[pos] if pos < len(old_pos) else 0
            self.spec_accepted_per_pos.labels(*lab, str(pos)).inc(max(0, n - prev))
        self._last_spec[key] = (drafts, tokens, accepted, tuple(per_pos))

    def observe_request(self, labels: tuple[str, str], drafts: int, tokens: int,
                        accepted: int) -> None:
        """One finished request's speculation, from a backend that does not report by source."""
        lab = (*labels, "unknown")
        self.spec_drafts.labels(*lab).inc(drafts)
        self.spec_draft_tokens.labels(*lab).inc(tokens)
        self.spec_accepted_tokens.labels(*lab).inc(accepted)
