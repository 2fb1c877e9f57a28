"""The model's elementwise ops on the CPU: `TorchOps` with each op one C pass (fp32).

`backend/kernels/cpu/elementwise.c` does rms_norm, add + rms_norm, rotary (in place on the q/k
slices of the qkv output, as `ops.rotary` allows) and silu * mul. Anything else (another dtype,
a non-CPU tensor, an unusual layout, no compiler) goes to `TorchOps`, which stays the reference
the tests compare against.
"""
from __future__ import annotations

import torch

from backend.kernels.cpu import load_library
from backend.kernels.reference.ops import TorchOps

F32 = torch.float32


def _rows(x: torch.Tensor) -> bool:
    """fp32 CPU tensor whose last dimension is contiguous."""
    return x.dtype == F32 and x.device.type == "cpu" and x.stride(-1) == 1


class CpuOps(TorchOps):
    name = "cpu"

    def __init__(self) -> None:
        self.lib = load_library()

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if self.lib is None or x.dim() != 2 or not (_rows(x) and _rows(weight)) \
                or not weight.is_contiguous():
            return TorchOps.rms_norm(x, weight, eps)
        tokens, h = x.shape
        out = torch.empty((tokens, h), dtype=F32)
        self.lib.rms_norm_f32(x.data_ptr(), x.stride(0), weight.data_ptr(), tokens, h, eps,
                              out.data_ptr())
        return out

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        if self.lib is None or x.dim() != 2 or not (x.is_contiguous() and residual.is_contiguous()
                                                    and weight.is_contiguous()) \
                or not (_rows(x) and _rows(residual) and _rows(weight)):
            return TorchOps.add_rms_norm(x, residual, weight, eps)
        tokens, h = x.shape
        out = torch.empty((tokens, h), dtype=F32)
        new_residual = torch.empty((tokens, h), dtype=F32)
        self.lib.add_rms_norm_f32(x.data_ptr(), residual.data_ptr(), weight.data_ptr(), tokens, h,
                                  eps, out.data_ptr(), new_residual.data_ptr())
        return out, new_residual

    def rotary(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
               cos_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        d = q.shape[-1]
        if (self.lib is None or not (_rows(q) and _rows(k)) or q.stride(1) != d or k.stride(1) != d
                or positions.dtype != torch.int64 or not positions.is_contiguous()
                or not cos_sin.is_contiguous() or cos_sin.dtype != F32 or q.shape[0] != k.shape[0]):
            return TorchOps.rotary(q, k, positions, cos_sin)
        self.lib.rotary_f32(q.data_ptr(), q.stride(0), q.shape[1], k.data_ptr(), k.stride(0),
                            k.shape[1], positions.data_ptr(), cos_sin.data_ptr(), d, q.shape[0])
        return q, k

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        if self.lib is None or x.dim() != 2 or not (_rows(x) and x.is_contiguous()):
            return TorchOps.silu_and_mul(x)
        tokens, two_i = x.shape
        out = torch.empty((tokens, two_i // 2), dtype=F32)
        self.lib.silu_and_mul_f32(x.data_ptr(), tokens, two_i // 2, out.data_ptr())
        return out
