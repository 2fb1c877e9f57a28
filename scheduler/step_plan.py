"""The step scheduler's records: its config, the plan it hands down, the result it takes back.

Import these from `scheduler.step_scheduler`, which re-exports them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.capacity import DEFAULT_CAPACITY, PrefillCap
from scheduler.classes import DEFAULT_CLASS_BOUNDS
from scheduler.deadline_order import DEFAULT_MARGIN_S


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """Limits of one backend's continuous batching."""

    max_model_len: int  # prompt + max_tokens of any request is at most this
    num_blocks: int  # KV blocks in the pool
    # scheduler.capacity: running sequences, tokens fed per step (decodes count 1 each),
    # tokens per KV block
    max_num_seqs: int = DEFAULT_CAPACITY.max_num_seqs
    max_num_batched_tokens: int = DEFAULT_CAPACITY.max_num_batched_tokens
    block_size: int = DEFAULT_CAPACITY.block_size
    enable_prefix_caching: bool = True
    num_host_blocks: int = 0  # host-memory KV tier (scheduler.host_tier); 0: none
    class_bounds: tuple[int, int] = DEFAULT_CLASS_BOUNDS  # Fast <= a < Normal <= b < Slow
    # prefill budget by backlog (scheduler.capacity.PrefillCap; off by default)
    prefill_cap: PrefillCap = field(default_factory=PrefillCap)
    # speculative decoding: a verify's draft tokens stay in the block of the sequence's next
    # slot (the runner keeps int4 keys' last block at full precision: a rollback across a
    # block would lose those rows)
    draft_within_block: bool = False
    # the waiting queue's order: False = FCFS (our engine); True = by the class of max_tokens,
    # then arrival (Fast first; preempted sequences stay at the front), as the echo engine's
    # queue admits (backend.engine.echo), so that the simulator models what it serves (issue 31)
    waiting_by_class: bool = False
    # deadline order (scheduler.deadline_order; issue 31, s17): the waiting request with the
    # earliest TTFT deadline (add_request's `deadline`, the clock of schedule()'s `now`) takes a
    # slot before the class order's next one when it would miss its deadline waiting for the
    # next free slot and that one would not (`deadline_margin_s` more room on both sides); off:
    # the order above exactly
    deadline_order: bool = False
    deadline_margin_s: float = DEFAULT_MARGIN_S

    def __post_init__(self) -> None:
        for name in ("max_model_len", "num_blocks", "max_num_seqs", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                             f"max_num_seqs ({self.max_num_seqs}): every running decode must fit")
        if not self.deadline_margin_s >= 0.0:
            raise ValueError(f"deadline_margin_s must be >= 0, got {self.deadline_margin_s}")
        fast_max, normal_max = self.class_bounds
        if not 0 <= fast_max <= normal_max:
            raise ValueError(f"class_bounds must satisfy 0 <= fast <= normal, got {self.class_bounds}")


@dataclass(slots=True)
class ScheduledChunk:
    """One sequence's share of a step: feed `token_ids` at positions start_pos, start_pos+1, ..."""

    request_id: str
    token_ids: list[int]  # the tokens fed this step (one for a decode)
    start_pos: int  # tokens already in the KV cache = position of token_ids[0]
    # The sequence's full block table: the block manager's live list, not a copy (copying 256
    # tables cost more than the rest of a step). Read it before the next schedule(); never
    # mutate it. Later steps only append to it, so entries covering this chunk stay valid.
    block_table: list[int]
    is_prefill: bool
    sample: bool  # a token is sampled after this chunk: every decode and the last prefill chunk
    # a verify (speculative decoding): the last `num_draft` of token_ids are draft tokens after
    # the sequence's last token; the runner samples a target at every one of its positions
    num_draft: int = 0


@dataclass(slots=True)
class StepPlan:
    """What the runner executes this step. Chunks: one-token decodes first (Fast class first),
    then verifies (decodes with draft tokens), then prefills."""

    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)  # request ids sent back to waiting
    num_batched_tokens: int = 0
    # schedule(list_decodes=False): every decoding sequence decodes but has no chunk (simulator)
    num_unlisted_decodes: int = 0
    decode_step: int | None = None  # the scheduler's clock when planned (stale-plan check)

    @property
    def num_decodes(self) -> int:
        return self.num_unlisted_decodes + sum(1 for c in self.chunks if not c.is_prefill)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.chunks if c.is_prefill)

    @property
    def num_draft_tokens(self) -> int:
        return sum(c.num_draft for c in self.chunks)


@dataclass(slots=True)
class StepResult:
    """What the runner hands back: one token per sampling chunk, and who hit a stop token."""

    sampled: dict[str, int] = field(default_factory=dict)
    stopped: set[str] = field(default_factory=set)  # the sampled token is eos/stop: finish
    decode_token: int = 0  # sampled by every unlisted decode (schedule(list_decodes=False))
    # verifies: request -> the draft tokens accepted (a prefix of its chunk's drafts), appended
    # before its `sampled` token; absent: none accepted
    accepted: dict[str, list[int]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FinishedSequence:
    request_id: str
    finish_reason: str  # "stop" | "length" | "abort"
    output_token_ids: list[int]  # generated tokens (a stop token included)
    num_prompt_tokens: int
    num_cached_tokens: int  # prompt tokens found in the prefix cache at first admission


@dataclass(frozen=True, slots=True)
class Rejection:
    """A request refused at admission; it was never queued."""

    request_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    num_running: int
    num_waiting: int
    num_preemptions: int
    num_steps: int
    num_used_blocks: int
    num_free_blocks: int
    num_cached_blocks: int
    kv_usage: float  # used blocks / all blocks
    internal_fragmentation: float
    num_prefix_query_tokens: int
    num_prefix_hit_tokens: int
    prefix_hit_rate: float
    # host KV tier (0 without one)
    num_swap_preemptions: int = 0  # preemptions swapped to host memory instead of recomputed
    num_host_hit_tokens: int = 0  # of num_prefix_hit_tokens, copied back from host memory
    num_host_used_blocks: int = 0
