"""The model's elementwise ops on the CPU: `TorchOps` with each op one C pass (fp32 or bf16).

`backend/kernels/cpu/elementwise.c` does rms_norm, add + rms_norm, rotary (in place on the q/k
slices of the qkv output, as `ops.rotary` allows) and silu * mul, in fp32 or in bf16 (computed
in fp32 and rounded once per stored value, where torch rounds after every op). Anything else
(another dtype, mixed dtypes, a non-CPU tensor, an unusual layout, no compiler) goes to
`TorchOps`, which stays the reference the tests compare against.
"""
from __future__ import annotations

import torch

from backend.kernels.cpu import load_library
from backend.kernels.reference.ops import TorchOps

F32 = torch.float32
SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}


def _rows(x: torch.Tensor, dtype: torch.dtype) -> bool:
    """A CPU tensor of `dtype` whose last dimension is contiguous."""
    return x.dtype == dtype and x.device.type == "cpu" and x.stride(-1) == 1


class CpuOps(TorchOps):
    name = "cpu"

    def __init__(self) -> None:
        self.lib = load_library()

    def _fn(self, name: str, x: torch.Tensor):
        """The C function `name` for x's dtype, or None (no library, another dtype)."""
        suffix = SUFFIX.get(x.dtype)
        return None if self.lib is None or suffix is None else getattr(self.lib, f"{name}_{suffix}")

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        fn = self._fn("rms_norm", x)
        if fn is None or x.dim() != 2 or not (_rows(x, x.dtype) and _rows(weight, x.dtype)) \
                or not weight.is_contiguous():
            return TorchOps.rms_norm(x, weight, eps)
        tokens, h = x.shape
        out = torch.empty((tokens, h), dtype=x.dtype)
        if fn(x.data_ptr(), x.stride(0), weight.data_ptr(), tokens, h, eps, out.data_ptr()):
            return TorchOps.rms_norm(x, weight, eps)  # a row wider than the kernel's buffer
        return out

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        fn = self._fn("add_rms_norm", x)
        if fn is None or x.dim() != 2 or not (x.is_contiguous() and residual.is_contiguous()
                                              and weight.is_contiguous()) \
                or not (_rows(x, x.dtype) and _rows(residual, x.dtype) and _rows(weight, x.dtype)):
            return TorchOps.add_rms_norm(x, residual, weight, eps)
        tokens, h = x.shape
        out = torch.empty((tokens, h), dtype=x.dtype)
        new_residual = torch.empty((tokens, h), dtype=x.dtype)
        if fn(x.data_ptr(), residual.data_ptr(), weight.data_ptr(), tokens, h, eps,
              out.data_ptr(), new_residual.data_ptr()):
            return TorchOps.add_rms_norm(x, residual, weight, eps)
        return out, new_residual

    def rotary(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
               cos_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        d = q.shape[-1]
        fn = self._fn("rotary", q)
        if (fn is None or not (_rows(q, q.dtype) and _rows(k, q.dtype)) or q.stride(1) != d
                or k.stride(1) != d or positions.dtype != torch.int64
                or not positions.is_contiguous() or not cos_sin.is_contiguous()
                or cos_sin.dtype != F32 or q.shape[0] != k.shape[0]):
            return TorchOps.rotary(q, k, positions, cos_sin)
        fn(q.data_ptr(), q.stride(0), q.shape[1], k.data_ptr(), k.stride(0), k.shape[1],
           positions.data_ptr(), cos_sin.data_ptr(), d, q.shape[0])
        return q, k

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        fn = self._fn("silu_and_mul", x)
        if fn is None or x.dim() != 2 or not (_rows(x, x.dtype) and x.is_contiguous()):
            return TorchOps.silu_and_mul(x)
        tokens, two_i = x.shape
        out = torch.empty((tokens, two_i // 2), dtype=x.dtype)
        fn(x.data_ptr(), tokens, two_i // 2, out.data_ptr())
        return out
