"""Engine: continuous batching around the shared scheduler.

    step():  plan = scheduler.schedule()       # scheduler.StepScheduler (+ BlockManager)
             out = runner.execute(plan)        # backend.runner.ModelRunner
             finished = scheduler.update(plan, result)

The step splits at the device: `begin_step()` schedules and launches (on CUDA it returns while
the device runs), `finish_step()` reads the tokens back and updates. `step()` is the two back to
back. The worker does its host work for the previous step (sending outputs, reading new
messages) between the two when `overlaps_device` is set, so that work is off the step's critical
path:

    worker:  begin_step(k) | send outputs(k-1), drain socket | finish_step(k) -> outputs(k)
    device:        [=========== step k ===========]

While a step is in flight, new requests only join the waiting queue and an abort of a request in
the in-flight plan is applied after that step's update (its blocks are being written).

The engine adds what the policy core does not know: sampling parameters and seeds per request,
stop-token decisions, and the per-step report of new tokens (`RequestOutput` records).
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field, replace

from backend.host_kv import HostKVCache
from backend.runner import LaunchedStep, ModelRunner
from backend.sampler import SamplingParams, TokenLogprobs
from backend.step_io import SampleSpec
from scheduler.capacity import DEFAULT_CAPACITY
from scheduler.host_tier import SwapCostModel
from scheduler.step_scheduler import SchedulerConfig, StepPlan, StepResult, StepScheduler


@dataclass(frozen=True)
class EngineConfig:
    """Capacity of one engine; `num_blocks` is fixed once the KV pool is allocated."""
    max_model_len: int
    num_blocks: int
    block_size: int = DEFAULT_CAPACITY.block_size
    max_num_seqs: int = DEFAULT_CAPACITY.max_num_seqs
    max_num_batched_tokens: int = DEFAULT_CAPACITY.max_num_batched_tokens
    enable_prefix_caching: bool = True
    num_host_blocks: int = 0  # host-memory KV tier (backend.host_kv); 0: none

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(
            max_model_len=self.max_model_len, num_blocks=self.num_blocks,
            max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
            block_size=self.block_size, enable_prefix_caching=self.enable_prefix_caching,
            num_host_blocks=self.num_host_blocks)


@dataclass
class RequestOutput:
    """What one request gained in one step (new tokens may be empty for a finish-only record)."""
    request_id: str
    new_token_ids: list[int]
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length" | "abort" | None
    num_prompt_tokens: int = 0
    num_completion_tokens: int = 0
    num_cached_tokens: int = 0


@dataclass(slots=True)
class InFlightStep:
    """A step between `Engine.begin_step` and `Engine.finish_step`."""
    plan: StepPlan
    launched: LaunchedStep
    request_ids: set[str]  # every request with a chunk in the plan
    aborts: set[str] = field(default_factory=set)  # aborted while in flight: drop after update
    start: float = 0.0  # perf_counter at launch (the prefill-rate measurement)


@dataclass
class _RequestState:
    params: SamplingParams
    seed: int
    num_prompt_tokens: int
    num_generated: int = 0
    # token history, kept only for requests with penalties (the sampler reads it)
    prompt_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    min_tokens_banned: tuple[int, ...] = ()  # ids masked while num_generated < min_tokens


class Engine:
    def __init__(self, runner: ModelRunner, config: EngineConfig,
                 eos_token_ids: tuple[int, ...] = (), host_kv: HostKVCache | None = None) -> None:
        if config.num_blocks != runner.kv.num_blocks or config.block_size != runner.kv.block_size:
            raise ValueError("engine config and KV pool disagree on num_blocks / block_size")
        if config.num_host_blocks != (host_kv.num_blocks if host_kv is not None else 0):
            raise ValueError("engine config and host KV pool disagree on num_host_blocks")
        self.host_kv = host_kv
        self.runner = runner
        self.config = config
        self.eos_token_ids = tuple(eos_token_ids)
        self.scheduler = StepScheduler(config.scheduler_config())
        self.states: dict[str, _RequestState] = {}
        self._seed_rng = random.Random()
        self._inflight: InFlightStep | None = None
        if host_kv is not None:
            # the swap rule's copy rate, measured now; its prefill rate is measured as steps run
            # (until then every preemption with full blocks swaps)
            self.scheduler.swap_cost = SwapCostModel(host_kv.block_bytes,
                                                     host_kv.measure_bandwidth(), float("inf"))

    # ---- requests ------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    arrival_time: float = 0.0, priority: int = 0) -> str | None:
        """Queue a request; returns the reason it was refused, or None."""
        vocab = self.runner.model.config.vocab_size
        if any(not 0 <= t < vocab for t in prompt_token_ids):
            return f"prompt has token ids outside [0, {vocab})"
        if not 0.0 <= params.top_p <= 1.0 or params.temperature < 0:
            return "temperature must be >= 0 and top_p in [0, 1]"
        reason = _check_processors(params, vocab)
        if reason is not None:
            return reason
        rejection = self.scheduler.add_request(request_id, list(prompt_token_ids), params.max_tokens,
                                               arrival_time, priority)
        if rejection is not None:
            return rejection.reason
        seed = params.seed if params.seed is not None else self._seed_rng.getrandbits(62)
        state = _RequestState(params, seed & ((1 << 62) - 1), len(prompt_token_ids))
        if params.uses_penalties:
            state.prompt_ids = list(prompt_token_ids)
        if params.min_tokens > 0:
            eos = () if params.ignore_eos else self.eos_token_ids
            state.min_tokens_banned = tuple(dict.fromkeys(params.stop_token_ids + eos))
        self.states[request_id] = state
        return None

    def abort(self, request_id: str) -> RequestOutput | None:
        """Drop a request and free its blocks; its final record, or None if unknown. A request
        in the plan of the step in flight is dropped when that step finishes; its record then
        comes out of `finish_step` instead."""
        if self._inflight is not None and request_id in self._inflight.request_ids:
            if request_id in self.states:
                self._inflight.aborts.add(request_id)
            return None
        done = self.scheduler.abort(request_id)
        state = self.states.pop(request_id, None)
        if done is None or state is None:
            return None
        return RequestOutput(request_id, [], [], "abort", done.num_prompt_tokens,
                             len(done.output_token_ids), done.num_cached_tokens)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    @property
    def request_ids(self) -> list[str]:
        return list(self.states)

    # ---- the step ------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        return self.finish_step(self.begin_step())

    @property
    def overlaps_device(self) -> bool:
        """True where `begin_step` returns before the device is done (CUDA), so host work put
        between it and `finish_step` runs in the device's shadow. On the CPU the forward pass
        runs inside `begin_step` and there is no shadow to use."""
        return self.runner.device.type != "cpu"

    def begin_step(self) -> InFlightStep:
        """Schedule the next step and launch it (see the module docstring)."""
        if self._inflight is not None:
            raise RuntimeError("begin_step while a step is in flight: finish_step it first")
        plan = self.scheduler.schedule()
        if self.host_kv is not None:  # tier copies first: this step reads and overwrites them
            self.host_kv.run(self.scheduler.block_manager.host.take_copies())
        specs = {c.request_id: self._spec(c.request_id) for c in plan.chunks if c.sample}
        start = time.perf_counter()
        step = InFlightStep(plan, self.runner.launch(plan.chunks, specs),
                            {c.request_id for c in plan.chunks}, start=start)
        self._inflight = step
        return step

    def finish_step(self, step: InFlightStep) -> list[RequestOutput]:
        """Read the launched step's tokens back, update the scheduler; the step's records."""
        self._inflight = None
        plan = step.plan
        result, logprobs = self._stop_checks(self.runner.finish(step.launched))
        if self.host_kv is not None:
            self._measure_prefill(plan, time.perf_counter() - step.start)
        finished = self.scheduler.update(plan, result)
        outputs = self._outputs(plan, result, logprobs, finished)
        if step.aborts:
            done = {o.request_id for o in outputs if o.finish_reason is not None}
            outputs = [o for o in outputs if o.request_id not in step.aborts or
                       o.request_id in done]
            outputs += [r for rid in step.aborts if rid not in done
                        for r in [self.abort(rid)] if r is not None]
        return outputs

    def _measure_prefill(self, plan: StepPlan, seconds: float) -> None:
        """Keep the swap rule's recompute rate: a running mean of seconds per token over steps
        that are mostly prefill (a recompute is a prefill). Decodes in the step count against
        it, so it overestimates a little."""
        num_prefill = sum(len(c.token_ids) for c in plan.chunks if c.is_prefill)
        if num_prefill < 32 or num_prefill < plan.num_batched_tokens // 2:
            return
        rate = seconds / plan.num_batched_tokens
        cost = self.scheduler.swap_cost
        old = cost.prefill_s_per_token
        new = rate if not math.isfinite(old) else 0.8 * old + 0.2 * rate
        cost = self.scheduler.swap_cost = replace(cost, prefill_s_per_token=new)
        bm = self.scheduler.block_manager
        bm.load_host_hits = cost.should_load(bm.block_size)

    def _stop_checks(self, out) -> tuple[StepResult, dict[str, TokenLogprobs | None]]:
        stopped = set()
        for rid, token in out.token_ids.items():
            p = self.states[rid].params
            if token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids):
                stopped.add(rid)
        return StepResult(sampled=out.token_ids, stopped=stopped), out.logprobs

    def _spec(self, request_id: str) -> SampleSpec:
        s = self.states[request_id]
        banned = s.min_tokens_banned if s.num_generated < s.params.min_tokens else ()
        return SampleSpec(s.params, s.seed, s.num_generated, s.prompt_ids, s.output_ids, banned)

    def _outputs(self, plan: StepPlan, result: StepResult, logprobs: dict,
                 finished: list) -> list[RequestOutput]:
        outputs: dict[str, RequestOutput] = {}
        requests = self.scheduler.requests
        for rid, token in result.sampled.items():
            state = self.states[rid]
            state.num_generated += 1
            if state.params.uses_penalties:
                state.output_ids.append(token)
            seq = requests.get(rid)
            lp = logprobs.get(rid)
            outputs[rid] = RequestOutput(
                rid, [token], [lp] if lp is not None else [], None, state.num_prompt_tokens,
                state.num_generated, seq.num_cached_tokens if seq is not None else 0)
        for f in finished:
            out = outputs[f.request_id]
            out.finish_reason = f.finish_reason
            out.num_cached_tokens = f.num_cached_tokens
            del self.states[f.request_id]
        return list(outputs.values())

    # ---- idle checks ---------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Scheduler and block-manager invariants, and the engine's own request map."""
        self.scheduler.check_integrity()
        assert set(self.states) == set(self.scheduler.requests), "engine/scheduler requests differ"


def _check_processors(params: SamplingParams, vocab_size: int) -> str | None:
    """The logit processors' fields, checked again here (the gateway checks them first)."""
    values = (params.min_p, params.repetition_penalty, params.presence_penalty,
              params.frequency_penalty, *(b for _, b in params.logit_bias))
    if not all(math.isfinite(v) for v in values):
        return "sampling parameters must be finite numbers"
    if not 0.0 <= params.min_p <= 1.0:
        return "min_p must be in [0, 1]"
    if not params.repetition_penalty > 0.0:
        return "repetition_penalty must be > 0"
    if params.min_tokens < 0 or params.min_tokens > params.max_tokens:
        return "min_tokens must be in [0, max_tokens]"
    if any(not 0 <= i < vocab_size for i, _ in params.logit_bias):
        return f"logit_bias has token ids outside [0, {vocab_size})"
    if any(not 0 <= i < vocab_size for i in params.stop_token_ids):
        return f"stop_token_ids has ids outside [0, {vocab_size})"
    return None
