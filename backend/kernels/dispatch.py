"""The CUDA path: the Triton kernels of `backend/kernels/` behind the model's ops/attention seams.

`install_kernels(model)` swaps the model's injected `ops` and `attn` objects (the model itself
has no kernel branches):

    ops   KernelOps:        rms_norm, fused add + rms_norm, silu_and_mul (Triton); on one
                              row the silu*mul folded into the down GEMV, and (opt-in,
                              TIDEGATE_FUSED_NORM_GEMV=1) the norms into the qkv / gate_up GEMVs
    linears GemvLinear:     the decoder projections whose shape has a measured config in
                              `fp8_gemv.BF16_GEMV_M1_CONFIGS` run one-row products (batch-1
                              decode) through our GEMV instead of cuBLAS (faster there, and a
                              Triton kernel takes part in programmatic dependent launch)
    attn  KernelAttention:  two launches per layer, for every KV format (bf16 / fp8 / int4-fp8)
            rotary_kv_write:  rotate q, k in place + write K/V into their pages, quantizing
                              for a quantized pool
            paged_attention:  every query token of the step, decodes and prefill chunks
                              together, over the paged cache (dequantizing in registers);
                              nothing host-synchronizing, so every step can be a CUDA graph
            (an eager step of whole prompts only, over model-dtype pages, goes to flash SDPA
            instead: the steps too large for a graph are those, and flash is 2.3x faster)

Every kernel entry point falls back to its torch reference for CPU tensors, so this module runs
(and is tested against `TorchOps`/`TorchAttention`) on the CPU too.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from backend.kernels.fp8_gemv import (
    BF16_GEMV_M1_CONFIGS,
    NORM_GEMV_M1_CONFIGS,
    SILU_DOWN_M1_CONFIGS,
    bf16_gemv,
    gemv_rms_norm_triton,
    gemv_silu_mul_triton,
)
from backend.kernels.paged_attention import paged_attention
from backend.kernels.reference.ops import TorchOps
from backend.kernels.rmsnorm import fused_add_rms_norm, rms_norm
from backend.kernels.rotary_kv import rotary_kv_write
from backend.kernels.silu_mul import silu_and_mul
from backend.kernels.triton_utils import HAS_TRITON, use_triton


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

    def add_rms_norm_linear(self, x: torch.Tensor, residual: torch.Tensor | None,
                            weight: torch.Tensor, eps: float,
                            linear) -> tuple[torch.Tensor, torch.Tensor]:
        """The norm and the projection after it. One row (batch-1 decode) through a GEMV with
        a fused-norm config, with TIDEGATE_FUSED_NORM_GEMV=1: one launch that computes the
        (add +) RMSNorm in its prologue while the first weight tile streams
        (`fp8_gemv.gemv_rms_norm_triton`); anything else: the norm kernel, then linear."""
        fused = _norm_gemv_args(x, residual, weight, linear)
        if fused is None:
            return TorchOps.add_rms_norm_linear(self, x, residual, weight, eps, linear)
        w, scale, config = fused
        k = linear.in_features
        y, new_residual = gemv_rms_norm_triton(
            x.reshape(1, k), None if residual is None else residual.reshape(1, k), weight, eps,
            w, scale, config)
        return (y.view(*x.shape[:-1], linear.out_features),
                x if residual is None else new_residual.view(x.shape))

    def rotary(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
               cos_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.cos_sin = cos_sin  # deferred to KernelAttention (rotary + K/V write, one launch)
        return q, k

    @staticmethod
    def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
        return silu_and_mul(x)

    def silu_mul_linear(self, x: torch.Tensor, linear) -> torch.Tensor:
        """The MLP's down projection of silu*mul. One row (batch-1 decode) through a GEMV with
        a measured fused config: one launch that computes the activation while it streams the
        weight (`fp8_gemv.gemv_silu_mul_triton`); anything else: silu_and_mul, then linear."""
        fused = _silu_down_args(x, linear)
        if fused is None:
            return linear(silu_and_mul(x))
        weight, scale, config = fused
        return gemv_silu_mul_triton(x.reshape(1, x.shape[-1]), weight, scale, config).view(
            *x.shape[:-1], linear.out_features)


# Read at call time (a graph captured after a change follows it): TIDEGATE_FUSED_SILU_DOWN=0
# runs silu_and_mul and the down projection as two kernels again.
FUSED_SILU_DOWN = {"enabled": os.environ.get("TIDEGATE_FUSED_SILU_DOWN", "1") != "0"}


def _silu_down_args(x: torch.Tensor, linear):
    """(weight, scale or None, config) where `linear(silu_and_mul(x))` can run fused: one row,
    the Triton path, and a fused config for the layer's kind and shape; else None."""
    k = getattr(linear, "in_features", None)
    if (not FUSED_SILU_DOWN["enabled"] or k is None or x.numel() != 2 * k
            or x.stride(-1) != 1 or not use_triton(x)):
        return None
    return _gemv_weight(linear, SILU_DOWN_M1_CONFIGS, x)


# Read at call time (a graph captured after a change follows it). Off by default until the
# H200 A/B (engine_bench --ab-fused-norm) measures it: TIDEGATE_FUSED_NORM_GEMV=1 folds the
# decoder layers' two norms into the qkv / gate_up GEMVs of one-row steps.
FUSED_NORM_GEMV = {"enabled": os.environ.get("TIDEGATE_FUSED_NORM_GEMV", "0") == "1"}


def _gemv_weight(linear, table: dict, x: torch.Tensor):
    """(weight, scale or None, config) of `linear` for a fused one-row GEMV whose per-kind
    table (fp8 / bf16) has a config for its shape; else None. bf16 weights run our GEMV only
    where `GemvLinear` would (BF16_GEMV on, no bias, x in the weight's dtype)."""
    shape = (linear.out_features, linear.in_features)
    if hasattr(linear, "weight_fp8"):  # quantization.Fp8Linear
        config = table["fp8"].get(shape)
        return None if config is None else (linear.weight_fp8, linear.weight_scale, config)
    if (isinstance(linear, GemvLinear) and BF16_GEMV["enabled"] and linear.bias is None
            and x.dtype == linear.weight.dtype):
        config = table["bf16"].get(shape)
        return None if config is None else (linear.weight, None, config)
    return None


def _norm_gemv_args(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                    linear):
    """(weight, scale or None, config) where `linear(add_rms_norm(x, residual))` can run as
    one fused GEMV: the switch on, one row, the Triton path, contiguous rows, a norm weight
    in x's dtype, and a fused config for the layer's kind and shape; else None."""
    k = getattr(linear, "in_features", None)
    if (not FUSED_NORM_GEMV["enabled"] or k is None or x.numel() != k or x.stride(-1) != 1
            or weight.dtype != x.dtype or not weight.is_contiguous() or not use_triton(x)):
        return None
    if residual is not None and (residual.numel() != k or residual.stride(-1) != 1
                                 or residual.dtype != x.dtype):
        return None
    return _gemv_weight(linear, NORM_GEMV_M1_CONFIGS, x)


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
        fill_index = None if ctx.fill_index is None else ctx.fill_index[:num_tokens]
        rotary_kv_write(positions, q, k, v, cos_sin[:, :half], cos_sin[:, half:], k_cache,
                        v_cache, ctx.slot_mapping[:num_tokens], fill_index)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        n = ctx.num_tokens
        if self._fresh_prompts(ctx, k_cache):
            return fresh_prompts_sdpa(q, k, v, ctx.query_start_loc_host, self.scale, out)
        # max_query_len only picks the tiling: a decode-only step takes a program per sequence
        paged_attention(q[:n], k_cache, v_cache, ctx.block_tables, ctx.query_start_loc,
                        ctx.context_lens, self.scale,
                        max_query_len=1 if ctx.num_prefills == 0 else 2,
                        max_context_len=max(1, ctx.max_context_len), out=out[:n],
                        fill_slot=ctx.fill_slot, fill_lo=ctx.fill_lo)
        if num_tokens > n:  # rows past the step's tokens (not read; zero like the reference)
            out[n:].zero_()
        return out


    @staticmethod
    def _fresh_prompts(ctx, k_cache) -> bool:
        """An eager step of whole prompts only (no decodes, no cached prefix) over model-dtype
        pages: the chunks' own K/V are all the attention reads, so flash SDPA serves it (2.3x
        the paged kernel on a 2048-token prompt, H200). Never under graph capture, where the
        host metadata is absent (a graph's context carries no host lists)."""
        qsl = ctx.query_start_loc_host
        if (ctx.num_decode_tokens or not ctx.num_prefills or len(qsl) != ctx.num_seqs + 1
                or not isinstance(k_cache, torch.Tensor)
                or (k_cache.is_cuda and torch.cuda.is_current_stream_capturing())):
            return False
        lens = ctx.context_lens_host
        return all(lens[i] == qsl[i + 1] - qsl[i] for i in range(ctx.num_seqs))


# SDPA's own GQA (torch >= 2.5: `enable_gqa`) reads the shared kv heads instead of a copy
# expanded to every query head (2 x tokens x q_size x 2 bytes written and read again per layer).
# H200, 2048-token prompt, 33B heads (bench/kernels/gpu_check.py --sections sdpa,
# 2026-12-02): expanded + SDPA 197.9 us, enable_gqa 132.5 us (default backend; cuDNN alone
# 132.8, flash alone 242.2).
SDPA_ENABLE_GQA = True


def fresh_prompts_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       query_start_loc_host: list[int], scale: float,
                       out: torch.Tensor) -> torch.Tensor:
    """Causal attention of each whole prompt over its own (rotated) k/v with torch SDPA (flash
    on CUDA); GQA by SDPA's `enable_gqa` or by expanding the kv heads (SDPA_ENABLE_GQA). Rows
    past the last prompt are zeroed."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    rep = num_heads // k.shape[1]
    for i in range(len(query_start_loc_host) - 1):
        start, end = query_start_loc_host[i], query_start_loc_host[i + 1]
        if end == start:
            continue
        if SDPA_ENABLE_GQA and rep > 1:
            o = F.scaled_dot_product_attention(
                q[start:end].transpose(0, 1)[None], k[start:end].transpose(0, 1)[None],
                v[start:end].transpose(0, 1)[None], is_causal=True, scale=scale,
                enable_gqa=True)[0].transpose(0, 1)
            if (start, end) == (0, out.shape[0]) and o.is_contiguous():
                # one prompt fills the step and SDPA wrote [T, H, D] rows (flash and cuDNN
                # give the output q's layout): return it, no copy (2048 tokens of the 33B:
                # a 14 us device copy per layer, H200)
                return o
            out[start:end] = o
            continue
        ki = k[start:end, :, None, :].expand(-1, -1, rep, -1).reshape(-1, num_heads, head_dim)
        vi = v[start:end, :, None, :].expand(-1, -1, rep, -1).reshape(-1, num_heads, head_dim)
        o = F.scaled_dot_product_attention(
            q[start:end].transpose(0, 1)[None], ki.transpose(0, 1)[None],
            vi.transpose(0, 1)[None], is_causal=True, scale=scale)
        out[start:end] = o[0].transpose(0, 1)
    if out.shape[0] > query_start_loc_host[-1]:
        out[query_start_loc_host[-1]:].zero_()
    return out


# Read at call time (so a graph captured after a change follows it): TIDEGATE_BF16_GEMV=0 keeps
# every bf16 product on cuBLAS.
BF16_GEMV = {"enabled": os.environ.get("TIDEGATE_BF16_GEMV", "1") != "0"}


class GemvLinear(nn.Linear):
    """An `nn.Linear` (same parameters; a class swap, see `install_gemv`) whose one-row products
    run `fp8_gemv.bf16_gemv` with the config measured for its shape; everything else is
    F.linear. A later `quantize_model` replaces it like any other linear layer."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.in_features
        if (x.numel() == k and BF16_GEMV["enabled"] and self.bias is None
                and x.dtype == self.weight.dtype and use_triton(x)):
            # .get: an A/B run may swap the tables after the swap of classes (then cuBLAS)
            config = BF16_GEMV_M1_CONFIGS.get((self.out_features, k))
            if config is not None:
                return bf16_gemv(x.reshape(1, k), self.weight, config).view(
                    *x.shape[:-1], self.out_features)
        return F.linear(x, self.weight, self.bias)


def install_gemv(model) -> int:
    """Turn the model's bias-free `nn.Linear`s of a shape in BF16_GEMV_M1_CONFIGS into
    `GemvLinear`s in place; returns how many."""
    n = 0
    for module in model.modules():
        if (type(module) is nn.Linear and module.bias is None
                and (module.out_features, module.in_features) in BF16_GEMV_M1_CONFIGS):
            module.__class__ = GemvLinear
            n += 1
    return n


def install_kernels(model) -> None:
    """Swap `model.ops` / `model.attn` for the kernel versions (one fused pair), and the
    measured projection shapes to `GemvLinear`."""
    ops = KernelOps()
    model.ops = ops
    model.attn = KernelAttention(model.config.head_dim ** -0.5, ops)
    path = os.environ.get("TIDEGATE_GEMV_CONFIGS")
    if path:  # measured configs for shapes the committed tables lack (fp8_gemv.load_config_file)
        from backend.kernels.fp8_gemv import load_config_file

        load_config_file(path)
    install_gemv(model)
