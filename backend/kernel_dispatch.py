"""The CUDA path: the Triton kernels of `backend/kernels/` behind the model's ops/attention seams.

`install_kernels(model)` swaps the model's injected `ops` and `attn` objects (the model itself
has no kernel branches):

    ops   KernelOps:        rms_norm, fused add + rms_norm, silu_and_mul (Triton)
    attn  KernelAttention:  one call per layer
            rotary_kv_write: rotate q, k in place + write K/V into their pages (one launch)
            decodes  [0, d):    paged_decode_attention (split-K, CUDA-graph safe)
            prefills [d, d+p):  torch SDPA per sequence (flash on CUDA; causal when the chunk
                                is the whole context, else a bottom-right causal mask over the
                                gathered cached prefix | chunk)

Every kernel entry point falls back to its torch reference for CPU tensors, so this module runs
(and is tested against `TorchOps`/`TorchAttention`) on the CPU too.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from backend.kernels.paged_decode_attention import paged_decode_attention
from backend.kernels.rmsnorm import fused_add_rms_norm, rms_norm
from backend.kernels.rotary_kv import rotary_kv_write
from backend.kernels.silu_mul import silu_and_mul
from backend.kernels.triton_utils import HAS_TRITON
from backend.ops import TorchOps


def kernels_available(device: torch.device) -> bool:
    """True where the Triton kernels serve `device` (CUDA + Triton, not forced off by
    `TIDEGATE_KERNELS=torch`)."""
    return (device.type == "cuda" and HAS_TRITON
            and os.environ.get("TIDEGATE_KERNELS", "") != "torch")


class KernelOps(TorchOps):
    """`TorchOps` with the norm and activation ops on the fused kernels. Rotary is fused with
    the K/V write in `KernelAttention`: where the model calls `ops.rotary` before `attn(...)`,
    this ops object only notes the rotary table and returns q, k unrotated; its paired
    `KernelAttention` (made together by `install_kernels`) rotates them."""
    name = "triton"

    def __init__(self) -> None:
        self.cos_sin: torch.Tensor | None = None

    @staticmethod
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return rms_norm(x, weight, eps)

    @staticmethod
    def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        return fused_add_rms_norm(x, residual, weight, eps)

    def rotary(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
               cos_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.cos_sin = cos_sin  # deferred to KernelAttention (rotary + K/V write, one launch)
        return q, k

    @staticmethod
    def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
        return silu_and_mul(x)


def _gather(cache: torch.Tensor, block_table: torch.Tensor, context_len: int) -> torch.Tensor:
    """[context_len, num_kv_heads, head_dim] of one sequence through its block table."""
    block_size = cache.shape[1]
    pages = cache.index_select(0, block_table[: -(-context_len // block_size)].long())
    return pages.reshape(-1, *cache.shape[2:])[:context_len]


def prefill_attention_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, query_start_loc_host: list[int],
                           context_lens_host: list[int], scale: float) -> torch.Tensor:
    """Same contract as `backend.attention.prefill_attention`, plus this step's (rotated) k/v
    [num_prefill_tokens, Hkv, D] so a chunk that is its whole context needs no gather."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    out = torch.empty((q.shape[0], num_heads, head_dim), dtype=q.dtype, device=q.device)
    for i, context_len in enumerate(context_lens_host):
        start, end = query_start_loc_host[i], query_start_loc_host[i + 1]
        query_len = end - start
        if query_len == 0:
            continue
        if context_len == query_len:  # no cached prefix: the chunk's own k/v
            ki, vi = k[start:end], v[start:end]
            mask, causal = None, True
        else:  # cached prefix | chunk, read back through the block table
            ki = _gather(k_cache, block_tables[i], context_len).to(q.dtype)
            vi = _gather(v_cache, block_tables[i], context_len).to(q.dtype)
            # query j sits at position context_len - query_len + j (bottom-right causal)
            q_pos = torch.arange(context_len - query_len, context_len, device=q.device)
            mask = torch.arange(context_len, device=q.device)[None, :] <= q_pos[:, None]
            causal = False
        rep = num_heads // ki.shape[1]
        # [C, Hkv, D] -> [1, H, C, D]: kv head g serves query heads g*rep .. g*rep+rep-1
        ki = ki[:, :, None, :].expand(-1, -1, rep, -1).reshape(-1, num_heads, head_dim)
        vi = vi[:, :, None, :].expand(-1, -1, rep, -1).reshape(-1, num_heads, head_dim)
        o = F.scaled_dot_product_attention(
            q[start:end].transpose(0, 1)[None], ki.transpose(0, 1)[None],
            vi.transpose(0, 1)[None], attn_mask=mask, is_causal=causal, scale=scale)
        out[start:end] = o[0].transpose(0, 1)
    return out


class KernelAttention:
    """Attention backend for the CUDA path (see the module docstring). Takes either call form:
    `(q, k, v, positions, cos_sin, k_cache, v_cache, ctx)` (rotary inside attention), or
    `(q, k, v, k_cache, v_cache, ctx)` after its paired `KernelOps.rotary` (positions from ctx)."""

    def __init__(self, scale: float, ops: KernelOps) -> None:
        self.scale = scale
        self.ops = ops

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *rest) -> torch.Tensor:
        """q [T, H, D], k/v [T, Hkv, D] before rotary, positions [T], cos_sin [max_len, D]
        (cos | sin). Returns [T, H, D]; padding rows are zeros."""
        num_tokens = q.shape[0]
        if len(rest) == 5:
            positions, cos_sin, k_cache, v_cache, ctx = rest
        else:
            k_cache, v_cache, ctx = rest
            positions, cos_sin = ctx.positions[:num_tokens], self.ops.cos_sin
        half = cos_sin.shape[-1] // 2
        rotary_kv_write(positions, q, k, v, cos_sin[:, :half], cos_sin[:, half:], k_cache,
                        v_cache, ctx.slot_mapping[:num_tokens])
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        d, p = ctx.num_decode_tokens, ctx.num_prefill_tokens
        if d:
            paged_decode_attention(q[:d], k_cache, v_cache, ctx.block_tables[:d],
                                   ctx.context_lens[:d], self.scale,
                                   max_context_len=max(1, ctx.max_context_len), out=out[:d])
        if p:
            n = ctx.num_prefills
            starts = [x - d for x in ctx.query_start_loc_host[d:d + n + 1]]
            out[d:d + p] = prefill_attention_sdpa(
                q[d:d + p], k[d:d + p], v[d:d + p], k_cache, v_cache, ctx.block_tables[d:d + n],
                starts, ctx.context_lens_host[d:d + n], self.scale)
        if num_tokens > d + p:
            out[d + p:].zero_()
        return out


def install_kernels(model) -> None:
    """Swap `model.ops` / `model.attn` for the kernel versions (one fused pair)."""
    ops = KernelOps()
    model.ops = ops
    model.attn = KernelAttention(model.config.head_dim ** -0.5, ops)
