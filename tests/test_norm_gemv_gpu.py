"""The GEMV with the (add +) RMSNorm folded into its prologue (`fp8_gemv.gemv_rms_norm_triton`,
TIDEGATE_FUSED_NORM_GEMV=1) on the GPU: the 33B qkv and gate_up shapes with their fused-norm
tiles against the unfused pair (norm kernel, then the one-row GEMV) and the fp64 oracle, and a
PDL chain of fused launches in a CUDA graph against plain launches.

Run on the H200: `pytest -m gpu tests/test_norm_gemv_gpu.py` (the interpreter versions are in
tests/test_gemv_interpret.py).
"""
from __future__ import annotations

import pytest
import torch

from backend.kernels.triton_utils import HAS_TRITON

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or not HAS_TRITON,
                       reason="needs a CUDA GPU and triton"),
]

from backend.kernels.fp8_gemv import (
    NORM_GEMV_M1_CONFIGS,
    SILU_DOWN_M1_CONFIGS,
    GemvConfig,
    fp8_gemv_triton,
    gemv_rms_norm_reference,
    gemv_rms_norm_triton,
    gemv_silu_mul_triton,
    quantize_fp8_per_channel,
)
from backend.kernels.rmsnorm import fused_add_rms_norm, rms_norm

DEV = "cuda"
BF16 = torch.bfloat16


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all(), "non-finite output (unwritten or NaN)"
    return ((out - ref).norm() / ref.norm()).item()


def randn(*shape, scale=1.0):
    return (torch.randn(*shape, device=DEV, dtype=torch.float32) * scale).to(BF16)


def _weights(kind, n, k):
    w = randn(n, k, scale=0.02)
    return quantize_fp8_per_channel(w) if kind == "fp8" else (w, None)


@pytest.mark.parametrize("kind", ["fp8", "bf16"])
@pytest.mark.parametrize("shape", [(9216, 7168), (38400, 7168)], ids=["qkv", "gate_up"])
@pytest.mark.parametrize("with_residual", [True, False], ids=["add-norm", "norm"])
def test_norm_gemv_33b_shapes(kind, shape, with_residual):
    torch.manual_seed(shape[0] + with_residual)
    n, k = shape
    config = NORM_GEMV_M1_CONFIGS[kind][shape]
    w, scale = _weights(kind, n, k)
    x, norm_w = randn(1, k), (1 + 0.2 * torch.randn(k, device=DEV)).to(BF16)
    residual = randn(1, k, scale=3.0) if with_residual else None
    y, new_res = gemv_rms_norm_triton(x, residual, norm_w, 1e-5, w, scale, config)
    if residual is None:
        normed, pair_res = rms_norm(x, norm_w, 1e-5), x
    else:
        normed, pair_res = fused_add_rms_norm(x, residual, norm_w, 1e-5)
    assert torch.equal(new_res, pair_res)
    pair = fp8_gemv_triton(normed, w, scale, config)
    ref, _ = gemv_rms_norm_reference(x, residual, norm_w, 1e-5, w, scale)
    # the pair's numbers but for the order of the fp32 sum of squares (the norm kernel reduces
    # 8192 lanes at once, the prologue one tile at a time): a rare one-ulp flip of a normed x
    assert rel_err(y, pair) <= 1e-4
    assert rel_err(y, ref) <= 4e-3


def test_pdl_chain_of_fused_norm_gemvs_in_a_graph():
    """fused norm -> qkv-like GEMV, fused add+norm -> gate_up GEMV, silu-fused down, fused
    add+norm -> GEMV again (each reads the new residual the one before wrote), captured with
    PDL and replayed on fresh inputs: equal to plain launches bit for bit."""
    from backend.kernels.triton_utils import _PDL, set_pdl

    default = _PDL["enabled"]
    torch.manual_seed(12)
    hidden, inter = 1024, 2048
    w_a, s_a = quantize_fp8_per_channel(randn(hidden, hidden, scale=0.02))
    w_up, s_up = quantize_fp8_per_channel(randn(2 * inter, hidden, scale=0.02))
    w_down, s_down = quantize_fp8_per_channel(randn(hidden, inter, scale=0.02))
    norm_w = randn(hidden)
    tile = GemvConfig(block_n=4, block_k=256, num_warps=1, num_stages=2, programs_per_sm=4,
                      use_dot=False, row_sum_each=True)   # split K: partials + reduce too
    down = SILU_DOWN_M1_CONFIGS["fp8"].get((hidden, inter), tile)

    def layer(x, residual):
        a, h = gemv_rms_norm_triton(x, None, norm_w, 1e-5, w_a, s_a, tile)
        g, h = gemv_rms_norm_triton(a, residual, norm_w, 1e-5, w_up, s_up, tile)
        d = gemv_silu_mul_triton(g, w_down, s_down, down)
        return gemv_rms_norm_triton(d, h, norm_w, 1e-5, w_a, s_a, tile)

    x, res = randn(1, hidden), randn(1, hidden)
    try:
        set_pdl(True)
        layer(x, res)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = layer(x, res)
        for i in range(20):
            x.copy_(randn(1, hidden))
            res.copy_(randn(1, hidden))
            graph.replay()
            set_pdl(False)
            ref = layer(x, res)
            set_pdl(True)
            torch.cuda.synchronize()
            for o, r in zip(outs, ref):
                assert torch.equal(o, r), i
    finally:
        set_pdl(default)
