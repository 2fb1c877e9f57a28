"""Cost models: how long one backend step takes, and how many KV blocks fit.

One interface (`CostModel`), two implementations:

* `RooflineCost` — from a model shape and a GPU spec: a step moves the weights once plus the KV of
  every sequence it attends over, and does 2 FLOPs per parameter per token plus attention; its time is
  ``max(bytes / bandwidth, flops / peak) + tensor-parallel all-reduces + fixed overhead``.
* `ProfileCost` — a measured profile (`tidegate backend profile` JSON), interpolated.

Step arguments, the same for both:
  num_decode_seqs     sequences producing one token each by decoding
  num_prefill_tokens  prompt tokens computed this step (all prefill chunks together)
  num_context_tokens  KV tokens read by attention this step, summed over every sequence in it
                      (a decode sequence of length n reads n; a prefill chunk reads its prefix + itself)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from sims.hardware import GpuSpec, allreduce_time, link
from sims.model_shape import ModelShape, dtype_bytes


class CostModel(Protocol):
    def step_time(self, num_decode_seqs: int, num_prefill_tokens: int,
                  num_context_tokens: int) -> float:
        """Seconds one step takes."""
        ...

    def decode_times(self, num_decode_seqs: int, num_context_tokens: int, k: int) -> np.ndarray:
        """Seconds of each of `k` pure-decode steps; context grows by `num_decode_seqs` per step."""
        ...

    def num_kv_blocks(self, block_size: int) -> int:
        """KV blocks of `block_size` tokens that fit beside the weights (per backend)."""
        ...

# Optional, for speed (the simulator falls back to `decode_times` without them):
#   decode_span(num_decode_seqs, num_context_tokens, k) -> float   sum of decode_times(...), O(1)
#   decode_step_times(num_decode_seqs: ndarray, num_context_tokens: ndarray) -> ndarray
#       one pure-decode step per element, vectorized over many stretches


def decode_span_by_times(cost: CostModel, num_decode_seqs: int, num_context_tokens: int,
                         k: int) -> float:
    """Generic `decode_span`: the sum of `decode_times` (a model without a closed form)."""
    return float(np.sum(cost.decode_times(num_decode_seqs, num_context_tokens, k))) if k > 0 else 0.0


def decode_times_by_steps(cost: CostModel, num_decode_seqs: int, num_context_tokens: int,
                          k: int) -> np.ndarray:
    """Generic `decode_times` for a model without a vectorized form: one call per step."""
    return np.array([cost.step_time(num_decode_seqs, 0, num_context_tokens + i * num_decode_seqs)
                     for i in range(k)], dtype=np.float64)


@dataclass(frozen=True)
class RooflineConfig:
    weight_dtype: str = "bf16"       # bf16 | fp16 | fp8 | fp32
    kv_dtype: str = "bf16"           # bf16 | fp16 | fp8 | int4-fp8 | fp32
    tp: int = 1                      # tensor-parallel degree (GPUs per backend)
    interconnect: str = "nvlink"     # nvlink | pcie, for the TP all-reduces
    overhead_s: float = 0.5e-3       # fixed per-step cost: launch, scheduling, sampling
    gpu_memory_utilization: float = 0.9
    activation_reserve_bytes: float = 2 * 2**30  # activations, logits, CUDA graphs (per GPU)


class RooflineCost:
    """Roofline step time for one backend of `config.tp` GPUs (see module docstring)."""

    def __init__(self, shape: ModelShape, gpu: GpuSpec, config: RooflineConfig = RooflineConfig()):
        if config.tp < 1 or shape.num_heads % config.tp:
            raise ValueError(f"tp={config.tp} must divide num_heads={shape.num_heads}")
        self.shape, self.gpu, self.config = shape, gpu, config
        tp = config.tp
        wb = dtype_bytes(config.weight_dtype)
        self.weight_bytes_per_gpu = shape.num_params * wb / tp
        self.kv_bytes_per_token = shape.kv_elems_per_token() * dtype_bytes(config.kv_dtype)
        act_bytes = 2.0  # activations travel in bf16
        # Time terms per GPU, as coefficients so that step_time is a few float ops.
        bw, peak = gpu.bandwidth, gpu.peak_flops(config.weight_dtype)
        self._t_weights = self.weight_bytes_per_gpu / bw
        # KV heads split over the GPUs; with fewer KV heads than GPUs each holds a copy of one
        self.kv_shards = min(tp, shape.num_kv_heads)
        self._t_kv_per_ctx = self.kv_bytes_per_token / self.kv_shards / bw  # read
        self._t_kv_per_tok = self.kv_bytes_per_token / self.kv_shards / bw  # write of new K/V
        self._f_per_tok = 2.0 * shape.matmul_params_per_token / tp / peak
        attn = 4.0 * shape.num_layers * shape.q_size / tp / gpu.peak_flops("bf16")
        self._f_per_ctx = attn                                            # QK^T and PV per pair
        self._f_per_prefill_sq = attn / 2.0                               # causal chunk pairs
        if tp > 1:
            link_bw, link_lat = link(gpu, config.interconnect)
            per_tok = shape.hidden_size * act_bytes
            # two all-reduces per layer (after attention and after the MLP)
            self._c_fixed = 2 * shape.num_layers * allreduce_time(0.0, tp, link_bw, link_lat)
            self._c_per_tok = 2 * shape.num_layers * (
                allreduce_time(per_tok, tp, link_bw, 0.0))
        else:
            self._c_fixed = self._c_per_tok = 0.0
        self._overhead = config.overhead_s

    def step_time(self, num_decode_seqs: int, num_prefill_tokens: int,
                  num_context_tokens: int) -> float:
        tokens = num_decode_seqs + num_prefill_tokens
        if tokens == 0:
            return 0.0
        t_mem = self._t_weights + self._t_kv_per_ctx * num_context_tokens + self._t_kv_per_tok * tokens
        t_flop = (self._f_per_tok * tokens + self._f_per_ctx * num_context_tokens
                  + self._f_per_prefill_sq * num_prefill_tokens * num_prefill_tokens)
        return (max(t_flop, t_mem)) + self._c_fixed + self._c_per_tok * tokens \
            + self._overhead

    def decode_times(self, num_decode_seqs: int, num_context_tokens: int, k: int) -> np.ndarray:
        ctx = num_context_tokens + num_decode_seqs * np.arange(k, dtype=np.float64)
        n = num_decode_seqs
        t_mem = self._t_weights + self._t_kv_per_ctx * ctx + self._t_kv_per_tok * n
        t_flop = self._f_per_tok * n + self._f_per_ctx * ctx
        return np.maximum(t_mem, t_flop) + (self._c_fixed + self._c_per_tok * n + self._overhead)

    def decode_span(self, num_decode_seqs: int, num_context_tokens: int, k: int) -> float:
        """sum(decode_times(n, ctx, k)) in closed form: each step is the max of two lines in the
        step index (memory, compute), which cross at most once."""
        if k <= 0:
            return 0.0
        n, ctx = num_decode_seqs, num_context_tokens
        m0 = self._t_weights + self._t_kv_per_ctx * ctx + self._t_kv_per_tok * n
        m1 = self._t_kv_per_ctx * n
        f0 = self._f_per_tok * n + self._f_per_ctx * ctx
        f1 = self._f_per_ctx * n
        c = self._c_fixed + self._c_per_tok * n + self._overhead
        last = k - 1
        mem_first, mem_last = f0 <= m0, f0 + f1 * last <= m0 + m1 * last
        if mem_first == mem_last:  # one line wins throughout
            a0, a1 = (m0, m1) if mem_first else (f0, f1)
            return k * (a0 + c) + a1 * (k * last * 0.5)
        # the winner at step 0 wins below the crossing index x, the other from ceil(x) on
        s = min(k, max(0, math.ceil((m0 - f0) / (f1 - m1))))
        (a0, a1), (b0, b1) = ((m0, m1), (f0, f1)) if mem_first else ((f0, f1), (m0, m1))
        return (k * c + s * a0 + a1 * (s * (s - 1) * 0.5)
                + (k - s) * b0 + b1 * ((k * last - s * (s - 1)) * 0.5))

    def decode_step_times(self, num_decode_seqs: np.ndarray, num_context_tokens: np.ndarray
                          ) -> np.ndarray:
        """`decode_times` of many steps at once, the same float operations in the same order
        (so the same bits), done in place: three arrays of the input's length instead of ten
        (a 512-backend run passes 12.8M steps here)."""
        n, ctx = num_decode_seqs.astype(np.float64), num_context_tokens.astype(np.float64)
        t_mem = ctx * self._t_kv_per_ctx
        t_mem += self._t_weights
        t_flop = n * self._t_kv_per_tok
        t_mem += t_flop                          # t_weights + kv_per_ctx * ctx + kv_per_tok * n
        np.multiply(n, self._f_per_tok, out=t_flop)
        ctx *= self._f_per_ctx
        t_flop += ctx                            # f_per_tok * n + f_per_ctx * ctx
        np.maximum(t_mem, t_flop, out=t_mem)
        n *= self._c_per_tok
        n += self._c_fixed
        n += self._overhead                      # c_fixed + c_per_tok * n + overhead
        t_mem += n
        return t_mem

    def num_kv_blocks(self, block_size: int) -> int:
        c = self.config
        free = (self.gpu.memory_bytes * c.gpu_memory_utilization - self.weight_bytes_per_gpu
                - c.activation_reserve_bytes)
        per_block = block_size * self.kv_bytes_per_token / self.kv_shards
        return max(0, int(free // per_block))

    def describe(self) -> dict:
        c = self.config
        return {"kind": "roofline", "model": self.shape.name, "gpu": self.gpu.name, "tp": c.tp,
                "weight_dtype": c.weight_dtype, "kv_dtype": c.kv_dtype,
                "weights_gb_per_gpu": round(self.weight_bytes_per_gpu / 1e9, 3),
                "kv_bytes_per_token": self.kv_bytes_per_token,
                "weights_read_ms": round(self._t_weights * 1e3, 4), "overhead_ms": c.overhead_s * 1e3,
                "bandwidth_tb_s": self.gpu.bandwidth / 1e12,
                "peak_tflops": self.gpu.peak_flops(c.weight_dtype) / 1e12}


class ConstantCost:
    """Every non-empty step takes `seconds`: for closed-form checks (M/D/1) and tests."""

    def __init__(self, seconds: float, num_blocks: int = 1 << 20):
        self.seconds, self.blocks = float(seconds), int(num_blocks)

    def step_time(self, num_decode_seqs: int, num_prefill_tokens: int,
                  num_context_tokens: int) -> float:
        return self.seconds if num_decode_seqs + num_prefill_tokens else 0.0

    def decode_times(self, num_decode_seqs: int, num_context_tokens: int, k: int) -> np.ndarray:
        return np.full(k, self.seconds if num_decode_seqs else 0.0)

    def decode_span(self, num_decode_seqs: int, num_context_tokens: int, k: int) -> float:
        return k * self.seconds if num_decode_seqs and k > 0 else 0.0

    def decode_step_times(self, num_decode_seqs: np.ndarray, num_context_tokens: np.ndarray
                          ) -> np.ndarray:
        return np.where(num_decode_seqs > 0, self.seconds, 0.0)

    def num_kv_blocks(self, block_size: int) -> int:
        return self.blocks

    def describe(self) -> dict:
        return {"kind": "constant", "step_ms": self.seconds * 1e3, "num_blocks": self.blocks}


def prefill_capacity_tokens_per_s(cost: CostModel, chunk: int = 2048) -> float:
    """Prompt tokens/s of back-to-back prefill chunks (no decode): a capacity figure."""
    return chunk / cost.step_time(0, chunk, chunk)


def decode_capacity_tokens_per_s(cost: CostModel, num_seqs: int, context_len: int) -> float:
    """Output tokens/s of pure decode at `num_seqs` sequences of `context_len` tokens each."""
    return num_seqs / cost.step_time(num_seqs, 0, num_seqs * context_len)
