"""The gateway core shared by the HTTP routes and the ZMQ front door.

`Gateway` owns the backend pool, the dispatcher (queues + batcher) and the metrics; `submit`
turns token ids and sampling parameters into a `RequestHandle`, whose `deltas()` yields the
detokenized, stop-matched output as it arrives. Closing a handle early (client gone, stop
string, timeout) aborts the request wherever it is: in a class queue or on a backend.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import cached_property

from gateway.backend_pool import BackendPool, PoolConfig
from gateway.body_checks import check_text
from gateway.dispatcher import Dispatcher
from gateway.errors import (
    APIError,
    bad_request,
    cancelled,
    deadline_exceeded,
    shutting_down,
    unavailable,
)
from gateway.openai_schema import Prompt, SamplingParams, ServingOptions
from gateway.output import OutputAssembler, OutputDelta
from gateway.prediction_fields import check_prediction_tokens
from gateway.prometheus_metrics import GatewayMetrics
from gateway.remote_tokenizer import RemoteTokenizer
from gateway.validation import RequestLimits
from gateway.vllm_metrics import EngineReport
from proto import tidegate_pb2 as pb
from proto.sampling import check_token_ids, to_wire
from scheduler.admission import AdmissionConfig
from scheduler.batcher import BatcherConfig
from scheduler.classes import CLASS_NAMES
from scheduler.decisions import DecisionLog
from scheduler.prediction_usage import prediction_overlap
from scheduler.queues import QueueConfig
from scheduler.slo import SLOTargets
from tokenizer.bundle import TokenizerBundle
from tokenizer.fim import FimTemplate, find_fim_template

log = logging.getLogger("tidegate.gateway")


@dataclass(frozen=True)
class GatewayConfig:
    backends: tuple[str, ...]
    served_model_name: str | None = None  # None: the backend's model name
    api_key: str | None = None
    max_body_bytes: int = 1 << 20
    request_timeout_s: float = 600.0
    stream_interval: int = 1  # send every N tokens while streaming
    log_prompts: bool = False
    drain_timeout_s: float = 30.0
    # A streaming client that takes no bytes for this long (its connection's buffers full) is
    # treated as gone: its requests are aborted (KV freed) and the connection closed, instead
    # of the handler waiting on it for ever.
    stream_stall_timeout_s: float = 30.0
    # TTFT / TPOT targets per queue class (scheduler.slo): SLO attainment in /metrics, and with
    # a TTFT target, admission that refuses what is predicted to miss it (scheduler.admission)
    slo: SLOTargets = field(default_factory=SLOTargets)
    slot_model: bool = False  # admission's slot model (scheduler.admission, "Slots")
    compete_window: bool = False  # AdmissionConfig.compete_window
    retry_after_quantile: float | None = None  # AdmissionConfig.retry_after_quantile
    # AdmissionConfig.class_ordered (`--overtake`: the backends admit by class) and its horizon
    overtake: bool = False
    overtake_horizon_s: float | None = None
    normal_overtake_quantile: float | None = None  # AdmissionConfig.normal_overtake_quantile
    fleet_arrival_rate: bool = False  # AdmissionConfig.fleet_arrival_rate
    send_deadlines: bool = False  # AdmissionConfig.send_deadlines: deadlines on the wire
    pool: PoolConfig = field(default_factory=PoolConfig)
    batcher: BatcherConfig = field(default_factory=BatcherConfig)
    queues: QueueConfig = field(default_factory=QueueConfig)
    limits: RequestLimits = field(default_factory=RequestLimits)
    fim_template: str | None = None  # None: the model family's, found in its tokenizer
    tool_call_parser: str = "hermes"  # how `auto` tool calls are parsed (gateway.tool_parser)
    protect_metrics: bool = False  # /metrics behind the API key too
    admin_key: str | None = None  # /admin/backends (gateway.admin); None: no admin endpoint
    decision_log_path: str | None = None  # JSONL record of arrivals + flushed windows; None: off


class RequestHandle:
    """One sequence in flight. Implements `backend_pool.RequestSink`."""

    def __init__(self, gateway: Gateway, request_id: str, prompt_ids: list[int],
                 sampling: SamplingParams, max_tokens: int, options: ServingOptions,
                 prediction_ids: list[int] | None = None) -> None:
        self.gateway = gateway
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        # Predicted Outputs: the prediction's token ids (None: the request has none)
        self.prediction_ids = prediction_ids
        # speculative decoding as the backend reports it, cumulative (RequestOutput 9-12):
        # draft tokens verified, of which accepted; prediction tokens used / not used; and the
        # outputs whose draft count rose (the steps that verified a draft: vLLM's "drafts")
        self.num_draft_tokens = self.num_accepted_draft_tokens = 0
        self.accepted_prediction_tokens = self.rejected_prediction_tokens = 0
        self.num_drafts = 0
        self._prediction_usage: tuple[int, int, int] | None = None  # (output length, a, r)
        self.sampling = sampling
        self.max_tokens = max_tokens
        self.options = options
        # agent sessions (issue 30): prompt tokens the backend found cached, and what became of
        # the request's pin (RequestOutput.PinStatus; 0: none asked, or not known yet)
        self.cached_tokens = 0
        self.pin_status = 0
        self.priority = options.priority
        self.arrival_time = time.monotonic()
        self.queue_deadline = (self.arrival_time + options.deadline_ms / 1000
                               if options.deadline_ms is not None else None)
        self.timeout_at = self.arrival_time + gateway.config.request_timeout_s
        self.queue_class = 0
        self.slo_ttft_ms = options.slo_ttft_ms
        self.slo_tpot_ms = options.slo_tpot_ms
        self.unstarted: tuple[int, int, int, int, int, float] | None = None  # gateway.dispatcher
        self.started_on: int | None = None  # its backend once started (gateway.dispatcher)
        self.num_tokens_in = 0  # output tokens received from the backend
        self.dispatched_at: float | None = None
        self.backend = ""
        decode = None if gateway.passes_text else \
            gateway.bundle.decode if sampling.skip_special_tokens else gateway.decode_special
        eos = () if sampling.ignore_eos else gateway.info.eos_token_ids
        self.assembler = OutputAssembler(decode, prompt_ids, sampling.stop,
                                         sampling.include_stop_str_in_output, sampling.min_tokens,
                                         (*eos, *sampling.stop_token_ids))
        self.error: APIError | None = None
        self.closed = False
        # Events for the consumer: a deque and, while it waits, one future (an asyncio.Queue
        # per request cost more than the rest of the hand-off).
        self._events: deque = deque()
        self._waiter: asyncio.Future | None = None
        self._timer: asyncio.TimerHandle | None = None
        # n > 1: the other choices of this prompt, sent once this one has been prefilled
        self.followers: list[RequestHandle] = []

    def _put(self, event) -> None:
        self._events.append(event)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # --- RequestSink ------------------------------------------------------------------------------
    def on_tokens(self, token_ids, finish_reason, logprobs, now, text=None) -> None:
        if self.unstarted is not None:
            self.gateway.dispatcher.on_first_token(self, now)
        self.num_tokens_in += len(token_ids)
        self._put((token_ids, finish_reason, logprobs, now, text))
        if self.followers:
            self._release_followers()
        if finish_reason is not None:
            if self.started_on is not None:
                self.gateway.dispatcher.on_finished(self, now, self.num_tokens_in)
            self.gateway.dispatcher.on_capacity()

    def on_cache(self, cached_tokens: int, pin_status: int) -> None:
        """The backend's prefix-cache figures of this request (its first output carries them)."""
        self.cached_tokens = max(self.cached_tokens, cached_tokens)
        if pin_status:
            self.pin_status = pin_status
            self.gateway.metrics.observe_pin(pin_status)

    def on_speculation(self, draft_tokens: int, accepted_draft_tokens: int,
                       accepted_prediction: int, rejected_prediction: int) -> None:
        """The backend's cumulative speculation counters, before the tokens they came with."""
        if draft_tokens > self.num_draft_tokens:
            self.num_drafts += 1
        self.num_draft_tokens = draft_tokens
        self.num_accepted_draft_tokens = accepted_draft_tokens
        self.accepted_prediction_tokens = accepted_prediction
        self.rejected_prediction_tokens = rejected_prediction

    def on_error(self, error: APIError) -> None:
        if self.unstarted is not None:
            self.gateway.dispatcher.on_gone(self)
        elif self.started_on is not None:
            self.gateway.dispatcher.on_finished(self, 0.0, 0)
        self._put(error)
        if self.followers:
            self._release_followers()
        self.gateway.dispatcher.on_capacity()

    def _release_followers(self) -> None:
        """First output: the prompt's full KV blocks are in the backend's prefix cache now, so
        the other choices find them there instead of prefilling the prompt again. Queued on
        the next loop turn (this runs inside the backend socket's reader)."""
        followers, self.followers = self.followers, []
        asyncio.get_running_loop().call_soon(self.gateway.dispatch_followers, followers)

    def on_dispatched(self, now: float, backend: str = "") -> None:
        self.backend = backend  # the last backend it was sent to (vLLM's "engine" label)
        self.dispatched_at = now

    def wire_sampling(self) -> pb.SamplingParams:
        return to_wire(self.sampling, self.max_tokens)

    def prediction_usage(self) -> tuple[int, int]:
        """(accepted, rejected) prediction tokens, OpenAI's: the prediction's tokens that appear
        in order in the output so far, and the rest (gateway.prediction_fields)."""
        pred = self.prediction_ids
        if not pred:
            return 0, 0
        out = self.assembler.token_ids
        key = len(out)
        if self._prediction_usage is None or self._prediction_usage[0] != key:
            accepted = prediction_overlap(pred, out)
            self._prediction_usage = (key, accepted, len(pred) - accepted)
        return self._prediction_usage[1], self._prediction_usage[2]

    def wire_speculation(self) -> pb.SpeculationParams | None:
        """The request's `speculation` control for the wire; None: the server's default."""
        spec = self.options.speculation
        if spec is None:
            return None
        return pb.SpeculationParams(off=spec.off, max_draft_tokens=spec.max_draft_tokens)

    # --- consuming --------------------------------------------------------------------------------
    @property
    def queue_class_name(self) -> str:
        return CLASS_NAMES[self.queue_class]

    async def deltas(self, stream_interval: int = 1) -> AsyncIterator[OutputDelta]:
        """Output deltas until the sequence finishes; raises APIError on failure or timeout.
        With `stream_interval` N, tokens are gathered until N are pending (or it finishes)."""
        pending: OutputDelta | None = None
        asm = self.assembler
        while not asm.finished:
            event = await self._next_event()
            if isinstance(event, APIError):
                self.error = event
                self.closed = True
                self._cancel_timer()
                raise event
            ids, finish, lps, now, text = event
            delta = asm.add(ids, now, finish, lps, text)
            if asm.stopped_by_string:
                self.gateway.abort(self)
            pending = delta if pending is None else _merge(pending, delta)
            if asm.finished or len(pending.token_ids) >= stream_interval:
                yield pending
                pending = None
        self.closed = True
        self._cancel_timer()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _next_event(self):
        # No asyncio.wait_for here: on Python 3.11 it swallows a cancellation that races with a
        # result, and tokens arrive every few ms, so a gone client's handler would run on. The
        # timeout is a timer that posts an error event instead.
        if self._timer is None:
            loop = asyncio.get_running_loop()
            delay = max(0.0, self.timeout_at - time.monotonic())
            self._timer = loop.call_at(loop.time() + delay, self._on_timeout)
        events = self._events
        while not events:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return events.popleft()

    def _on_timeout(self) -> None:
        if self.closed or self.assembler.finished:
            return
        self.gateway.abort(self)
        self._put(deadline_exceeded(
            f"The request did not finish within {self.gateway.config.request_timeout_s:g} s."))

    def close(self) -> None:
        """The consumer is gone: abort unless already finished. A consumer still waiting on
        `deltas()` (a forwarding task) is woken with a `cancelled` error, so nothing waits on
        a request whose outputs are now ignored."""
        self._cancel_timer()
        if not self.closed:
            self.closed = True
            if self.unstarted is not None:
                self.gateway.dispatcher.on_gone(self)
            elif self.started_on is not None:
                self.gateway.dispatcher.on_finished(self, 0.0, 0)
            self.gateway.abort(self)
            self._put(cancelled())


def _merge(a: OutputDelta, b: OutputDelta) -> OutputDelta:
    lps = a.logprobs + b.logprobs if a.logprobs is not None and b.logprobs is not None else None
    return OutputDelta(a.text + b.text, a.token_ids + b.token_ids, lps, b.finish_reason)


class Gateway:
    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.metrics = GatewayMetrics(config.served_model_name or "unknown", config.slo)
        self.pool = BackendPool(list(config.backends), config.pool, on_idle=self._on_idle,
                                on_dropped=lambda s: self.metrics.dropped_frames.labels(s).inc(),
                                on_retry=self.metrics.retried.inc,
                                on_info=lambda pid, info: self.dispatcher.on_backend_info(pid, info))
        decisions = (DecisionLog.open(config.decision_log_path)
                     if config.decision_log_path else None)
        self.dispatcher = Dispatcher(self.pool, self.metrics, config.batcher, config.queues,
                                     decision_log=decisions,
                                     admission_config=AdmissionConfig(
                                         slo=config.slo, slot_model=config.slot_model,
                                         compete_window=config.compete_window,
                                         retry_after_quantile=config.retry_after_quantile,
                                         class_ordered=config.overtake,
                                         overtake_horizon_s=config.overtake_horizon_s,
                                         normal_overtake_quantile=config.normal_overtake_quantile,
                                         fleet_arrival_rate=config.fleet_arrival_rate,
                                         send_deadlines=config.send_deadlines))
        self.draining = False
        self.num_active = 0
        self._ids = itertools.count()
        self._id_prefix = os.urandom(4).hex()

    async def start(self) -> None:
        await self.pool.start()

    async def close(self) -> None:
        self.dispatcher.close()
        await self.pool.close()

    def _on_idle(self) -> None:
        self.dispatcher.on_idle()

    # --- what the backends told us --------------------------------------------------------------
    @property
    def healthy(self) -> bool:
        return bool(self.pool.healthy_backends())

    @property
    def info(self) -> pb.BackendInfo:
        info = self.pool.info
        if info is None:
            raise unavailable("No backend has introduced itself yet.")
        return info

    @property
    def generation_defaults(self) -> dict[str, float]:
        """The model's sampling defaults (its generation config, `gateway.generation_defaults`);
        {} until a backend has introduced itself, or when it announces none."""
        info = self.pool.info
        return dict(info.generation_defaults) if info is not None else {}

    @property
    def model_name(self) -> str:
        return self.config.served_model_name or self.info.model

    @property
    def passes_text(self) -> bool:
        """No tokenizer here: the backends are OpenAI-compatible HTTP servers and the gateway was
        given none (`--tokenizer`). Prompts are tokenized by the server's /tokenize
        (`gateway.remote_tokenizer`), output text comes with the tokens."""
        return not self.info.tokenizer_json

    @cached_property
    def remote_tokenizer(self) -> RemoteTokenizer:
        return RemoteTokenizer(self.pool)

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """A text prompt's token ids: this gateway's tokenizer, or its HTTP server's."""
        if self.passes_text:
            return await self.remote_tokenizer.encode(text, add_special_tokens)
        return self.bundle.encode(text, add_special_tokens=add_special_tokens)

    async def encode_chat(self, messages: list[dict], add_generation_prompt: bool,
                          add_special_tokens: bool) -> list[int]:
        """Chat messages through the chat template, tokenized (here, or by the HTTP server)."""
        if self.passes_text:
            return await self.remote_tokenizer.encode_chat(messages, add_generation_prompt,
                                                           add_special_tokens)
        bundle = self.bundle
        try:
            text = bundle.apply_chat_template(messages, add_generation_prompt)
        except Exception as exc:  # noqa: BLE001 - jinja templates raise anything (raise_exception)
            raise bad_request(f"The chat template could not render the messages: {exc}",
                              "messages") from None
        # a lone surrogate anywhere in the messages (a tool call's input object included, which
        # the field checks do not walk) reaches the rendered text: a 400, not the tokenizer's 500
        check_text(text, "messages")
        return bundle.encode(text, add_special_tokens=add_special_tokens)

    async def decode_prompt(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Token ids as text (echo, /detokenize); the HTTP server's /detokenize keeps special
        tokens whatever `skip_special_tokens` says."""
        if self.passes_text:
            return await self.remote_tokenizer.decode(ids)
        return self.bundle.decode(ids, skip_special_tokens=skip_special_tokens)

    @cached_property
    def bundle(self) -> TokenizerBundle:
        info = self.info
        if not info.tokenizer_json:
            raise bad_request("This needs the model's tokenizer in the gateway, and its HTTP "
                              "backend sends none: start the gateway with --tokenizer DIR (the "
                              "model's Hugging Face directory).", None, "tokenizer_unavailable")
        return TokenizerBundle.from_parts(
            info.tokenizer_json, info.chat_template or None,
            info.bos_token_id if info.HasField("bos_token_id") else None,
            tuple(info.eos_token_ids), info.model)

    @cached_property
    def fim_template(self) -> FimTemplate | None:
        """The fill-in-the-middle template: the operator's, else the model family's."""
        return find_fim_template(self.bundle, self.config.fim_template)

    def fim_prompt(self, prefix: Prompt, suffix: str) -> list[int]:
        """The fill-in-the-middle prompt around the hole between `prefix` and `suffix`."""
        if not isinstance(prefix, str):
            raise bad_request("'suffix' needs text prompts (the FIM template is applied to "
                              "text).", "suffix")
        template = self.fim_template
        if template is None:
            raise bad_request(f"The model '{self.model_name}' has no fill-in-the-middle tokens in "
                              "its tokenizer, so 'suffix' cannot be used (an operator may set "
                              "--fim-template).", "suffix", "fim_not_supported")
        return template.encode(self.bundle, prefix, suffix)

    def tokenize_prediction(self, text: str | tuple[int, ...] | None) -> list[int] | None:
        """The prediction's token ids (no special tokens: it stands for output text), checked
        against the context; [] for an empty one (nothing to draft, usage details of 0s);
        None for none, or with no tokenizer here (an HTTP backend, which would not draft)."""
        if isinstance(text, tuple):  # token ids (checked against the vocabulary)
            vocab = self.info.vocab_size
            if vocab and max(text) >= vocab:
                raise bad_request(f"Token id {max(text)} in 'prediction.content' is out of range "
                                  f"(vocabulary size {vocab}).", "prediction.content")
            check_prediction_tokens(len(text), self.info.max_model_len)
            return list(text)
        if text is None or not self.info.tokenizer_json:
            return None
        ids = self.bundle.encode(text, add_special_tokens=False) if text else []
        check_prediction_tokens(len(ids), self.info.max_model_len)
        return ids

    def check_token_params(self, sampling: SamplingParams) -> None:
        """Token ids in the sampling parameters must exist in the vocabulary (400 otherwise)."""
        err = check_token_ids(sampling, self.info.vocab_size) if self.info.vocab_size else None
        if err is not None:  # (the rest of proto.sampling.check_sampling ran on the body)
            raise bad_request(err.message, err.param)

    def decode_special(self, ids) -> str:
        """Decode keeping special tokens (skip_special_tokens = false)."""
        return self.bundle.decode(ids, skip_special_tokens=False)

    def new_request_id(self, prefix: str = "cmpl") -> str:
        return f"{prefix}-{self._id_prefix}{next(self._ids):08x}"

    # --- requests ---------------------------------------------------------------------------------
    def check_admission(self) -> None:
        if self.draining:
            raise shutting_down()
        if not self.healthy:
            raise unavailable()

    def submit(self, request_id: str, prompt_ids: list[int], sampling: SamplingParams,
               max_tokens: int, options: ServingOptions,
               prediction_ids: list[int] | None = None) -> RequestHandle:
        """Queue one sequence (APIError 503 / 429 when it cannot be)."""
        self.check_admission()
        handle = RequestHandle(self, request_id, prompt_ids, sampling, max_tokens, options,
                               prediction_ids)
        # before the dispatch records anything: its queue time belongs to the served name
        self.metrics.model_name = self.model_name
        self.dispatcher.submit(handle)
        return handle

    def submit_follower(self, leader: RequestHandle, request_id: str, prompt_ids: list[int],
                        sampling: SamplingParams, max_tokens: int,
                        options: ServingOptions,
                        prediction_ids: list[int] | None = None) -> RequestHandle:
        """Another choice of `leader`'s prompt (n > 1), queued once the leader's first output
        arrives (see RequestHandle._release_followers)."""
        self.check_admission()
        handle = RequestHandle(self, request_id, prompt_ids, sampling, max_tokens, options,
                               prediction_ids)
        leader.followers.append(handle)
        return handle

    def dispatch_followers(self, followers: list[RequestHandle]) -> None:
        for handle in followers:
            if handle.closed:
                continue  # its client left while it waited
            try:
                self.check_admission()
                self.dispatcher.submit(handle)
            except APIError as err:
                handle.on_error(err)

    def abort(self, handle: RequestHandle) -> None:
        if not self.dispatcher.cancel(handle.request_id):
            self.pool.abort([handle.request_id])
            self.dispatcher.on_capacity()

    def record(self, handle: RequestHandle, status: int) -> None:
        """Metrics for one finished sequence (status: the HTTP status it ended with)."""
        self.metrics.model_name = self.model_name
        self.metrics.observe_request(status, handle.queue_class_name)
        if handle.num_draft_tokens or handle.prediction_ids is not None:
            accepted, rejected = handle.prediction_usage()
            # a backend that reports speculation by draft source in its LoadReports feeds
            # vLLM's series from there (vllm_metrics), not request by request as well
            by_source = any(b.address == handle.backend and len(b.load.spec_decode)
                            for b in self.pool.backends)
            self.metrics.observe_speculation(
                handle.backend, "prediction" if handle.prediction_ids is not None else "auto",
                handle.num_drafts, handle.num_draft_tokens, handle.num_accepted_draft_tokens,
                accepted, rejected, engine_reports_sources=by_source)
        asm = handle.assembler
        if status == 200 and asm.finished:
            self.metrics.observe_finished(
                num_prompt_tokens=len(handle.prompt_ids), token_times=asm.token_times,
                arrival=handle.arrival_time, finished=time.monotonic(),
                finish_reason=asm.finish_reason, engine=handle.backend,
                queue_class=handle.queue_class,
                slo_ms=(handle.slo_ttft_ms, handle.slo_tpot_ms))

    def refresh_metrics(self) -> None:
        from gateway.prometheus_metrics import BackendLoad

        depth, age = self.dispatcher.depth_and_age()
        loads = [BackendLoad(b.address, b.healthy, b.load.num_running, b.load.num_waiting,
                             b.kv_cache_usage, b.outstanding_tokens, b.load.num_held_messages,
                             b.load.num_dropped_peers, b.draining,
                             preemptions=b.load.num_preemptions,
                             swap_preemptions=b.load.num_swap_preemptions,
                             host_hit_tokens=b.load.num_host_hit_tokens,
                             host_kv_usage=b.load.num_host_used_blocks / b.load.num_host_blocks
                             if b.load.num_host_blocks else 0.0)
                 for b in self.pool.backends]
        engines = [engine_report(b) for b in self.pool.backends]
        if self.pool.info is not None:
            self.metrics.model_name = self.model_name
        self.metrics.refresh(depth, age, loads, engines)
        self.metrics.refresh_sessions(getattr(self.pool.placement, "sessions", None),
                                      [(b.address, b.load) for b in self.pool.backends])
        stats = self.dispatcher.batcher.stats
        headroom = self.dispatcher.predictor.headroom(self.dispatcher.clock.now())
        by_pid = {b.pid: b.address for b in self.pool.backends}
        self.metrics.refresh_scheduling(
            stats.mean_batch_size,
            {by_pid[pid]: h for pid, h in headroom.items() if pid in by_pid})
        self.metrics.unsent_aborts.set(self.pool.num_unsent_aborts)


def engine_report(b) -> EngineReport:
    """One backend (`backend_pool.BackendConn`) as vLLM's per-engine metrics see it."""
    load, info = b.load, b.info
    return EngineReport(
        engine=b.address, healthy=b.healthy, num_running=load.num_running,
        num_waiting=load.num_waiting, kv_cache_usage=b.kv_cache_usage,
        num_prefix_queries=load.num_prompt_tokens, num_prefix_hits=load.num_cached_prompt_tokens,
        num_preemptions=load.num_preemptions,
        block_size=info.block_size if info is not None else 0,
        cache_dtype=(info.kv_cache_dtype or "auto") if info is not None else "auto",
        enable_prefix_caching=bool(info.enable_prefix_caching) if info is not None else False,
        num_blocks=info.num_kv_blocks if info is not None else 0,
        spec_decode=tuple((c.source, c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens,
                           tuple(c.num_accepted_tokens_per_pos)) for c in load.spec_decode))
