"""Per-request state inside the step scheduler.

Token layout of one sequence (P prompt tokens, G generated so far)::

    token_ids   [ p0 ... p(P-1) | g0 ... g(G-1) ]
    KV cache    [ computed ............ )          num_computed_tokens
    prefill     [ ........................ )       num_prefill_tokens (fixed at admission)

While ``num_computed_tokens < num_prefill_tokens`` the sequence is prefilling (in chunks);
after that it decodes: ``num_computed_tokens == len(token_ids) - 1`` and each step feeds the last
token. A sequence preempted by recompute keeps its tokens and is prefilled again over all of
them (``num_prefill_tokens = P + G``), so its next sample is token G + 1.

Lazy decode accounting: every running decoding sequence advances by exactly one token per step
(the token budget always covers all decodes), so while ``decoding`` is set the sequence does not
store its count but an offset against the scheduler's shared clock (`LazyDecodes`, which owns
all of this bookkeeping and is the only writer of the lazy fields below)::

    num_computed_tokens = _computed + clock.step        (decoding)
    num_computed_tokens = _computed                     (waiting, prefilling, finished)

A step that lists no decode chunks (the simulator's `schedule(list_decodes=False)`) appends no
token either; `token_ids` shows the gap filled with `clock.fill_token` (a copy: reading never
changes the sequence), and `materialize_tokens()` appends them for real. A step that lists the
decodes (the engine) appends the real tokens, so nothing is ever filled there.
"""
from __future__ import annotations

from enum import Enum
from typing import Protocol


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class DecodeClock(Protocol):
    """What a sequence reads of its scheduler's shared clock (scheduler.lazy_decodes)."""

    step: int  # decode steps applied so far
    fill_token: int  # token of decodes that were not listed (simulated steps)


class _StandaloneClock:
    __slots__ = ("fill_token", "step")

    def __init__(self) -> None:
        self.step = 0
        self.fill_token = 0


class Sequence:
    __slots__ = (
        "_computed",
        "_token_ids",
        "admitted",
        "arrival_time",
        "block_table",
        "boundary_step",
        "clock",
        "deadline",
        "decoding",
        "finish_step",
        "max_tokens",
        "num_cached_tokens",
        "num_prefill_tokens",
        "num_prompt_tokens",
        "priority",
        "rank",
        "request_id",
        "seq_no",
        "status",
    )

    def __init__(self, request_id: str, prompt_token_ids: list[int], max_tokens: int,
                 arrival_time: float, priority: int, seq_no: int,
                 clock: DecodeClock | None = None) -> None:
        self.request_id = request_id
        self._token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.max_tokens = max_tokens
        self.arrival_time = arrival_time
        self.priority = priority
        self.seq_no = seq_no  # admission order: the last tie-break
        self.rank = (priority, arrival_time, seq_no)  # order_key(), built once
        self._computed = 0
        self.num_prefill_tokens = 0
        self.num_cached_tokens = 0
        self.status = SequenceStatus.WAITING
        self.admitted = False  # allocated at least once (num_cached_tokens is set then)
        self.clock = clock if clock is not None else _StandaloneClock()
        self.decoding = False
        self.deadline = 0.0  # TTFT deadline (scheduler.deadline_order); 0: none
        self.boundary_step = 0  # decoding: clock step whose slot starts a new block
        self.finish_step = 0  # decoding: clock step after which it finishes by length
        # running: the block manager's live table for it (read-only here; set at each admission,
        # the same list until the sequence frees its blocks), so a step lists its chunks
        # without a lookup per sequence
        self.block_table: list[int] = []

    @property
    def num_computed_tokens(self) -> int:
        return self._computed + self.clock.step if self.decoding else self._computed

    @num_computed_tokens.setter
    def num_computed_tokens(self, value: int) -> None:
        self._computed = value - self.clock.step if self.decoding else value

    def _num_missing(self) -> int:
        """Unlisted decodes not yet appended to `_token_ids`."""
        if not self.decoding:
            return 0
        return max(0, self._computed + self.clock.step + 1 - len(self._token_ids))

    @property
    def token_ids(self) -> list[int]:
        """All tokens, unlisted decodes shown filled in. Reading changes nothing: when some are
        missing this is a new list; otherwise it is the live list (do not mutate it)."""
        missing = self._num_missing()
        if missing:
            return self._token_ids + [self.clock.fill_token] * missing
        return self._token_ids

    def materialize_tokens(self) -> list[int]:
        """Append the unlisted decodes' tokens (the clock's fill token); returns the live list.
        (Inlined, not through _num_missing: it runs for every registration in simulated steps.)"""
        tokens = self._token_ids
        if self.decoding:
            missing = self._computed + self.clock.step + 1 - len(tokens)
            if missing > 0:
                tokens.extend([self.clock.fill_token] * missing)
        return tokens

    @property
    def num_output_tokens(self) -> int:
        return len(self._token_ids) + self._num_missing() - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed_tokens < self.num_prefill_tokens

    def order_key(self) -> tuple[float, int, int]:
        """Tie-break within a class: lower priority value first, then earlier arrival."""
        return self.rank

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, {self.status.value}, prompt={self.num_prompt_tokens}, "
                f"out={self.num_output_tokens}/{self.max_tokens}, computed={self.num_computed_tokens})")
