"""Per-request state inside the step scheduler.

Token layout of one sequence (P prompt tokens, G generated so far)::

    token_ids   [ p0 ... p(P-1) | g0 ... g(G-1) ]
    KV cache    [ computed ............ )          num_computed_tokens
    prefill     [ ........................ )       num_prefill_tokens (fixed at admission)

While ``num_computed_tokens < num_prefill_tokens`` the sequence is prefilling (in chunks);
after that it decodes: ``num_computed_tokens == len(token_ids) - 1`` and each step feeds the last
token. A sequence preempted by recompute keeps its tokens and is prefilled again over all of
them (``num_prefill_tokens = P + G``), so its next sample is token G + 1.
"""
from __future__ import annotations

from enum import Enum


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    __slots__ = (
        "admitted",
        "arrival_time",
        "max_tokens",
        "num_cached_tokens",
        "num_computed_tokens",
        "num_prefill_tokens",
        "num_prompt_tokens",
        "priority",
        "request_id",
        "seq_no",
        "status",
        "token_ids",
    )

    def __init__(self, request_id: str, prompt_token_ids: list[int], max_tokens: int,
                 arrival_time: float, priority: int, seq_no: int) -> None:
        self.request_id = request_id
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.max_tokens = max_tokens
        self.arrival_time = arrival_time
        self.priority = priority
        self.seq_no = seq_no  # admission order: the last tie-break
        self.num_computed_tokens = 0
        self.num_prefill_tokens = 0
        self.num_cached_tokens = 0
        self.status = SequenceStatus.WAITING
        self.admitted = False  # allocated at least once (num_cached_tokens is set then)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed_tokens < self.num_prefill_tokens

    def order_key(self) -> tuple[float, int, int]:
        """Tie-break within a class: lower priority value first, then earlier arrival."""
        return (self.priority, self.arrival_time, self.seq_no)

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, {self.status.value}, prompt={self.num_prompt_tokens}, "
                f"out={self.num_output_tokens}/{self.max_tokens}, computed={self.num_computed_tokens})")
