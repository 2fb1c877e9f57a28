"""What one model-runner step reads and returns: the chunk protocol, per-request sampling
specs and the step's output. Apart from `backend.runner.step` so that the decode graphs
(`backend.runner.cuda_graphs`), which produce the same output, need not import the runner."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from backend.runner.sampler import SampleSpec, TokenLogprobs

__all__ = ["Chunk", "RunnerOutput", "SampleSpec"]  # SampleSpec lives with the sampler


class Chunk(Protocol):
    """What the runner reads from `scheduler.step_scheduler.ScheduledChunk`."""
    request_id: str
    token_ids: list[int]
    start_pos: int          # tokens already in the KV cache = position of token_ids[0]
    block_table: list[int]  # the sequence's block table (covers start_pos + len(token_ids))
    is_prefill: bool
    sample: bool


@dataclass
class RunnerOutput:
    token_ids: dict[str, int] = field(default_factory=dict)  # request id -> sampled token
    logprobs: dict[str, TokenLogprobs | None] = field(default_factory=dict)
    logits: torch.Tensor | None = None  # [num_sampled, vocab] fp32 when keep_logits
