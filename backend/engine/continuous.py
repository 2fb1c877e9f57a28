"""Engine: continuous batching around the shared scheduler.

    step():  plan = scheduler.schedule()       # scheduler.StepScheduler (+ BlockManager)
             out = runner.execute(plan)        # backend.runner.step.ModelRunner
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

Async scheduling (`advance()`, the serving loop on CUDA): step k+1 is planned and launched
before step k's tokens are read back, so the host's schedule / input preparation / launch /
update run while the device works and the device never waits for them:

    advance():  schedule(k+1), launch(k+1)     # k+1's decodes read k's ids on the device
                read back k: set the real tokens, stop checks -> outputs(k)
                update(k+1) with placeholder tokens (so that k+2 can be planned next turn)
    device:     [==== step k ====][==== step k+1 ====][==== step k+2 ...

This needs step k's ids on the device: every sampling row of step k greedy, no logprobs, no
logit processors (`_RequestState.plain_greedy`); otherwise, and with a host KV tier, the turn
reads k back before planning k+1 (the synchronous order). The scheduler sees each step's update
with placeholder tokens (length finishes are exact, since they do not depend on the token); the
real tokens replace them (`StepScheduler.set_token`) before the next update can hash a block
holding one. A sequence that hit a stop token in step k was planned into step k+1 anyway: it is
finished when k is read back (blocks freed; the device writes the dead slot before any later
step can reuse it, the stream being ordered) and its step-(k+1) token is dropped, so the tokens
a client sees are those of the synchronous loop. An abort lands at once (same argument).

Speculative decoding (`scheduler.speculation`, issue 28): before planning, the speculator gives
decoding sequences draft tokens (the request's prediction, prompt lookup, the session's earlier
outputs) in the number the load policy allows; the scheduler turns those decodes into verify
chunks (the last token and the drafts, slots reserved), the runner samples a target at every
position exactly as a plain decode there would (same noise counter, the drafts in the penalties'
history), and `_verify` accepts the drafts while they equal their targets, appends the first
target that differs (or the one after the last draft) and cuts at a stop token; the scheduler
gives the rejected drafts' slots back. Greedy and seeded outputs are those of decoding without
speculation. A step with drafts needs every token read back, so it is never pipelined: `advance`
reads the step in flight back first when the policy might draft (not at saturation, and backing
off while no draft comes).

The engine adds what the policy core does not know: sampling parameters and seeds per request,
stop-token decisions, and the per-step report of new tokens (`RequestOutput` records).
"""
from __future__ import annotations

import math
import os
import random
import time
from dataclasses import dataclass, field, replace

from backend.engine.interface import EngineLoad
from backend.kv.host_tier import HostKVCache
from backend.runner.sampler import SamplingParams, TokenLogprobs
from backend.runner.step import LaunchedStep, ModelRunner
from backend.runner.step_io import SampleSpec
from proto.sampling import check_sampling
from scheduler.capacity import DEFAULT_CAPACITY, PrefillCap
from scheduler.deadline_order import DEFAULT_MARGIN_S
from scheduler.host_tier import SwapCostModel
from scheduler.speculation import SpeculationConfig, Speculator, StepCostModel, accept_drafts
from scheduler.step_scheduler import SchedulerConfig, StepPlan, StepResult, StepScheduler

# the token an update under async scheduling records until the real one is read back
PLACEHOLDER_TOKEN = 0
# `launch_deadline`: launch the next step this long (plus twice the host's launch time) before
# the running step is expected to end on the device
LAUNCH_SLACK_S = 0.001


# What a speculating step pays for giving up async scheduling, in multiples of the measured
# planning + launch time (`_drafts`); TIDEGATE_SPEC_FIXED_FACTOR overrides it for an A/B on the
# GPU (read once at import).
SPEC_FIXED_FACTOR = float(os.environ.get("TIDEGATE_SPEC_FIXED_FACTOR", "2"))


@dataclass(frozen=True)
class EngineConfig:
    """Capacity of one engine; `num_blocks` is fixed once the KV pool is allocated."""
    max_model_len: int
    num_blocks: int
    block_size: int = DEFAULT_CAPACITY.block_size
    max_num_seqs: int = DEFAULT_CAPACITY.max_num_seqs
    max_num_batched_tokens: int = DEFAULT_CAPACITY.max_num_batched_tokens
    enable_prefix_caching: bool = True
    num_host_blocks: int = 0  # host-memory KV tier (backend.kv.host_tier); 0: none
    prefill_cap: PrefillCap = field(default_factory=PrefillCap)  # prefill per step while decoding
    # speculative decoding (scheduler.speculation): the server's default; None: off
    speculation: SpeculationConfig | None = None
    # waiting requests admitted Fast first (SchedulerConfig.waiting_by_class; off: FCFS). On
    # one 33B H200 backend at 1.5x capacity (simulated, s13 profile) FCFS left Fast TTFT p90
    # at 0.98 s with half of Fast refused; by class 0.37 s, none refused (issue 31, s15)
    waiting_by_class: bool = False
    # a waiting request near its TTFT deadline starts first (SchedulerConfig.deadline_order)
    deadline_order: bool = False
    deadline_margin_s: float = DEFAULT_MARGIN_S

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(
            max_model_len=self.max_model_len, num_blocks=self.num_blocks,
            max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
            block_size=self.block_size, enable_prefix_caching=self.enable_prefix_caching,
            num_host_blocks=self.num_host_blocks, prefill_cap=self.prefill_cap,
            waiting_by_class=self.waiting_by_class, deadline_order=self.deadline_order,
            deadline_margin_s=self.deadline_margin_s)


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
    # speculative decoding, cumulative (the wire's RequestOutput counters): draft tokens fed and
    # accepted (all sources, none past a stop); OpenAI's accepted / rejected prediction tokens:
    # while running, the prediction's tokens the output used / went past (its drafting's
    # alignment); at the finish, the gateway's count (scheduler.prediction_usage), exactly
    num_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0
    num_accepted_prediction_tokens: int = 0
    num_rejected_prediction_tokens: int = 0


@dataclass(slots=True)
class InFlightStep:
    """A step between its launch and its read-back (`begin_step` / `finish_step`, or two
    `advance()` turns)."""
    plan: StepPlan
    launched: LaunchedStep
    request_ids: set[str]  # every request with a chunk in the plan (synchronous steps)
    aborts: set[str] = field(default_factory=set)  # aborted while in flight: drop after update
    start: float = 0.0  # perf_counter at launch (the prefill-rate measurement)
    start_wall: float = 0.0  # time.time() at launch (the step log)
    end: float = 0.0  # perf_counter when its tokens were read back
    launched_at: float = 0.0  # perf_counter once its work was queued (pipelined steps)
    device_s: float | None = None  # its device time (CUDA timing events; greedy steps)
    device_idle_s: float | None = None  # the device's wait for it after the step before
    # async scheduling: the update was applied with placeholder tokens right after launch
    pipelined: bool = False
    finished: list = field(default_factory=list)  # what that update finished (by length)
    sampled_rows: dict[str, int] = field(default_factory=dict)  # request -> row of its id
    # structured output on the device-greedy path: the chunks whose argmax is redone under
    # their grammar's mask before the ids are read back (Engine._apply_masks)
    mask_rows: list[int] = field(default_factory=list)
    mask_grammars: list = field(default_factory=list)
    masks: object = None  # backend.runner.grammar.StepMasks, started before the launch
    masks_applied: bool = False
    planned_at: float = 0.0  # perf_counter when its planning was done (the launch began)
    read_at: float = 0.0  # perf_counter when the runner's read-back returned

    def host_phases(self) -> tuple[float, float, float, float] | None:
        """Seconds of (planning, the launch's host work, launch to read-back, handling after
        the read-back): where a step's cadence goes beside its device time (the step log)."""
        if not (self.start <= self.planned_at <= self.launched_at <= self.read_at <= self.end):
            return None
        return (self.planned_at - self.start, self.launched_at - self.planned_at,
                self.read_at - self.launched_at, self.end - self.read_at)


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
    # greedy without logprobs or logit processors: the in-step argmax is its token, so the
    # next step may read it on the device (async scheduling)
    plain_greedy: bool = False
    grammar: object = None  # backend.runner.grammar.RequestGrammar (structured output)


class Engine:
    def __init__(self, runner: ModelRunner, config: EngineConfig,
                 eos_token_ids: tuple[int, ...] = (), host_kv: HostKVCache | None = None,
                 async_scheduling: bool | None = None) -> None:
        if config.num_blocks != runner.kv.num_blocks or config.block_size != runner.kv.block_size:
            raise ValueError("engine config and KV pool disagree on num_blocks / block_size")
        if config.num_host_blocks != (host_kv.num_blocks if host_kv is not None else 0):
            raise ValueError("engine config and host KV pool disagree on num_host_blocks")
        self.host_kv = host_kv
        self.runner = runner
        self.config = config
        self.eos_token_ids = tuple(eos_token_ids)
        # int4 keys' fill rows keep the last block at full precision: a verify stays in one block
        within_block = getattr(runner, "fill_slots", None) is not None
        self.scheduler = StepScheduler(replace(config.scheduler_config(),
                                               draft_within_block=within_block))
        self.states: dict[str, _RequestState] = {}
        # speculative decoding (scheduler.speculation): drafts and the load policy; only our own
        # runner verifies (not a tensor-parallel leader's)
        spec = config.speculation
        self.speculator: Speculator | None = None
        if spec is not None and spec.enabled and isinstance(runner, ModelRunner):
            self.speculator = Speculator(spec, StepCostModel())
        self._seed_rng = random.Random()
        # structured output (backend.runner.grammar.GrammarManager), set by the
        # assembler when the model has a tokenizer; None: requests with a grammar refused
        self.grammars = None
        self._inflight: InFlightStep | None = None
        self._last_step: InFlightStep | None = None
        self.serving_info: dict = {}  # what the assembler's serving transforms did
        self._last_end = 0.0  # perf_counter of the last read-back
        self._step_s = 0.0  # mean step time, s (the deadline order's; `_finish`)
        # prefix pull served off the loop (issue 34, backend.server.kv_serve): the lock the
        # serving loop holds while it touches the block manager, released here while the device
        # works (the CPU forward in launch; the wait in finish), when a KV server reads blocks
        self.step_unlocked: object = None
        # device seconds of each graph's steps (CUDA timing events), by id of the captured
        # graph, and the host's seconds to plan and launch a step: `launch_deadline`
        self._device_s: dict[int, float] = {}
        self._launch_s = 0.0
        # plan step k+1 before step k is read back (`advance`); default where the device runs
        # asynchronously to the host. Not with a host tier: its copies run at plan time. Not
        # for a wrapped runner (tensor parallelism's LeaderRunner: the other ranks get the plan's
        # token ids, not the device-side ones).
        if async_scheduling is None:
            async_scheduling = runner.device.type != "cpu" and isinstance(runner, ModelRunner)
        self.async_scheduling = async_scheduling and host_kv is None
        if host_kv is not None:
            # the swap rule's copy rate, measured now; its prefill rate is measured as steps run
            # (until then every preemption with full blocks swaps)
            self.scheduler.swap_cost = SwapCostModel(host_kv.block_bytes,
                                                     host_kv.measure_bandwidth(), float("inf"))

    # ---- requests ------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    arrival_time: float = 0.0, priority: int = 0,
                    prediction: list[int] | None = None, speculation_off: bool = False,
                    max_draft_tokens: int = 0, deadline: float = 0.0) -> str | None:
        """Queue a request; returns the reason it was refused, or None. `deadline`: its TTFT
        deadline, time.monotonic() seconds (0: none; SchedulerConfig.deadline_order). `prediction`: its
        predicted output's ids (Predicted Outputs); `speculation_off` / `max_draft_tokens`: its
        own control of speculative decoding (0: the server's maximum)."""
        vocab = self.runner.model.config.vocab_size
        if any(not 0 <= t < vocab for t in prompt_token_ids):
            return f"prompt has token ids outside [0, {vocab})"
        if prediction is not None and any(not 0 <= t < vocab for t in prediction):
            return f"prediction has token ids outside [0, {vocab})"
        if max_draft_tokens < 0:
            return "max_draft_tokens must be >= 0"
        invalid = check_sampling(params, vocab, backend=True)  # the worker's check, again for
        if invalid is not None:                                # in-process callers
            return invalid.message
        if params.grammar is not None and self.grammars is None:
            return "structured output needs the model's tokenizer (no grammar engine)"
        rejection = self.scheduler.add_request(request_id, list(prompt_token_ids), params.max_tokens,
                                               arrival_time, priority, deadline)
        if rejection is not None:
            return rejection.reason
        seed = params.seed if params.seed is not None else self._seed_rng.getrandbits(62)
        state = _RequestState(params, seed & ((1 << 62) - 1), len(prompt_token_ids))
        # (a grammar alone keeps a greedy request on the device path: Engine._apply_masks)
        state.plain_greedy = params.greedy and not params.logprobs and \
            not replace(params, grammar=None).changes_logits
        if params.grammar is not None and not isinstance(self.runner, ModelRunner):
            state.plain_greedy = False  # mask_greedy is ModelRunner's (not a TP leader's)
        if params.uses_penalties:
            state.prompt_ids = list(prompt_token_ids)
        if params.min_tokens > 0:
            eos = () if params.ignore_eos else self.eos_token_ids
            state.min_tokens_banned = tuple(dict.fromkeys(params.stop_token_ids + eos))
        self.states[request_id] = state
        if params.grammar is not None:  # compiled on the grammar thread (cached)
            state.grammar = self.grammars.start(params.grammar, params.max_tokens)
        if self.speculator is not None:
            self.speculator.add(request_id, list(prompt_token_ids), prediction, max_draft_tokens,
                                speculation_off)
        return None

    def abort(self, request_id: str) -> RequestOutput | None:
        """Drop a request and free its blocks; its final record, or None if unknown. A request
        in the plan of a synchronous step in flight is dropped when that step finishes; its
        record then comes out of `finish_step` instead. Under async scheduling the in-flight
        step's update is already applied: the abort lands at once and the step's token for it
        is dropped at read-back (see the module docstring)."""
        inflight = self._inflight
        if inflight is not None and not inflight.pipelined and \
                request_id in inflight.request_ids:
            if request_id in self.states:
                inflight.aborts.add(request_id)
            return None
        done = self.scheduler.abort(request_id)
        state = self.states.pop(request_id, None)
        if self.speculator is not None:
            self.speculator.finish(request_id, record=False)
        if state is None:
            return None
        # done is None: finished by length in a pipelined update, not read back yet
        return RequestOutput(request_id, [], [], "abort", state.num_prompt_tokens,
                             state.num_generated, done.num_cached_tokens if done else 0)

    def has_unfinished(self) -> bool:
        """Requests left, or a step whose tokens are not read back yet."""
        return self.scheduler.has_unfinished() or self._inflight is not None

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
        step = self._launch(None, pipelined=False)
        self._inflight = step
        return step

    def _launch(self, prev: InFlightStep | None, pipelined: bool) -> InFlightStep:
        """Plan and launch one step. `prev`: a pipelined step not read back yet, whose sampled
        ids this step's decodes read on the device. `pipelined`: this step may be followed
        before its read-back (then it records its sampled rows, and `advance` applies its
        update with placeholders)."""
        start, start_wall = time.perf_counter(), time.time()
        # drafts need every token read back: not over a pipelined step's placeholders
        drafts = self._drafts() if self.speculator is not None and prev is None else None
        if drafts:  # a constrained request's drafts stop where its grammar would
            drafts = self._grammar_drafts(drafts)
        # the deadline order's clock (the worker's deadlines are time.monotonic()) and step
        now = time.monotonic() if self.scheduler.urgent is not None else None
        plan = self.scheduler.schedule(drafts=drafts, now=now, step_s=self._step_s)
        if self.host_kv is not None:  # tier copies first: this step reads and overwrites them
            self.host_kv.run(self.scheduler.block_manager.host.take_copies())
        states = self.states
        sampled = [c.request_id for c in plan.chunks if c.sample]
        specs = None  # all plain greedy: the runner's in-step argmax, no per-request spec
        # (a verify samples every position on the host side: specs for all, and never pipelined:
        # the runner's launched.greedy is False)
        if drafts or not all(states[rid].plain_greedy for rid in sampled):
            specs = {rid: self._spec(rid) for rid in sampled}
            self._start_masks(specs, plan.chunks, early=prev is None)
        # greedy rows with a grammar (device path): argmax redone under the mask before read-back
        mask_rows = [] if specs is not None else [
            i for i, c in enumerate(plan.chunks) if c.sample and states[c.request_id].grammar]
        kw = {"defer_readback": True} if mask_rows else {}
        mask_grammars = [states[plan.chunks[i].request_id].grammar for i in mask_rows]
        # every earlier token consumed (no step pending): the masks are computed beside the forward
        early = self.grammars.submit(mask_grammars) if mask_rows and prev is None else None
        if prev is not None:  # this step's decodes read prev's sampled ids on the device
            kw["gpu_src"] = prev.sampled_rows
        lock = self.step_unlocked if self.runner.device.type == "cpu" else None
        planned_at = time.perf_counter()
        if lock is None:  # (CUDA: a launch may capture a graph; the KV server then waits)
            launched = self.runner.launch(plan.chunks, specs, **kw)
        else:
            lock.release()
            try:
                launched = self.runner.launch(plan.chunks, specs, **kw)
            finally:
                lock.acquire()
        launched_at = time.perf_counter()
        self._launch_s = 0.8 * self._launch_s + 0.2 * (launched_at - start)
        if pipelined and launched.greedy:
            step = InFlightStep(plan, launched, set(), start=start, start_wall=start_wall,
                                pipelined=True, launched_at=launched_at)
            step.sampled_rows = {c.request_id: i for i, c in enumerate(plan.chunks) if c.sample}
        else:
            step = InFlightStep(plan, launched, {c.request_id for c in plan.chunks}, start=start,
                                start_wall=start_wall)
        step.mask_rows, step.mask_grammars, step.masks = mask_rows, mask_grammars, early
        step.planned_at, step.launched_at = planned_at, launched_at
        return step

    def _apply_masks(self, step: InFlightStep) -> None:
        """Structured output, device-greedy rows: once every token before this step is consumed
        by its request's grammar, the step's masks (computed beside the forward when they could
        be, else now, while the step still runs on the device) redo those rows' argmax and the
        step's ids are queued for the host. Before the step's read-back and the next launch."""
        if not step.mask_rows or step.masks_applied:
            return
        masks = step.masks if step.masks is not None else self.grammars.submit(step.mask_grammars)
        self.runner.mask_greedy(step.launched, step.mask_rows, masks.result())
        step.masks_applied = True

    def advance(self) -> list[RequestOutput]:
        """One turn of the serving loop: launch the next step (if there is work) and read back
        the one launched before it; returns that step's records (none on the first turn).
        With async scheduling the next step is launched before the read-back (see the module
        docstring); otherwise after it. Either way a step is left in flight for the caller's
        host work to overlap (`settle()` reads it back without launching another)."""
        prev = self._inflight
        self._inflight = None
        self._last_step = None
        outputs: list[RequestOutput] = []
        if prev is not None and (not prev.pipelined or self._may_speculate()):
            outputs = self._finish(prev)  # (drafts are proposed from the real tokens)
            prev = None
        nxt = None
        if self.scheduler.has_unfinished():
            nxt = self._launch(prev, pipelined=self.async_scheduling)
        if prev is not None:
            outputs = self._finish(prev)
        if nxt is not None:
            self._apply_masks(nxt)  # (prev's tokens are consumed now)
            if nxt.pipelined:  # so that the next turn can plan the step after it
                placeholders = dict.fromkeys(nxt.sampled_rows, PLACEHOLDER_TOKEN)
                nxt.finished = self.scheduler.update(nxt.plan, StepResult(sampled=placeholders))
            self._inflight = nxt
            if self.speculator is not None and self.async_scheduling:
                # prompt-lookup indexes catch up while the device runs the step, not in the
                # next step's planning (which a drafting step's device waits for); the
                # simulator does it at the same point (sims.speculation), on the same condition
                self.speculator.index_ahead()
        return outputs

    # ---- speculative decoding ------------------------------------------------------------
    def _may_speculate(self) -> bool:
        """Whether the next step might carry drafts (then it is planned after the step in
        flight is read back, as drafts follow the real tokens): the load leaves headroom under
        the knee and some decoding sequence has speculation on. O(1) at saturation. After a
        read-back that found nothing to draft, the next 1, 3, 7, 15, 16 turns stay pipelined
        (async scheduling is not given up for drafts that do not come), unless a prediction
        finds its place again (`scheduler.speculation.DraftBackoff`)."""
        sp = self.speculator
        if sp is None:
            return False
        if sp.backoff.skip():
            return False
        sched = self.scheduler
        num = sched.decodes.num_decoding
        if num == 0 or sp.policy.saturated(num + min(
                sched.num_waiting_tokens, self.config.max_num_batched_tokens - num)):
            return False
        return any(not st.off for st in sp.states.values())

    def _drafts(self) -> dict[str, list[int]] | None:
        """The policy's draft tokens per decoding sequence for the next step."""
        sp, sched = self.speculator, self.scheduler
        seqs = sched.decoding_sequences()
        if not seqs:
            return None
        num_prefill = sched.planned_prefill_tokens()
        if sp.policy.saturated(len(seqs) + num_prefill):  # O(1) at saturation
            sp.policy.num_steps_off_by_load += 1
            return None
        loads = []
        for q in seqs:
            load = sp.load(q.request_id, q.max_tokens - q.num_output_tokens, q.rank)
            if load is not None:
                loads.append(load)
        # a mixed graph computes logits at max_num_seqs + 1 rows at most: one per chunk (at
        # most one per running sequence) and one per draft (runner.step_io.logit_rows)
        max_rows = None
        if getattr(self.runner, "graphs", None) is not None:
            # the step's chunks are the running sequences and those admitted by this very
            # schedule (up to max_num_seqs): a waiting request's prefill chunk takes a row too
            # (the H200's graph tests overflowed by one row before this counted them)
            max_seqs = self.config.max_num_seqs
            max_rows = max_seqs + 1 - min(max_seqs, len(sched.running) + sched.num_waiting)
        # a speculating step is read back before the next is planned: under async scheduling
        # the host's planning, launch and read-back are on the device's critical path (taken
        # as twice the measured planning and launch)
        fixed_s = SPEC_FIXED_FACTOR * self._launch_s if self.async_scheduling else 0.0
        drafts = sp.plan(loads, len(seqs), num_prefill, max_rows, fixed_s) or None
        sp.backoff.asked(bool(drafts))
        return drafts

    def _verify(self, plan: StepPlan, out) -> dict[str, list[int]]:
        """Turn the verifies' targets into tokens: the accepted drafts (cut after a stop token)
        and the token after them go into `out.token_ids` / `out.logprobs` (a list per verify);
        returns the accepted drafts per request (StepResult.accepted)."""
        accepted: dict[str, list[int]] = {}
        sp, states, eos = self.speculator, self.states, self.eos_token_ids
        for c in plan.chunks:
            targets = out.targets.get(c.request_id)
            if targets is None or c.request_id not in states:
                continue
            rid, k = c.request_id, c.num_draft
            drafts = c.token_ids[len(c.token_ids) - k:]
            a = accept_drafts(drafts, targets)
            new = [*drafts[:a], targets[a]]
            p = states[rid].params
            for i, t in enumerate(new):  # a stop token ends the output where it is
                if t in p.stop_token_ids or (not p.ignore_eos and t in eos):
                    new = new[:i + 1]
                    break
            out.token_ids[rid] = new[-1]
            out.logprobs[rid] = out.target_logprobs[rid][:len(new)]
            accepted[rid] = new[:-1]
            if sp is not None:  # accepted: the drafts kept (none past a stop token)
                sp.verified(rid, k, len(new) - 1)
        return accepted

    def settle(self) -> list[RequestOutput]:
        """Read back the step in flight, if any, without launching another; its records."""
        step, self._inflight = self._inflight, None
        self._last_step = None
        return self._finish(step) if step is not None else []

    def launch_deadline(self) -> float | None:
        """The perf_counter time by which the next step must be launched for the device not to
        idle after the step in flight, or None (launch at once). Launching later than "at once"
        but before this lets requests that arrive meanwhile join the next step, as they would in
        the synchronous loop (planning right after a read-back would leave them a step behind).
        Known only for a pipelined step that replays a graph: decode-only or mixed (prefill
        chunks too, so that a request arriving during a long prefill step joins the step right
        after it, not the one after that), from that graph's measured device time (or, before
        it ran, the time it took when captured)."""
        step = self._inflight
        if step is None or not step.pipelined or not self.scheduler.has_unfinished():
            return None
        launch = step.launched.graph_launch
        if launch is None:
            return None
        device_s = self._device_s.get(id(launch.captured))
        if device_s is None:  # not run yet: the graph's own time at capture (CUDA), if any
            device_s = launch.captured.device_s
            if device_s is None:
                return None
        begins = max(step.start, self._last_end)  # on the device: after the step before it
        return begins + device_s - 2 * self._launch_s - LAUNCH_SLACK_S

    def _measure_device(self, step: InFlightStep) -> None:
        """Its device time (kept per captured graph): CUDA's timing events around it; else (the
        CPU) from when it could start (queued, and the step before it read back) to its
        read-back. The estimate follows a shorter step at once and a longer one slowly: one
        graph serves steps of different attention work (a mixed bucket: chunks at different
        contexts), and an estimate above the real time idles the device until the deadline,
        while one below it only lets fewer late arrivals join (see `launch_deadline`)."""
        end, last = step.end, self._last_end
        self._last_end = end
        launch = step.launched.graph_launch
        if launch is None or not step.plan.chunks:
            return
        key = id(launch.captured)
        seconds = step.device_s
        if seconds is None:
            seconds = end - max(step.launched_at, last)
        old = self._device_s.get(key)
        self._device_s[key] = seconds if old is None or seconds < old else \
            0.7 * old + 0.3 * seconds

    def _device_seconds(self, step: InFlightStep) -> float | None:
        """The step's device time; also sets its `device_idle_s` (CUDA timing events)."""
        slot = step.launched.readback
        if slot < 0:
            return None
        step.device_idle_s = self.runner.buffers.device_idle_seconds(slot)
        return self.runner.buffers.device_seconds(slot)

    # ---- what the worker reports (backend.engine.interface) -----------------------------------
    reports_steps = True

    @property
    def kv_cache_dtype(self) -> str:
        # a tensor-parallel leader's runner holds no pool of its own: its ranks' format is "auto"
        kv = getattr(self.runner, "kv", None)
        return kv.kv_cache_dtype if kv is not None else "auto"

    def load(self) -> EngineLoad:
        sched = self.scheduler
        bm = sched.block_manager
        host = bm.host
        return EngineLoad(
            num_running=sched.num_running, num_waiting=sched.num_waiting,
            num_free_blocks=bm.num_free_blocks, num_total_blocks=self.config.num_blocks,
            num_outstanding_tokens=sum(s.params.max_tokens - s.num_generated
                                       for s in self.states.values()),
            num_preemptions=sched.num_preemptions,
            num_swap_preemptions=sched.num_swap_preemptions,
            num_host_blocks=host.num_blocks if host is not None else 0,
            num_host_used_blocks=host.num_used_blocks if host is not None else 0,
            num_host_hit_tokens=bm.num_host_hit_tokens,
            num_prompt_tokens=bm.num_query_tokens, num_cached_prompt_tokens=bm.num_hit_tokens,
            spec_decode=self.speculator.source_counters() if self.speculator is not None else (),
            num_promoted=self.scheduler.num_promoted, **self._pin_figures())

    def _pin_figures(self) -> dict:
        bm = self.scheduler.block_manager
        if not bm.enable_prefix_caching:
            return {}
        pins = bm.pin_status()
        return {"num_pins": pins["pins"], "num_pinned_blocks": pins["pinned_blocks"],
                "pin_budget_blocks": pins["budget_blocks"], "num_pins_refused": pins["refused"],
                "num_pins_expired": pins["expired"]}

    def configure_pins(self, budget_fraction: float) -> None:
        bm = self.scheduler.block_manager
        if bm.enable_prefix_caching and not bm.pin_budget_blocks:
            bm.pin_budget_blocks = int(budget_fraction * bm.num_blocks)

    def request_pin(self, request_id: str, token_ids: list[int], num_tokens: int,
                    ttl_s: float) -> bool | None:
        bm = self.scheduler.block_manager
        if not bm.enable_prefix_caching:
            return None
        return bm.request_pin(request_id, token_ids, num_tokens, ttl_s)

    def record_kv_events(self) -> bool:
        bm = self.scheduler.block_manager
        if not bm.enable_prefix_caching:
            return False
        bm.record_kv_events()
        return True

    def take_kv_events(self) -> list:
        return self.scheduler.block_manager.take_kv_events()

    def prefix_cache_probe(self):
        bm = self.scheduler.block_manager
        return bm.is_cached if bm.enable_prefix_caching else None

    def kv_port(self, model_name: str):
        """Prefix pull's access to this engine's blocks (`backend.kv.transfer.KVPort`, issue 34),
        or None without a prefix cache or a pool of our own (a tensor-parallel leader)."""
        bm = self.scheduler.block_manager
        kv = getattr(self.runner, "kv", None)
        if not bm.enable_prefix_caching or kv is None:
            return None
        from backend.kernels.block_gather import BlockGather
        from backend.kv.transfer import KVPort
        host = self.host_kv
        flush = (lambda: host.run(bm.host.take_copies())) if host is not None else None
        return KVPort(bm, kv, host, BlockGather, model_name, flush)

    @property
    def last_step(self) -> InFlightStep | None:
        """The step whose records `advance` / `settle` / `finish_step` returned last."""
        return self._last_step

    def finish_step(self, step: InFlightStep) -> list[RequestOutput]:
        """Read the launched step's tokens back, update the scheduler; the step's records."""
        self._inflight = None
        return self._finish(step)

    def _finish(self, step: InFlightStep) -> list[RequestOutput]:
        self._last_step = step
        if step.pipelined:
            return self._finish_pipelined(step)
        plan = step.plan
        self._apply_masks(step)
        out = self._read_back(step)
        step.read_at = time.perf_counter()
        states = self.states
        accepted = self._verify(plan, out) if out.targets else None
        # a request finished while this step ran (a stop token read back from the pipelined
        # step before it) has no state any more: its token here is dropped
        live = out.token_ids if all(rid in states for rid in out.token_ids) else \
            {rid: tok for rid, tok in out.token_ids.items() if rid in states}
        result, logprobs = self._stop_checks(out, live)
        if accepted:
            result.accepted = accepted
        step.end = time.perf_counter()
        self._last_end = step.end
        # the deadline order's step time: launch to read-back, an exponential average
        self._step_s += 0.2 * ((step.end - step.start) - self._step_s)
        step.device_s = self._device_seconds(step)
        if self.speculator is not None and plan.chunks:  # the knee: step time by tokens
            self.speculator.policy.cost.observe(
                plan.num_batched_tokens,
                step.device_s if step.device_s is not None else step.end - step.start)
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

    def _read_back(self, step: InFlightStep):
        lock = self.step_unlocked
        if lock is None:
            return self.runner.finish(step.launched)
        lock.release()
        try:
            return self.runner.finish(step.launched)
        finally:
            lock.acquire()

    def _finish_pipelined(self, step: InFlightStep) -> list[RequestOutput]:
        """Read back a step whose update ran with placeholders: set the real tokens, finish
        the requests that sampled a stop token, build the records (see the module docstring)."""
        self._apply_masks(step)
        out = self._read_back(step)
        step.end = step.read_at = time.perf_counter()
        step.device_s = self._device_seconds(step)
        self._measure_device(step)
        if self.speculator is not None and step.device_s is not None and step.plan.chunks:
            # the knee needs the pipelined steps too (most steps under async scheduling): without
            # them the policy saw only its own verify steps and priced every token past them as
            # proportional (the H200's c=8 edit run: drafts stopped at 16 tokens a step)
            self.speculator.policy.cost.observe(step.plan.num_batched_tokens, step.device_s)
        states, scheduler = self.states, self.scheduler
        live = {rid: tok for rid, tok in out.token_ids.items() if rid in states}  # not aborted
        result, logprobs = self._stop_checks(out, live)
        for c in step.plan.chunks:
            if c.sample and c.request_id in live:
                scheduler.set_token(c.request_id, c.start_pos + len(c.token_ids),
                                    live[c.request_id])
        finished = [f for f in step.finished if f.request_id in states]
        if result.stopped:
            by_length = {f.request_id: i for i, f in enumerate(finished)}
            for rid in result.stopped:
                if rid in by_length:  # a stop token on its last allowed token: "stop" wins
                    i = by_length[rid]
                    finished[i] = replace(finished[i], finish_reason="stop")
                else:  # planned into the step in flight: freed now, its next token dropped
                    done = scheduler.abort(rid)
                    if done is not None:
                        finished.append(replace(done, finish_reason="stop"))
        return self._outputs(step.plan, result, logprobs, finished)

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

    def _stop_checks(self, out, token_ids: dict[str, int] | None = None,
                     ) -> tuple[StepResult, dict[str, TokenLogprobs | None]]:
        token_ids = out.token_ids if token_ids is None else token_ids
        stopped = set()
        states, eos = self.states, self.eos_token_ids
        for rid, token in token_ids.items():
            p = states[rid].params
            if p.stop_token_ids and token in p.stop_token_ids or \
                    (not p.ignore_eos and token in eos):
                stopped.add(rid)
        return StepResult(sampled=token_ids, stopped=stopped), out.logprobs

    def _grammar_drafts(self, drafts: dict[str, list[int]]) -> dict[str, list[int]] | None:
        """Each constrained request's draft tokens cut to the prefix its grammar accepts (the
        rest could never be accepted; verifying them would waste the step's positions)."""
        states, out = self.states, {}
        for rid, d in drafts.items():
            g = states[rid].grammar if rid in states else None
            if g is not None:
                d = d[:g.valid_prefix(d)]
            if d:
                out[rid] = d
        return out or None

    def _start_masks(self, specs: dict[str, SampleSpec], chunks=(), early: bool = True) -> None:
        """Start the bitmask of the step's constrained rows on the grammar's mask thread,
        before the launch: it is computed while the forward runs (on the device, or on the
        CPU beside it: llguidance drops the GIL) and read when the rows are sampled. Not
        `early` (a pipelined step's tokens are not consumed yet): computed when first read,
        which is after that step's read-back."""
        states = self.states
        rows = [rid for rid in specs if states[rid].grammar is not None]
        if rows:
            grammars = [states[rid].grammar for rid in rows]
            # a verify's rows: one mask per position, after each prefix of its drafts
            drafted = {c.request_id: c.token_ids[len(c.token_ids) - c.num_draft:]
                       for c in chunks if getattr(c, "num_draft", 0)}
            drafts = [drafted.get(rid, []) for rid in rows] if drafted else None
            masks = self.grammars.submit(grammars, drafts) if early else \
                self.grammars.later(grammars, drafts)
            for i, rid in enumerate(rows):
                specs[rid].mask = (masks, masks.bases[i])

    def _spec(self, request_id: str) -> SampleSpec:
        s = self.states[request_id]
        banned = s.min_tokens_banned if s.num_generated < s.params.min_tokens else ()
        return SampleSpec(s.params, s.seed, s.num_generated, s.prompt_ids, s.output_ids, banned)

    def _outputs(self, plan: StepPlan, result: StepResult, logprobs: dict,
                 finished: list) -> list[RequestOutput]:
        outputs: dict[str, RequestOutput] = {}
        requests = self.scheduler.requests
        accepted, sp = result.accepted, self.speculator
        for rid, token in result.sampled.items():
            state = self.states[rid]
            acc = accepted.get(rid) if accepted else None
            new = [*acc, token] if acc else [token]
            state.num_generated += len(new)
            if state.grammar is not None:
                state.grammar.consume(new)
            if state.params.uses_penalties:
                state.output_ids.extend(new)
            seq = requests.get(rid)
            lp = logprobs.get(rid)
            if isinstance(lp, list):  # a verify's: one per new token
                lps = lp if all(x is not None for x in lp) else []
            else:
                lps = [lp] if lp is not None else []
            o = outputs[rid] = RequestOutput(
                rid, new, lps, None, state.num_prompt_tokens,
                state.num_generated, seq.num_cached_tokens if seq is not None else 0)
            if sp is not None:
                sp.append(rid, new)
                d = sp.get(rid)
                if d is not None:
                    o.num_draft_tokens = d.num_draft_tokens
                    o.num_accepted_draft_tokens = d.num_accepted_draft_tokens
                    o.num_accepted_prediction_tokens = d.num_matched_prediction_tokens
                    o.num_rejected_prediction_tokens = d.prediction_passed_over()
        for f in finished:
            out = outputs[f.request_id]
            out.finish_reason = f.finish_reason
            g = self.states[f.request_id].grammar
            if g is not None and g.closed and f.finish_reason == "stop":
                out.finish_reason = "length"  # closed inside its grammar to fit max_tokens
            out.num_cached_tokens = f.num_cached_tokens
            del self.states[f.request_id]
            if sp is not None:
                d = sp.finish(f.request_id)
                if d is not None and d.prediction:  # OpenAI's, as the gateway counts them
                    out.num_accepted_prediction_tokens, out.num_rejected_prediction_tokens = \
                        d.prediction_usage()
        return list(outputs.values())

    # ---- idle checks ---------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Scheduler and block-manager invariants, and the engine's own request map."""
        self.scheduler.check_integrity()
        assert set(self.states) == set(self.scheduler.requests), "engine/scheduler requests differ"

