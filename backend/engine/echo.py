"""The echo engine: `tidegate backend --model echo` serves the real worker loop with no model.

Each request is answered with exactly `max_tokens` tokens (its prompt's tokens, repeated from
the start), one token per request per step, and steps run as fast as the worker loop asks for
them: no model, no sampler, no KV tensors. What is left is the serving path itself (the worker's
ZMQ loop, the protocol, the gateway), so `tidegate bench overhead` can measure the gateway's own
cost against it.

It honors the `backend.engine.continuous.Engine` interface the worker uses: `add_request` (the same refusals:
empty prompt, ids outside the vocabulary, prompt + max_tokens above max_model_len, more KV blocks
than the pool has, bad sampling values), `abort`, `step`, `has_unfinished`, `check_integrity`,
`request_ids`, `config`, `eos_token_ids`, `runner` (no model, no graphs, the CPU), and for `LoadReport`s `scheduler.num_running /
num_waiting / block_manager.num_free_blocks` and `states[...].params.max_tokens / num_generated`.
KV blocks are only counted: a request holds ceil((prompt + max_tokens) / block_size) blocks from
admission to its end, admitted while blocks and `max_num_seqs` allow in the step scheduler's
order: by class of max_tokens (Fast, Normal, Slow: `scheduler.classes`), then arrival — so that
with `--echo-step-ms` and a small `--max-num-seqs` it queues as our engine does, and the
simulator's step scheduler on a constant step models it (issue 31's live SLO checks). The tokenizer is the
tiny preset's byte-level one (vocabulary 259, BOS 256, EOS 257), so the gateway works unchanged.
Stop tokens and EOS are not honored: the output length is always max_tokens (finish "length").
With `--deadline-order` (scheduler.deadline_order) the waiting request with the earliest TTFT
deadline (`add_request`'s `deadline`, `time.monotonic()`'s clock) takes the last free slot before
the class order's next one when it would miss its deadline waiting for the next slot to free (its
running requests' remaining tokens, one step each) and that one would not, as the step scheduler
does.
"""
from __future__ import annotations

import dataclasses
import time
from collections import deque
from dataclasses import dataclass

import torch

from backend.config import ModelConfig
from backend.engine.continuous import EngineConfig, RequestOutput
from backend.engine.interface import EngineLoad, WholeStepEngine
from backend.runner.sampler import SamplingParams, TokenLogprobs
from proto.sampling import check_sampling
from scheduler.classes import class_index
from scheduler.deadline_order import DEFAULT_MARGIN_S, UrgentQueue, promote
from tokenizer.bundle import TokenizerBundle
from tokenizer.byte_level import byte_level_bundle

ECHO_MODEL = "echo"
DEFAULT_MAX_MODEL_LEN = 2048   # the tiny preset's context
DEFAULT_NUM_BLOCKS = 1 << 16   # counted, never allocated


@dataclass
class EchoLoaded:
    """What the worker and the CLI read from a `backend.model.loader.LoadedModel`."""
    config: ModelConfig
    tokenizer: TokenizerBundle
    model: None = None
    dtype: str = "none"
    device: str = "cpu (no model)"


@dataclass(slots=True)
class _EchoState:
    params: SamplingParams
    prompt: list[int]
    num_blocks: int
    order: tuple[int, int] = (0, 0)  # (class of max_tokens, arrival number): admission order
    deadline: float = 0.0  # TTFT deadline, time.monotonic() (deadline order); 0: none
    num_generated: int = 0
    running: bool = False


class _BlockCount:
    __slots__ = ("num_free_blocks", "num_total_blocks")

    def __init__(self, num_blocks: int) -> None:
        self.num_total_blocks = num_blocks
        self.num_free_blocks = num_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.num_total_blocks - self.num_free_blocks


class _EchoScheduler:
    """The scheduler-shaped view the worker's LoadReport reads."""
    __slots__ = ("block_manager", "running", "waiting")
    num_preemptions = 0

    def __init__(self, num_blocks: int) -> None:
        self.block_manager = _BlockCount(num_blocks)
        self.running: dict[str, _EchoState] = {}
        self.waiting: deque[str] = deque()

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_unfinished(self) -> bool:
        return bool(self.running or self.waiting)


class EchoRunner:
    """The runner-shaped view that serving-time hooks (`backend.runner.serving.configure_serving`,
    called by `tidegate backend` for every engine) look at: no model to quantize, no CUDA graphs
    to capture, the CPU."""
    model = None
    graphs = None
    device = torch.device("cpu")


class EchoEngine(WholeStepEngine):
    def __init__(self, config: EngineConfig, vocab_size: int,
                 eos_token_ids: tuple[int, ...] = (), step_delay_s: float = 0.0,
                 deadline_order: bool = False, deadline_margin_s: float = DEFAULT_MARGIN_S) -> None:
        self.step_delay_s = step_delay_s  # a slow backend that leaves the CPU to others
        # the nominal end of the last step (perf_counter): steps back to back keep one every
        # step_delay_s (`step`)
        self._step_end = float("-inf")
        self.runner = EchoRunner()
        self.config = config
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(eos_token_ids)
        self.scheduler = _EchoScheduler(config.num_blocks)
        self.states: dict[str, _EchoState] = {}
        self.num_steps = 0
        self.num_added = 0
        # deadline order: (request id, state) of the waiting requests with a TTFT deadline
        self.urgent: UrgentQueue[tuple[str, _EchoState]] | None = (
            UrgentQueue(deadline_margin_s, self._still_waiting) if deadline_order else None)
        self.num_promoted = 0  # admissions the deadline order moved ahead of class order

    def _still_waiting(self, item: tuple[str, _EchoState]) -> bool:
        rid, state = item
        return not state.running and self.states.get(rid) is state

    # ---- requests ------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    arrival_time: float = 0.0, priority: int = 0,
                    deadline: float = 0.0) -> str | None:
        """Queue a request; returns the reason it was refused, or None. `deadline`: its TTFT
        deadline, `time.monotonic()` seconds (0: none); read only with the deadline order."""
        cfg = self.config
        n = len(prompt_token_ids)
        if n == 0:
            return "request has no prompt tokens"
        if min(prompt_token_ids) < 0 or max(prompt_token_ids) >= self.vocab_size:
            return f"prompt has token ids outside [0, {self.vocab_size})"
        invalid = check_sampling(params, self.vocab_size, backend=True)
        if invalid is not None:
            return invalid.message
        if params.grammar is not None:
            return "structured output is not served by the echo engine (it generates no model output)"
        if n + params.max_tokens > cfg.max_model_len:
            return (f"prompt ({n} tokens) + max_tokens ({params.max_tokens}) exceeds "
                    f"max_model_len {cfg.max_model_len}")
        blocks = -(-(n + params.max_tokens) // cfg.block_size)
        if blocks > cfg.num_blocks:
            return f"needs {blocks} KV blocks but the pool has {cfg.num_blocks}"
        if request_id in self.states:
            return f"duplicate request id {request_id!r}"
        self.num_added += 1
        state = _EchoState(params, list(prompt_token_ids), blocks,
                           (class_index(params.max_tokens), self.num_added), max(0.0, deadline))
        self.states[request_id] = state
        self.scheduler.waiting.append(request_id)
        if self.urgent is not None:
            self.urgent.add(deadline, (request_id, state))
        return None

    def abort(self, request_id: str) -> RequestOutput | None:
        """Drop a request and free its blocks; its final record, or None if unknown."""
        state = self.states.pop(request_id, None)
        if state is None:
            return None
        sched = self.scheduler
        if state.running:
            del sched.running[request_id]
            sched.block_manager.num_free_blocks += state.num_blocks
        else:
            sched.waiting.remove(request_id)
        return RequestOutput(request_id, [], [], "abort", len(state.prompt), state.num_generated, 0)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    @property
    def request_ids(self) -> list[str]:
        return list(self.states)

    # ---- the step ------------------------------------------------------------------------
    def _admit(self) -> None:
        sched = self.scheduler
        bm = sched.block_manager
        max_seqs = self.config.max_num_seqs
        states = self.states
        urgent = self.urgent
        # the step's start: its first tokens come at its (paced) end
        now = time.monotonic() if urgent is not None and len(urgent) else None
        while sched.waiting and len(sched.running) < max_seqs:
            rid = min(sched.waiting, key=lambda r: states[r].order)
            state = states[rid]
            if now is not None and len(sched.running) + 1 == max_seqs:  # the last free slot
                first = urgent.earliest()
                if first is not None and first[1][1] is not state:
                    step_s = self.step_delay_s
                    if promote(first[0], state.deadline,
                               now + self.slot_frees_in(state) * step_s,
                               now + self.slot_frees_in(first[1][1]) * step_s,
                               step_s, urgent.margin_s):
                        rid, state = first[1]
                        self.num_promoted += 1
            if state.num_blocks > bm.num_free_blocks:
                break
            sched.waiting.remove(rid)
            bm.num_free_blocks -= state.num_blocks
            state.running = True
            sched.running[rid] = state

    def slot_frees_in(self, taker: _EchoState) -> int:
        """Steps from this one's start to the next slot's freeing if `taker` took the last free
        one: the fewest tokens left to a running request or to `taker` (one a step)."""
        left = taker.params.max_tokens
        for s in self.scheduler.running.values():
            r = s.params.max_tokens - s.num_generated
            left = min(left, r)
        return left

    # continuous.Engine's begin/finish pair around a step: no device, nothing in between
    def begin_step(self) -> None:
        return None

    def finish_step(self, step: None) -> list[RequestOutput]:
        return self.step()

    def step(self) -> list[RequestOutput]:
        """One token for every running request (admitting waiting ones first); with a step
        delay, at its paced end (`_pace`)."""
        sched = self.scheduler
        if sched.waiting:
            self._admit()
        if self.step_delay_s:
            self._pace()
        self.num_steps += 1
        outputs = []
        finished = []
        for rid, s in sched.running.items():
            prompt = s.prompt
            token = prompt[s.num_generated % len(prompt)]
            s.num_generated += 1
            lps = [TokenLogprobs(0.0, [token], [0.0])] if s.params.logprobs else []
            if s.num_generated >= s.params.max_tokens:
                finished.append(rid)
                outputs.append(RequestOutput(rid, [token], lps, "length", len(prompt),
                                             s.num_generated, 0))
            else:
                outputs.append(RequestOutput(rid, [token], lps, None, len(prompt),
                                             s.num_generated, 0))
        for rid in finished:
            s = sched.running.pop(rid)
            sched.block_manager.num_free_blocks += s.num_blocks
            del self.states[rid]
        return outputs

    def _pace(self) -> None:
        """Sleep to the end of this step: one step every `step_delay_s` while steps follow each
        other, the worker loop's time between them (sending the last step's outputs, reading
        new requests: 0.3-0.75 ms on the 2-core box) inside it, as a constant step. A plain sleep
        per step put that time and the sleep's overshoot on top: live echo backends stepped every
        20.5-21.2 ms at 1.0x / 1.5x of issue 31's load for a 20 ms step, and the simulator's
        constant 20 ms step started their queued requests sooner (BENCHMARKS, issue 31, eighth
        session). A step that starts
        a whole step after the last one's end (the backend was idle, or its loop late) takes a
        whole step from now."""
        now = time.perf_counter()
        end = self._step_end + self.step_delay_s
        if end <= now:
            end = now + self.step_delay_s
        self._step_end = end
        time.sleep(end - now)

    def load(self) -> EngineLoad:
        sched = self.scheduler
        bm = sched.block_manager
        return EngineLoad(
            num_running=sched.num_running, num_waiting=sched.num_waiting,
            num_free_blocks=bm.num_free_blocks, num_total_blocks=self.config.num_blocks,
            num_outstanding_tokens=sum(s.params.max_tokens - s.num_generated
                                       for s in self.states.values()),
            num_preemptions=sched.num_preemptions, num_promoted=self.num_promoted)

    # ---- idle checks ---------------------------------------------------------------------
    def check_integrity(self) -> None:
        sched = self.scheduler
        running, waiting = set(sched.running), set(sched.waiting)
        assert not running & waiting, "a request is both running and waiting"
        assert running | waiting == set(self.states), "engine requests and queues differ"
        used = sum(self.states[r].num_blocks for r in running)
        bm = sched.block_manager
        assert bm.num_free_blocks == bm.num_total_blocks - used, (
            f"free blocks {bm.num_free_blocks} != {bm.num_total_blocks} - {used}")


def echo_model_config(max_model_len: int) -> ModelConfig:
    return dataclasses.replace(ModelConfig.from_preset("tiny"), name=ECHO_MODEL,
                               max_position_embeddings=max_model_len)


def create_echo_engine(cfg) -> tuple[EchoEngine, EchoLoaded]:
    """`backend.engine.assemble.create_engine` for `--model echo` (cfg: a `backend.engine.assemble.BackendConfig`;
    --device/--dtype/--load-format/--seed/--cpu-threads have nothing to act on and are ignored)."""
    cfg.validate()
    max_model_len = cfg.max_model_len or DEFAULT_MAX_MODEL_LEN
    num_blocks = cfg.num_blocks or DEFAULT_NUM_BLOCKS
    model_config = echo_model_config(max_model_len)
    tokenizer = byte_level_bundle(ECHO_MODEL)
    engine_cfg = EngineConfig(max_model_len=max_model_len, num_blocks=num_blocks,
                              block_size=cfg.block_size, max_num_seqs=cfg.max_num_seqs,
                              max_num_batched_tokens=cfg.max_num_batched_tokens,
                              enable_prefix_caching=cfg.enable_prefix_caching)
    engine = EchoEngine(engine_cfg, model_config.vocab_size, tokenizer.eos_token_ids,
                        cfg.echo_step_ms / 1000, deadline_order=cfg.deadline_order,
                        deadline_margin_s=cfg.deadline_margin_ms / 1000)
    return engine, EchoLoaded(model_config, tokenizer)
