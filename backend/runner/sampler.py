"""Sampling, vectorized over the batch on the model's device.

Randomness is counter-based: the noise for (request seed, index of the token being generated,
vocab id) is a hash of those three integers. A seeded request therefore draws the same tokens
whatever else shares its batch, after a preemption, and on a CUDA-graph replay (no generator
state to carry). Unseeded requests get a random seed at admission.

One step, every stage a batched tensor op over [B, V] (no loop over rows or the vocabulary,
no device->host read), each stage only when some row of the step uses it:

    logits (model, fp32)
      + logit_bias                      sparse (id, bias) pairs scattered into the row
      banned ids -> -inf                min_tokens: EOS and stop ids until enough tokens
      penalties                         repetition (prompt + output), presence, frequency
      / temperature                     0 = greedy: argmax of the processed logits
      min_p, top-k, top-p masks         min_p on the probabilities; top-k/p on sorted logits
      argmax p_i / E_i, E_i ~ Exp(1)    the exponential race, equivalent to drawing from p

Ragged per-row inputs (token histories, bias pairs, banned ids) are padded with the id V and
scattered into V + 1 columns, the last one dropped: the padding never touches a real token.
Logprobs are those of the unmodified model distribution (vLLM's default, `raw_logprobs`).
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from backend.runner.grammar import apply_token_bitmask
from proto.sampling import SamplingParams  # the one sampling record (its defaults: greedy)

_M32 = 0xFFFFFFFF


@dataclass
class SampleSpec:
    """How to sample one request this step."""
    params: SamplingParams
    seed: int
    counter: int  # index of the token being generated (number generated so far)
    # token history for the penalties (read, never copied or changed here)
    prompt_ids: Sequence[int] = ()
    output_ids: Sequence[int] = ()
    banned_ids: Sequence[int] = ()  # ids masked out this step (min_tokens)
    # structured output: (the step's StepMasks, this row's index in it); None: free
    mask: tuple | None = None

    def at_draft(self, drafts: Sequence[int], j: int) -> SampleSpec:
        """The spec of position j of a verify (speculative decoding): the token after the
        first j drafts, sampled as a plain decode would sample it once they are the output:
        token index counter + j (the same noise), the drafts in the penalties' history, the
        min_tokens ban while counter + j is still short of it."""
        p = self.params
        banned = self.banned_ids if self.counter + j < p.min_tokens else ()
        output = [*self.output_ids, *drafts[:j]] if p.uses_penalties else self.output_ids
        mask = (self.mask[0], self.mask[1] + j) if self.mask is not None else None
        return SampleSpec(p, self.seed, self.counter + j, self.prompt_ids, output, banned,
                          mask)  # (a grammar's row after the first j drafts)


@dataclass
class TokenLogprobs:
    logprob: float
    top_ids: list[int] = field(default_factory=list)
    top_logprobs: list[float] = field(default_factory=list)


@dataclass
class SamplingTensors:
    """Per-row sampling parameters as device tensors. Optional groups are None when no row of the
    step uses them (the host flags that pick which stages run)."""
    temperature: torch.Tensor  # [B] fp32, 0 = greedy
    top_k: torch.Tensor        # [B] int64, vocab_size = off
    top_p: torch.Tensor        # [B] fp32, 1 = off
    seeds: torch.Tensor        # [B] int64 in [0, 2^62)
    counters: torch.Tensor     # [B] int64: index of the token being generated
    needs_sort: bool           # host flag: some row uses top-k or top-p
    all_greedy: bool
    min_p: torch.Tensor | None = None          # [B] fp32, 0 = off
    bias_ids: torch.Tensor | None = None       # [B, K] int64, padded with V
    bias_values: torch.Tensor | None = None    # [B, K] fp32
    banned_ids: torch.Tensor | None = None     # [B, S] int64, padded with V
    prompt_ids: torch.Tensor | None = None     # [B, Lp] int64, padded with V
    output_ids: torch.Tensor | None = None     # [B, Lo] int64, padded with V
    repetition_penalty: torch.Tensor | None = None  # [B] fp32, 1 = off
    presence_penalty: torch.Tensor | None = None    # [B] fp32
    frequency_penalty: torch.Tensor | None = None   # [B] fp32
    grammar_rows: torch.Tensor | None = None   # [G] int64: the rows with a grammar
    grammar_mask: torch.Tensor | None = None   # [G, ceil(V / 32)] int32 bitmask
    # CPU with the C kernels: the histories flat (ids, row offsets) for `apply_penalties_cpu`
    # instead of prompt_ids / output_ids
    penalty_histories: tuple | None = None

    @classmethod
    def build(cls, params: list[SamplingParams], seeds: list[int], counters: list[int],
              vocab_size: int, device: torch.device,
              specs: Sequence[SampleSpec] | None = None) -> SamplingTensors:
        """`specs` (same rows as `params`) carry the histories and banned ids; without them no
        row is penalized or banned."""
        top_k = [p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params]
        top_p = [p.top_p if 0.0 < p.top_p < 1.0 else 1.0 for p in params]
        temps = [max(p.temperature, 0.0) for p in params]
        needs_sort = any(k < vocab_size for k in top_k) or any(p < 1.0 for p in top_p)

        def f32(values):
            return torch.tensor(values, dtype=torch.float32, device=device)

        def padded(rows: list[Sequence[int]]) -> torch.Tensor:
            return _pad_ids(rows, vocab_size, device)

        t = cls(temperature=f32(temps),
                top_k=torch.tensor(top_k, dtype=torch.int64, device=device),
                top_p=f32(top_p),
                seeds=torch.tensor(seeds, dtype=torch.int64, device=device),
                counters=torch.tensor(counters, dtype=torch.int64, device=device),
                needs_sort=needs_sort, all_greedy=all(x == 0.0 for x in temps))
        if any(p.min_p > 0.0 for p in params):
            t.min_p = f32([min(max(p.min_p, 0.0), 1.0) for p in params])
        if any(p.logit_bias for p in params):
            t.bias_ids = padded([[i for i, _ in p.logit_bias] for p in params])
            width = t.bias_ids.shape[1]
            t.bias_values = f32([[b for _, b in p.logit_bias] + [0.0] * (width - len(p.logit_bias))
                                 for p in params])
        if specs is not None:
            masked = [i for i, s in enumerate(specs) if s.mask is not None]
            if masked:  # rows without a grammar get no mask at all
                bits = np.stack([specs[i].mask[0].result()[specs[i].mask[1]]
                                 for i in masked])
                t.grammar_rows = torch.tensor(masked, dtype=torch.int64, device=device)
                t.grammar_mask = torch.from_numpy(bits).to(device, non_blocking=True)
            if any(s.banned_ids for s in specs):
                t.banned_ids = padded([s.banned_ids for s in specs])
            if any(p.uses_penalties for p in params):
                # rows without penalties send no history (their neutral values ignore it)
                use = [p.uses_penalties for p in params]
                prompts = [s.prompt_ids if u else () for s, u in zip(specs, use)]
                outputs = [s.output_ids if u else () for s, u in zip(specs, use)]
                if device.type == "cpu" and _penalties_kernel() is not None:
                    t.penalty_histories = (_flat_ids(prompts), _flat_ids(outputs))
                else:
                    t.prompt_ids, t.output_ids = padded(prompts), padded(outputs)
                t.repetition_penalty = f32([p.repetition_penalty for p in params])
                t.presence_penalty = f32([p.presence_penalty for p in params])
                t.frequency_penalty = f32([p.frequency_penalty for p in params])
        return t


def _penalties_kernel():
    from backend.kernels.cpu import load_library

    lib = load_library()
    return None if lib is None else lib.apply_penalties_f32


def _flat_ids(rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Ragged rows -> (ids int64 [sum of lengths], offsets int64 [rows + 1])."""
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in rows], out=offsets[1:])
    ids = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(offsets[-1]))
    return ids, offsets


def apply_penalties_cpu(logits: torch.Tensor, histories: tuple, repetition: torch.Tensor,
                        presence: torch.Tensor, frequency: torch.Tensor) -> torch.Tensor:
    """`apply_penalties` on fp32 CPU logits, by the C kernel (`backend/kernels/cpu/penalties.c`):
    only each row's seen tokens are touched. Returns a new tensor (the caller's logits stay the
    model's, for the logprobs)."""
    (p_ids, p_off), (o_ids, o_off) = histories
    out = logits.to(torch.float32, copy=True).contiguous()
    rep, pres, freq = (x.to(torch.float32).contiguous() for x in (repetition, presence, frequency))
    rc = _penalties_kernel()(out.data_ptr(), out.shape[0], out.shape[1], out.stride(0),
                             p_ids.ctypes.data, p_off.ctypes.data, o_ids.ctypes.data,
                             o_off.ctypes.data, rep.data_ptr(), pres.data_ptr(), freq.data_ptr())
    if rc != 0:
        raise MemoryError("penalties kernel: no scratch memory")
    return out


def _pad_ids(rows: Sequence[Sequence[int]], pad: int, device: torch.device) -> torch.Tensor:
    """[B, max len] int64 (at least one column), short rows padded with `pad`."""
    width = max(1, max((len(r) for r in rows), default=0))
    out = torch.full((len(rows), width), pad, dtype=torch.int64)
    for i, r in enumerate(rows):
        if len(r):
            out[i, :len(r)] = torch.as_tensor(r, dtype=torch.int64)
    return out.to(device, non_blocking=True)


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


def token_counts(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Padded ids [B, L] (pad = vocab_size) -> occurrences [B, V] fp32."""
    counts = torch.zeros(ids.shape[0], vocab_size + 1, dtype=torch.float32, device=ids.device)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=torch.float32))
    return counts[:, :vocab_size]


def apply_logit_bias(logits: torch.Tensor, ids: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """logits [B, V] + bias scattered at ids [B, K] (pad = V)."""
    vocab = logits.shape[1]
    bias = torch.zeros(logits.shape[0], vocab + 1, dtype=logits.dtype, device=logits.device)
    bias.scatter_add_(1, ids, values.to(logits.dtype))
    return logits + bias[:, :vocab]


def apply_banned(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """-inf at ids [B, S] (pad = V)."""
    vocab = logits.shape[1]
    banned = torch.zeros(logits.shape[0], vocab + 1, dtype=torch.bool, device=logits.device)
    banned.scatter_(1, ids, True)
    return logits.masked_fill(banned[:, :vocab], float("-inf"))


def apply_penalties(logits: torch.Tensor, prompt_ids: torch.Tensor, output_ids: torch.Tensor,
                    repetition: torch.Tensor, presence: torch.Tensor,
                    frequency: torch.Tensor) -> torch.Tensor:
    """The penalties as vLLM and the OpenAI API define them:
    repetition (CTRL paper): a token seen in the prompt or the output has a positive logit
    divided by r, a negative one multiplied by r; presence: minus `presence` once if the token is
    in the output; frequency: minus `frequency` times its number of occurrences in the output."""
    vocab = logits.shape[1]
    out_counts = token_counts(output_ids, vocab)
    in_output = out_counts > 0
    seen = in_output | (token_counts(prompt_ids, vocab) > 0)
    r = repetition[:, None]
    logits = torch.where(seen, torch.where(logits > 0, logits / r, logits * r), logits)
    return logits - frequency[:, None] * out_counts - presence[:, None] * in_output


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """-inf where p < min_p * p_max (min_p = 0 keeps every token)."""
    probs = logits.softmax(dim=-1)
    threshold = min_p[:, None] * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(probs < threshold, float("-inf"))


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


def process_logits(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    """The logit processors that apply to greedy rows too: bias, bans, penalties."""
    if t.bias_ids is not None:
        logits = apply_logit_bias(logits, t.bias_ids, t.bias_values)
    if t.banned_ids is not None:
        logits = apply_banned(logits, t.banned_ids)
    if t.penalty_histories is not None:
        logits = apply_penalties_cpu(logits, t.penalty_histories, t.repetition_penalty,
                                     t.presence_penalty, t.frequency_penalty)
    elif t.repetition_penalty is not None:
        logits = apply_penalties(logits, t.prompt_ids, t.output_ids, t.repetition_penalty,
                                 t.presence_penalty, t.frequency_penalty)
    if t.grammar_rows is not None:  # last: nothing after it can lift a -inf
        logits = apply_token_bitmask(logits, t.grammar_rows, t.grammar_mask)
    return logits


def sample(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    """logits [B, V] fp32 -> token ids [B] int64 (on the logits' device)."""
    logits = process_logits(logits, t)
    # on the CPU max(dim).indices is argmax (first maximum on ties) at a third of its time
    greedy_ids = logits.max(dim=-1).indices if logits.device.type == "cpu" else \
        logits.argmax(dim=-1)
    if t.all_greedy:
        return greedy_ids
    temp = torch.where(t.temperature > 0, t.temperature, torch.ones_like(t.temperature))
    scaled = logits / temp[:, None]
    if t.min_p is not None:
        scaled = apply_min_p(scaled, t.min_p)
    if t.needs_sort:
        scaled = _apply_top_k_top_p(scaled, t.top_k, t.top_p)
    probs = scaled.softmax(dim=-1)
    # Exp(1); a draw of u that rounds to 1.0 in fp32 (1 in 2^25) gives 0, and 0 / 0 = nan
    # would win the argmax for a token of probability 0 (masked by top-k/p or a grammar)
    noise = -torch.log(uniform_noise(t.seeds, t.counters, logits.shape[-1]))
    noise = noise.clamp_min(1e-30)
    sampled = (probs / noise).argmax(dim=-1)
    return torch.where(t.temperature > 0, sampled, greedy_ids)


def compute_logprobs(logits: torch.Tensor, token_ids: torch.Tensor,
                     num_top: list[int]) -> list[TokenLogprobs | None]:
    """Logprobs (of the unmodified model distribution) of the chosen tokens and the top-n."""
    if not any(num_top):
        return [None] * len(num_top)
    logp = logits.log_softmax(dim=-1)
    chosen = logp.gather(-1, token_ids[:, None])[:, 0].tolist()
    n_max = min(max(num_top), logits.shape[-1])  # topk past the vocabulary would raise
    top_vals, top_ids = logp.topk(n_max, dim=-1)
    top_vals, top_ids = top_vals.tolist(), top_ids.tolist()
    return [TokenLogprobs(chosen[i], top_ids[i][:n], top_vals[i][:n]) if n else None
            for i, n in enumerate(num_top)]


class Sampler:
    """`sampler.sample_specs(logits, specs) -> (token ids, logprobs per row)`."""

    def __init__(self, vocab_size: int, device: torch.device | str) -> None:
        self.vocab_size = vocab_size
        self.device = torch.device(device)

    def sample_specs(self, logits: torch.Tensor, specs: Sequence[SampleSpec]
                     ) -> tuple[list[int], list[TokenLogprobs | None]]:
        params = [s.params for s in specs]
        t = SamplingTensors.build(params, [s.seed for s in specs], [s.counter for s in specs],
                                  self.vocab_size, self.device, specs)
        ids = sample(logits, t)
        return ids.tolist(), compute_logprobs(logits, ids, [p.logprobs or 0 for p in params])

    def __call__(self, logits: torch.Tensor, params: list[SamplingParams], seeds: list[int],
                 counters: list[int]) -> tuple[list[int], list[TokenLogprobs | None]]:
        """Rows without histories or banned ids (no penalties, no min_tokens)."""
        return self.sample_specs(logits, [SampleSpec(p, s, c) for p, s, c in
                                          zip(params, seeds, counters)])


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
