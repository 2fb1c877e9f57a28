"""RMSNorm, plain and fused with the residual add that precedes it in every LLaMA block.

Rounding follows HF's LlamaRMSNorm so the fused kernel and the unfused torch path agree:

    new_residual = (x + residual)                       rounded to the model dtype
    h            = float32(new_residual)
    normed       = weight * (h * rsqrt(mean(h^2) + eps)).to(dtype)

Triton: one program per row (token); the whole row sits in registers (hidden 7168 -> 8192 lanes),
so x and residual are read once and normed and new_residual written once.
"""
from __future__ import annotations

import torch

from backend.kernels.triton_utils import (
    HAS_TRITON,
    next_power_of_2,
    pdl_args,
    pdl_enter,
    tl,
    triton,
    use_triton,
)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    acc_dtype = torch.promote_types(x.dtype, torch.float32)
    h = x.to(acc_dtype)
    h = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (weight * h.to(x.dtype)).to(x.dtype)


def fused_add_rms_norm_reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    new_residual = x + residual
    return rms_norm_reference(new_residual, weight, eps), new_residual


if HAS_TRITON:

    @triton.jit
    def _rms_norm_kernel(
        x_ptr, residual_ptr, weight_ptr, out_ptr, new_residual_ptr, eps,
        stride_x, stride_r, stride_o, stride_nr, hidden,
        HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr,
    ):
        pdl_enter(USE_PDL)
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        mask = offs < hidden
        x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
        if HAS_RESIDUAL:
            r = tl.load(residual_ptr + row * stride_r + offs, mask=mask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
            tl.store(new_residual_ptr + row * stride_nr + offs, x, mask=mask)
        h = x.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / hidden + eps)
        w = tl.load(weight_ptr + offs, mask=mask, other=0.0)
        y = (h * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w.to(tl.float32)
        tl.store(out_ptr + row * stride_o + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _launch(x2, r2, weight, eps, out, new_r):
    hidden = x2.shape[-1]
    block = next_power_of_2(hidden)
    num_warps = min(16, max(4, block // 1024))
    _rms_norm_kernel[(x2.shape[0],)](
        x2, r2 if r2 is not None else x2, weight, out, new_r if new_r is not None else out, eps,
        x2.stride(0), r2.stride(0) if r2 is not None else 0, out.stride(0),
        new_r.stride(0) if new_r is not None else 0, hidden,
        HAS_RESIDUAL=r2 is not None, BLOCK=block, num_warps=num_warps, **pdl_args(x2),
    )


def _rows(t: torch.Tensor) -> torch.Tensor:
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of x [..., hidden]."""
    if not use_triton(x):
        return rms_norm_reference(x, weight, eps)
    x2 = _rows(x)
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        _launch(x2, None, weight, eps, out, None)
    return out.view(x.shape)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual) in one pass."""
    if not use_triton(x):
        return fused_add_rms_norm_reference(x, residual, weight, eps)
    x2, r2 = _rows(x), _rows(residual)
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    new_r = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        _launch(x2, r2, weight, eps, out, new_r)
    return out.view(x.shape), new_r.view(x.shape)
