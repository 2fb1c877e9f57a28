"""Sampling, vectorized over the batch on the model's device.

Randomness is counter-based: the noise for (request seed, index of the token being generated,
vocab id) is a hash of those three integers. A seeded request therefore draws the same tokens
whatever else shares its batch, after a preemption, and on a CUDA-graph replay (no generator
state to carry). Unseeded requests get a random seed at admission.

Sampling one row = argmax over the allowed ids of `p_i / E_i`, E_i ~ Exp(1) (the exponential
race, equivalent to drawing from p): greedy rows (temperature 0) take the plain argmax.
Top-k and top-p masks are computed on the sorted logits, only when some row uses them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

_M32 = 0xFFFFFFFF


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0              # <= 0: off
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int = 0           # top-n logprobs per generated token; 0 = none

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class TokenLogprobs:
    logprob: float
    top_ids: list[int] = field(default_factory=list)
    top_logprobs: list[float] = field(default_factory=list)


@dataclass
class SamplingTensors:
    """Per-row sampling parameters as device tensors (the runner keeps them in static buffers)."""
    temperature: torch.Tensor  # [B] fp32, 0 = greedy
    top_k: torch.Tensor        # [B] int64, vocab_size = off
    top_p: torch.Tensor        # [B] fp32, 1 = off
    seeds: torch.Tensor        # [B] int64 in [0, 2^62)
    counters: torch.Tensor     # [B] int64: index of the token being generated
    needs_sort: bool           # host flag: some row uses top-k or top-p
    all_greedy: bool

    @classmethod
    def build(cls, params: list[SamplingParams], seeds: list[int], counters: list[int],
              vocab_size: int, device: torch.device) -> SamplingTensors:
        top_k = [p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params]
        top_p = [p.top_p if 0.0 < p.top_p < 1.0 else 1.0 for p in params]
        temps = [max(p.temperature, 0.0) for p in params]
        needs_sort = any(k < vocab_size for k in top_k) or any(p < 1.0 for p in top_p)
        return cls(
            temperature=torch.tensor(temps, dtype=torch.float32, device=device),
            top_k=torch.tensor(top_k, dtype=torch.int64, device=device),
            top_p=torch.tensor(top_p, dtype=torch.float32, device=device),
            seeds=torch.tensor(seeds, dtype=torch.int64, device=device),
            counters=torch.tensor(counters, dtype=torch.int64, device=device),
            needs_sort=needs_sort, all_greedy=all(t == 0.0 for t in temps))


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash on int64 tensors holding values in [0, 2^32); multipliers stay
    below 2^31 so no product overflows int64."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x4CA68B5D) & _M32
    return x ^ (x >> 16)


def uniform_noise(seeds: torch.Tensor, counters: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[B, V] fp32 in (0, 1), a pure function of (seed, counter, vocab id)."""
    key = _mix32(seeds & _M32)
    key = _mix32(key ^ ((seeds >> 32) & _M32))
    key = _mix32(key ^ (counters & _M32))  # [B]
    ids = torch.arange(vocab_size, dtype=torch.int64, device=seeds.device)
    h = _mix32((key[:, None] + ids[None, :] * 0x1E3779B1) & _M32)  # [B, V]
    h = _mix32(h ^ key[:, None])
    return ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def _apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # [B, V]
    vocab = logits.shape[-1]
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    mask = ranks >= top_k[:, None]
    probs = sorted_logits.masked_fill(mask, float("-inf")).softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # mass of strictly better tokens
    mask |= mass_before >= top_p[:, None]
    mask[:, 0] = False  # always keep the best token
    sorted_logits = sorted_logits.masked_fill(mask, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def sample(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    """logits [B, V] fp32 -> token ids [B] int64 (on the logits' device)."""
    greedy_ids = logits.argmax(dim=-1)
    if t.all_greedy:
        return greedy_ids
    temp = torch.where(t.temperature > 0, t.temperature, torch.ones_like(t.temperature))
    scaled = logits / temp[:, None]
    if t.needs_sort:
        scaled = _apply_top_k_top_p(scaled, t.top_k, t.top_p)
    probs = scaled.softmax(dim=-1)
    noise = -torch.log(uniform_noise(t.seeds, t.counters, logits.shape[-1]))  # Exp(1)
    sampled = (probs / noise).argmax(dim=-1)
    return torch.where(t.temperature > 0, sampled, greedy_ids)


def compute_logprobs(logits: torch.Tensor, token_ids: torch.Tensor,
                     num_top: list[int]) -> list[TokenLogprobs | None]:
    """Logprobs (of the unmodified model distribution) of the chosen tokens and the top-n."""
    if not any(num_top):
        return [None] * len(num_top)
    logp = logits.log_softmax(dim=-1)
    chosen = logp.gather(-1, token_ids[:, None])[:, 0].tolist()
    n_max = max(num_top)
    top_vals, top_ids = logp.topk(n_max, dim=-1)
    top_vals, top_ids = top_vals.tolist(), top_ids.tolist()
    return [TokenLogprobs(chosen[i], top_ids[i][:n], top_vals[i][:n]) if n else None
            for i, n in enumerate(num_top)]


class Sampler:
    """`sampler(logits, params, seeds, counters) -> (token ids, logprobs per row)`."""

    def __init__(self, vocab_size: int, device: torch.device | str) -> None:
        self.vocab_size = vocab_size
        self.device = torch.device(device)

    def __call__(self, logits: torch.Tensor, params: list[SamplingParams], seeds: list[int],
                 counters: list[int]) -> tuple[list[int], list[TokenLogprobs | None]]:
        t = SamplingTensors.build(params, seeds, counters, self.vocab_size, self.device)
        ids = sample(logits, t)
        return ids.tolist(), compute_logprobs(logits, ids, [p.logprobs for p in params])


def finish_reason(token_id: int, num_generated: int, params: SamplingParams,
                  eos_token_ids: tuple[int, ...], total_len: int, max_model_len: int) -> str | None:
    """'stop' / 'length' / None after `token_id` became the `num_generated`-th token."""
    if token_id in params.stop_token_ids:
        return "stop"
    if not params.ignore_eos and token_id in eos_token_ids:
        return "stop"
    if num_generated >= params.max_tokens or total_len >= max_model_len:
        return "length"
    return None
