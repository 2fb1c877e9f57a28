"""Weight quantization as a transform on a loaded model (the model file has no quant branches).

`quantize_model(model, "fp8")` replaces every `nn.Linear` (qkv, o, gate_up, down, LM head) by an
`Fp8Linear`: weights in E4M3 with one fp32 scale per output channel,

    w [N, K] (bf16)  ->  w_fp8 [N, K] float8_e4m3fn, scale [N] fp32,  w ~= w_fp8 * scale[:, None]
    scale[n] = max_k |w[n, k]| / 448

and `forward` calls the kernels' `fp8_linear` dispatcher: the Triton weight-only GEMV for small
M (decode), per-token fp8 activations + `torch._scaled_mm` for large M (prefill), the torch
oracle on the CPU. Layers are converted one at a time, so the peak memory is the bf16 model plus
one layer's fp32 temporaries, and the bf16 weights are freed as they go.

Running FP8 weights needs CUDA compute capability >= 8.9 (Ada, Hopper); anywhere else
`quantize_model` raises `QuantizationError` with a one-line reason. Tests convert on the CPU with
`check_device=False` to check the numerics through the oracle.
"""
from __future__ import annotations

import torch
from torch import nn

from backend.kernels.fp8_gemv import (
    FP8_DTYPE,
    check_fp8_support,
    dequantize_fp8_per_channel,
    fp8_linear,
    quantize_fp8_per_channel,
)

METHODS = ("none", "fp8")


class QuantizationError(ValueError):
    """The requested quantization cannot run here (one-line message)."""


class Fp8Linear(nn.Module):
    """y = x @ (weight_fp8 * weight_scale).T, no bias."""

    def __init__(self, weight_fp8: torch.Tensor, weight_scale: torch.Tensor) -> None:
        super().__init__()
        assert weight_fp8.dtype == FP8_DTYPE and weight_scale.shape == weight_fp8.shape[:1]
        self.out_features, self.in_features = weight_fp8.shape
        self.register_buffer("weight_fp8", weight_fp8)
        self.register_buffer("weight_scale", weight_scale.to(torch.float32))

    @classmethod
    @torch.no_grad()
    def from_linear(cls, linear: nn.Linear) -> Fp8Linear:
        if linear.bias is not None:
            raise QuantizationError("fp8 linear layers with a bias are not supported")
        w_fp8, scale = quantize_fp8_per_channel(linear.weight.detach())
        return cls(w_fp8, scale)

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize_fp8_per_channel(self.weight_fp8, self.weight_scale, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_linear(x, self.weight_fp8, self.weight_scale)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8_e4m3"


def check_support(device: torch.device | str) -> None:
    try:
        check_fp8_support(device)
    except RuntimeError as exc:
        raise QuantizationError(str(exc)) from None


@torch.no_grad()
def quantize_model(model: nn.Module, method: str = "fp8", check_device: bool = True) -> int:
    """Replace every `nn.Linear` of `model` in place; returns how many were replaced."""
    if method in (None, "", "none"):
        return 0
    if method != "fp8":
        raise QuantizationError(f"unknown quantization {method!r} (choose from {', '.join(METHODS)})")
    if check_device:
        device = next(model.parameters()).device
        check_support(device)
    packed = [name for name, m in model.named_modules() if type(m).__name__ == "PackedLinear"]
    if packed:
        # a CPU bf16 engine's projections in oneDNN's layout keep no nn.Linear weight: quantizing
        # around them replaced nothing and left the model bf16 (a quality test passed vacuously)
        raise QuantizationError(f"{len(packed)} projections are packed for oneDNN ({packed[0]}, "
                                "...): quantize before backend.kernels.cpu.linear.pack_linears "
                                "(or build the engine with TIDEGATE_CPU_PACK=0)")
    targets = [(parent, name) for parent in model.modules()
               for name, child in parent.named_children() if isinstance(child, nn.Linear)]
    for parent, name in targets:
        linear = getattr(parent, name)
        setattr(parent, name, Fp8Linear.from_linear(linear))
        del linear  # the bf16 weight is freed here (nothing else holds it)
    return len(targets)


def weight_bytes(model: nn.Module, include_embedding: bool = False) -> int:
    """Bytes of the parameters and buffers a forward step streams (fp8 weights + scales, norms,
    LM head); the embedding table is only gathered, so it is left out unless asked."""
    total = 0
    embed = getattr(model, "embed_tokens", None)
    skip = set()
    if embed is not None and not include_embedding and getattr(model, "lm_head", 1) is not None:
        skip.add(id(embed.weight))
    seen = set()
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) in skip or id(t) in seen or t.numel() == 0:
            continue
        seen.add(id(t))
        if t is getattr(model, "cos_sin", None):
            continue
        total += t.numel() * t.element_size()
    return total
