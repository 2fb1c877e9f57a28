"""Elementwise / normalization ops the model calls, torch reference versions.

The model receives an `Ops` object; `backend/kernels/` provides one with the same methods
(fused Triton kernels). Signatures, shapes (T = tokens in the step):

    rms_norm(x [T, H], weight [H], eps) -> [T, H]
    add_rms_norm(x [T, H], residual [T, H], weight, eps) -> (normed [T, H], new_residual = x + residual)
    rotary(q [T, Hq, D], k [T, Hkv, D], positions [T], cos_sin [max_len, D]) -> (q, k) rotated
        cos_sin[p] = [cos(p * inv_freq) | sin(p * inv_freq)] (each D/2); rotate-half (NeoX/HF
        LLaMA) layout. A kernel may rotate in place and return its inputs.
    add_rms_norm_linear(x [T, H], residual [T, H] | None, weight, eps, linear) ->
        (linear(normed) [T, out], new_residual): the norm and the projection after it (qkv,
        gate_up); residual None is the first layer's plain rms_norm (new_residual = x). A
        kernel ops object may fold the norm into the projection's GEMV
    silu_and_mul(x [T, 2 * I]) -> [T, I]: silu(x[:, :I]) * x[:, I:]
    silu_mul_linear(x [T, 2 * I], linear) -> [T, out]: linear(silu_and_mul(x)) (the MLP's down
        projection; a kernel ops object may run both in one launch)

Numerics follow transformers' LLaMA: norms in fp32, the result cast back to the input dtype
before the weight multiply.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def rope_cos_sin(head_dim: int, max_len: int, theta: float, scaling_factor: float,
                 device: torch.device | str | None = None) -> torch.Tensor:
    """[max_len, head_dim] fp32 table: cos in the first half, sin in the second.

    Linear scaling (position interpolation) divides positions by `scaling_factor`."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device)
                                .float() / head_dim))
    inv_freq = inv_freq / scaling_factor
    t = torch.arange(max_len, dtype=torch.int64, device=device).float()
    freqs = torch.outer(t, inv_freq)  # [max_len, D/2]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


class TorchOps:
    name = "torch"

    @staticmethod
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return weight * xf.to(dtype)

    @classmethod
    def add_rms_norm(cls, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        residual = x + residual
        return cls.rms_norm(residual, weight, eps), residual

    def add_rms_norm_linear(self, x: torch.Tensor, residual: torch.Tensor | None,
                            weight: torch.Tensor, eps: float,
                            linear) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return linear(self.rms_norm(x, weight, eps)), x
        normed, residual = self.add_rms_norm(x, residual, weight, eps)
        return linear(normed), residual

    @staticmethod
    def rotary(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
               cos_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cs = cos_sin.index_select(0, positions)  # [T, D]
        half = cs.shape[-1] // 2
        cos = torch.cat([cs[:, :half], cs[:, :half]], dim=-1)[:, None, :]  # [T, 1, D]
        sin = torch.cat([cs[:, half:], cs[:, half:]], dim=-1)[:, None, :]

        def rot(x: torch.Tensor) -> torch.Tensor:
            cos_, sin_ = cos.to(x.dtype), sin.to(x.dtype)
            x1, x2 = x[..., :half], x[..., half:]
            return x * cos_ + torch.cat([-x2, x1], dim=-1) * sin_

        return rot(q), rot(k)

    @staticmethod
    def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return F.silu(x[..., :half]) * x[..., half:]

    def silu_mul_linear(self, x: torch.Tensor, linear) -> torch.Tensor:
        return linear(self.silu_and_mul(x))


TORCH_OPS = TorchOps()
