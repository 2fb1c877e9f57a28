"""SiLU(gate) * up over the output of the fused gate_up projection.

    gate_up [..., 2 * intermediate] = [gate | up]   ->   out [..., intermediate]

fp32 math, one rounding to the input dtype. Triton: grid (rows, column blocks); each element of
gate_up is read once and each output written once.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from backend.kernels.triton_utils import (
    HAS_TRITON,
    cdiv,
    pdl_args,
    pdl_enter,
    tl,
    triton,
    use_triton,
)

BLOCK = 1024


def silu_and_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    inter = gate_up.shape[-1] // 2
    acc_dtype = torch.promote_types(gate_up.dtype, torch.float32)
    gate, up = gate_up[..., :inter].to(acc_dtype), gate_up[..., inter:].to(acc_dtype)
    return (F.silu(gate) * up).to(gate_up.dtype)


if HAS_TRITON:

    @triton.jit
    def _silu_and_mul_kernel(in_ptr, out_ptr, stride_in, stride_out, inter,
                             BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
        pdl_enter(USE_PDL)
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < inter
        gate = tl.load(in_ptr + row * stride_in + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(in_ptr + row * stride_in + inter + cols, mask=mask, other=0.0).to(tl.float32)
        out = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate_up[..., :I]) * gate_up[..., I:] -> [..., I]."""
    if not use_triton(gate_up):
        return silu_and_mul_reference(gate_up)
    inter = gate_up.shape[-1] // 2
    x2 = gate_up.reshape(-1, gate_up.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty((x2.shape[0], inter), dtype=gate_up.dtype, device=gate_up.device)
    if x2.shape[0]:
        _silu_and_mul_kernel[(x2.shape[0], cdiv(inter, BLOCK))](
            x2, out, x2.stride(0), out.stride(0), inter, BLOCK=BLOCK, num_warps=4,
            **pdl_args(x2),
        )
    return out.view(*gate_up.shape[:-1], inter)
