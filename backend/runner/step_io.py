"""What one model-runner step reads and returns: the chunk protocol, per-request sampling
specs and the step's output. Apart from `backend.runner.step` so that the decode graphs
(`backend.runner.cuda_graphs`), which produce the same output, need not import the runner."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from backend.runner.sampler import Sampler, SampleSpec, SamplingParams, TokenLogprobs

__all__ = ["Chunk", "RunnerOutput", "SampleSpec", "logit_rows", "sample_rows"]  # SampleSpec lives with the sampler


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
    # verifies (chunks with draft tokens): request id -> the token sampled at each of its k + 1
    # positions (the target of each draft, then the one after the last), and their logprobs;
    # such a request is not in `token_ids`
    targets: dict[str, list[int]] = field(default_factory=dict)
    target_logprobs: dict[str, list[TokenLogprobs | None]] = field(default_factory=dict)


def logit_rows(chunks: Sequence[Chunk], query_start_loc: Sequence[int]) -> list[int]:
    """The step's token rows whose logits are computed, in chunk order: a chunk's last token,
    and for a verify (`num_draft` > 0) every draft's position before it too. A graph step
    computes logits at these rows (its `last_token`); the eager step at the sampled ones."""
    rows: list[int] = []
    for i, c in enumerate(chunks):
        end = query_start_loc[i + 1] - 1
        rows.extend(range(end - getattr(c, "num_draft", 0), end + 1))
    return rows


def sample_rows(sampler: Sampler, logits: torch.Tensor, chunks: Sequence[Chunk],
                sampling: Mapping[str, SampleSpec] | None, out: RunnerOutput,
                row_of: Sequence[int] | None = None) -> None:
    """Sample the logits of the step's sampling chunks into `out`: one token per chunk, and
    for a verify one target per position (`out.targets`, `out.target_logprobs`), each sampled
    as a plain decode at that position would be (`SampleSpec.at_draft`). `logits` rows: the
    sampling chunks' rows in order (a verify's k + 1 together), or, with `row_of`, the rows
    `row_of[i]` .. of chunk i in a larger tensor (graph steps)."""
    specs: list[SampleSpec] = []
    index: list[int] = []
    owners: list[tuple[str, int]] = []  # (request id, draft rows) per sampling chunk
    r = 0
    for i, c in enumerate(chunks):
        n = getattr(c, "num_draft", 0)
        if row_of is not None:
            r = row_of[i]
        if not c.sample:
            continue
        base = sampling[c.request_id] if sampling is not None else SampleSpec(SamplingParams(), 0, 0)
        drafts = c.token_ids[len(c.token_ids) - n:] if n else ()
        for j in range(n + 1):
            specs.append(base.at_draft(drafts, j) if j else base)
            index.append(r + j)
        owners.append((c.request_id, n))
        r += n + 1
    if not specs:
        return
    if index != list(range(len(index))) or logits.shape[0] != len(index):
        logits = logits.index_select(0, torch.tensor(index, dtype=torch.long, device=logits.device))
    ids, logprobs = sampler.sample_specs(logits, specs)
    k = 0
    for rid, n in owners:
        if n:
            out.targets[rid] = ids[k:k + n + 1]
            out.target_logprobs[rid] = logprobs[k:k + n + 1]
        else:
            out.token_ids[rid] = ids[k]
            out.logprobs[rid] = logprobs[k]
        k += n + 1
