"""Attention for the CPU engine: a paged kernel in C behind the model's attention seam.

`CpuAttention` has `TorchAttention`'s call signature. It writes K/V into their pages like the
reference, then runs `cpu_kernels/paged_attention.c` once per layer for every sequence of the
step (decodes and prefill chunks alike): K/V are read in place from the pages, so nothing is
gathered, padded or upcast per step, and there is no Python loop over sequences. The reference
(`backend.kernels.reference.attention`) stays the oracle and the fallback for what the kernel does not take
(non-fp32 pools, quantized pools, no C compiler).

The kernel is built at first use for this CPU (`backend.kernels.cpu`); set
`TIDEGATE_CPU_KERNELS=off` to use the reference.
"""
from __future__ import annotations

import torch

from backend.kernels.cpu import load_library
from backend.kernels.forward_context import ForwardContext
from backend.kernels.reference.attention import TorchAttention, write_kv


class CpuAttention(TorchAttention):
    """`TorchAttention` with the step's attention in one C call per layer (fp32 pools)."""

    def __init__(self, scale: float) -> None:
        super().__init__(scale)
        lib = load_library()
        self._kernel = lib.paged_attention_f32 if lib is not None else None

    @property
    def uses_kernel(self) -> bool:
        return self._kernel is not None

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 k_cache: torch.Tensor, v_cache: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        if (self._kernel is None or not isinstance(k_cache, torch.Tensor)
                or k_cache.dtype != torch.float32 or q.dtype != torch.float32
                or k_cache.device.type != "cpu"):
            return super().__call__(q, k, v, k_cache, v_cache, ctx)
        write_kv(k, v, k_cache, v_cache, ctx.slot_mapping)
        if q.stride(2) != 1 or q.stride(1) != q.shape[2]:
            q = q.contiguous()
        num_tokens, num_heads, head_dim = q.shape
        out = torch.empty(q.shape, dtype=q.dtype)
        n = ctx.num_tokens
        if n < num_tokens:
            out[n:].zero_()  # padding rows, as the reference
        tables = ctx.block_tables
        if tables.stride(1) != 1:
            tables = tables.contiguous()
        qsl = ctx.query_start_loc
        lens = ctx.context_lens
        rc = self._kernel(
            q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(),
            tables.stride(0), qsl.data_ptr(), lens.data_ptr(), ctx.num_seqs, num_heads,
            k_cache.shape[2], head_dim, k_cache.shape[1], self.scale, out.data_ptr())
        if rc != 0:
            raise ValueError(f"CPU attention kernel refused the shapes (code {rc})")
        return out
