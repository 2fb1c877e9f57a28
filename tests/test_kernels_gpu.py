"""Triton kernels against their torch references on fresh random inputs (never zeros), odd sizes.

Run on the H200: `pytest -m gpu tests/test_kernels_gpu.py` (bench/kernels/gpu_check.py does).
bf16 tolerance: ||out - ref|| / ||ref|| <= 1e-2 with fp32 accumulation on both sides.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from backend.kernels.triton_utils import HAS_TRITON

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or not HAS_TRITON,
                       reason="needs a CUDA GPU and triton"),
]

from backend.kernels.fp8_gemv import (
    BF16_GEMV_M1_CONFIGS,
    FP8_GEMV_MAX_M,
    FP8_MAX,
    GEMV_M1_SHAPE_CONFIGS,
    SILU_DOWN_M1_CONFIGS,
    GemvConfig,
    bf16_gemv,
    check_fp8_support,
    fp8_gemv_reference,
    fp8_gemv_triton,
    fp8_linear,
    fp8_scaled_mm,
    fp8_scaled_mm_reference,
    gemv_silu_mul_reference,
    gemv_silu_mul_triton,
    quantize_fp8_per_channel,
    quantize_fp8_per_token,
    quantize_fp8_per_token_reference,
)
from backend.kernels.paged_attention import (
    paged_attention,
    paged_attention_reference,
    paged_attention_triton,
)
from backend.kernels.rmsnorm import (
    fused_add_rms_norm,
    fused_add_rms_norm_reference,
    rms_norm,
    rms_norm_reference,
)
from backend.kernels.rotary_kv import (
    build_rope_cache,
    rotary_kv_write,
    rotary_kv_write_reference,
    write_kv_reference,
)
from backend.kernels.silu_mul import silu_and_mul, silu_and_mul_reference
from backend.kv.formats import QuantizedPages

DEV = "cuda"
BF16 = torch.bfloat16
TOL = 1e-2


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all(), "non-finite output (unwritten or NaN)"
    return ((out - ref).norm() / ref.norm()).item()


def randn(*shape, dtype=BF16, scale=1.0):
    return (torch.randn(*shape, device=DEV, dtype=torch.float32) * scale).to(dtype)


def make_paged(num_seqs, num_kv_heads, head_dim, block_size, lens, dtype, extra_blocks=3):
    max_blocks = max(1, max(-(-n // block_size) for n in lens)) + extra_blocks
    num_blocks = num_seqs * max_blocks + 7
    k_cache = randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype)
    v_cache = randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype)
    perm = torch.randperm(num_blocks, device=DEV)[: num_seqs * max_blocks]
    block_tables = perm.view(num_seqs, max_blocks).to(torch.int32)
    return k_cache, v_cache, block_tables, torch.tensor(lens, dtype=torch.int32, device=DEV)


# ---- paged attention (decodes and prefill chunks; bf16 / fp8 / int4-fp8 pages) --------------

KV_FORMATS = {"auto": None, "fp8": ("fp8", "fp8"), "int4-fp8": ("int4", "fp8")}


def make_pools(fmt, num_blocks, block_size, num_kv_heads, head_dim, dtype):
    """Random pools of `fmt` (quantized ones encoded by the reference codecs)."""
    if KV_FORMATS[fmt] is None:
        return (randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype),
                randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype))
    pools = [QuantizedPages(c, num_blocks, block_size, num_kv_heads, head_dim, DEV)
             for c in KV_FORMATS[fmt]]
    slots = torch.arange(num_blocks * block_size, device=DEV)
    for p, scale in zip(pools, (2.0, 1.0)):
        p.write(slots, randn(len(slots), num_kv_heads, head_dim, dtype=torch.float32,
                             scale=scale))
    return pools


def make_step(query_lens, context_lens, block_size, extra_blocks=3):
    """Metadata of one step with random block tables (device tensors) and the pool size."""
    max_blocks = max(1, max(-(-n // block_size) for n in context_lens)) + extra_blocks
    num_blocks = len(context_lens) * max_blocks + 7
    perm = torch.randperm(num_blocks, device=DEV)[: len(context_lens) * max_blocks]
    tables = perm.view(len(context_lens), max_blocks).to(torch.int32)
    qsl = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor(query_lens).cumsum(0)
    return (num_blocks, tables, qsl.to(DEV),
            torch.tensor(context_lens, dtype=torch.int32, device=DEV))


_G = torch.Generator().manual_seed(13)
ATTN_CASES = [
    # (num_heads, num_kv_heads, head_dim, block_size, query_lens, context_lens, dtype)
    (56, 8, 128, 16, [1], [1], BF16),                                   # 33B shape, batch 1
    (56, 8, 128, 16, [1], [2047], BF16),
    (56, 8, 128, 16, [1] * 7, [17, 300, 1, 2049, 0, 65, 128], BF16),     # a padding row
    (56, 8, 128, 16, [1] * 13, torch.randint(1, 3000, (13,), generator=_G).tolist(), BF16),
    (56, 8, 128, 32, [1] * 3, [33, 1000, 4097], BF16),
    # mixed: decodes, a chunk on a cached prefix, a fresh prompt, a context-0 padding sequence
    (56, 8, 128, 16, [1, 1, 1, 200, 37, 9], [50, 1800, 3, 1224, 37, 0], BF16),
    (56, 8, 128, 16, [513], [513], BF16),                               # one whole prompt
    (56, 8, 128, 16, [1] * 5 + [64] * 3, [700] * 5 + [64, 2112, 999], BF16),
    (8, 2, 32, 16, [1, 1, 20], [5, 70, 33], torch.float32),              # tiny preset (fp32)
    (32, 32, 128, 16, [1, 30], [100, 513], torch.float16),               # MHA, fp16
    (7, 1, 16, 16, [1, 12, 1], [40, 12, 9], torch.float32),              # GQA 7, head_dim 16
]


@pytest.mark.parametrize("fmt", list(KV_FORMATS))
@pytest.mark.parametrize("case", ATTN_CASES, ids=lambda c: f"h{c[0]}kv{c[1]}d{c[2]}bs{c[3]}"
                         f"q{max(c[4])}n{len(c[4])}{str(c[6])[6:]}")
@pytest.mark.parametrize("num_splits", [None, 1, 5])
def test_paged_attention(case, fmt, num_splits):
    num_heads, num_kv_heads, head_dim, block_size, qlens, lens, dtype = case
    torch.manual_seed(hash((tuple(lens), tuple(qlens), num_splits, fmt)) % 2**31)
    num_blocks, tables, qsl, context_lens = make_step(qlens, lens, block_size)
    k_cache, v_cache = make_pools(fmt, num_blocks, block_size, num_kv_heads, head_dim, dtype)
    q = randn(sum(qlens), num_heads, head_dim, dtype=dtype)
    scale = head_dim ** -0.5
    out = torch.full_like(q, float("nan"))
    paged_attention_triton(q, k_cache, v_cache, tables, qsl, context_lens, scale,
                           max_query_len=max(qlens), num_splits=num_splits, out=out)
    ref = paged_attention_reference(q, k_cache, v_cache, tables, qsl, context_lens, scale)
    assert rel_err(out, ref) <= TOL
    starts = qsl.tolist()
    for s, n in enumerate(lens):   # per sequence too, so a short one cannot hide
        rows = slice(starts[s], starts[s + 1])
        if n == 0:
            assert (out[rows] == 0).all()
        elif starts[s + 1] > starts[s]:
            assert rel_err(out[rows], ref[rows]) <= TOL


@pytest.mark.parametrize("fmt", list(KV_FORMATS))
def test_paged_attention_dispatch_and_graph_capture(fmt):
    """Captured once, replayed with new contents of every metadata tensor (decode and mixed
    tilings): the launch depends on nothing on the device."""
    torch.manual_seed(11)
    for qlens, lens, new_lens in (([1, 1, 1], [40, 1500, 9], [41, 1200, 10]),
                                  ([1, 30, 2], [40, 1500, 9], [700, 30, 2])):
        num_blocks, tables, qsl, context_lens = make_step(qlens, lens, 16)
        k_cache, v_cache = make_pools(fmt, num_blocks, 16, 8, 128, BF16)
        q = randn(sum(qlens), 56, 128)
        mq = max(qlens)
        ref = paged_attention_reference(q, k_cache, v_cache, tables, qsl, context_lens,
                                        128 ** -0.5)
        out = paged_attention(q, k_cache, v_cache, tables, qsl, context_lens, max_query_len=mq,
                              max_context_len=2048)
        assert rel_err(out, ref) <= TOL
        static_out = torch.empty_like(q)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            paged_attention(q, k_cache, v_cache, tables, qsl, context_lens, max_query_len=mq,
                            max_context_len=2048, out=static_out)
        context_lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        tables.copy_(tables[torch.randperm(len(lens), device=DEV)])
        q.copy_(randn(sum(qlens), 56, 128))
        graph.replay()
        ref = paged_attention_reference(q, k_cache, v_cache, tables, qsl, context_lens,
                                        128 ** -0.5)
        assert rel_err(static_out, ref) <= TOL


# ---- rmsnorm ----------------------------------------------------------------------------------

@pytest.mark.parametrize("rows,hidden", [(1, 7168), (7, 7168), (33, 7168), (5, 256), (3, 1000)])
def test_rms_norm(rows, hidden):
    torch.manual_seed(rows * hidden)
    x = randn(rows, hidden, scale=3.0)
    res = randn(rows, hidden)
    w = (1 + 0.1 * torch.randn(hidden, device=DEV)).to(BF16)
    assert rel_err(rms_norm(x, w, 1e-6), rms_norm_reference(x, w, 1e-6)) <= TOL
    normed, new_res = fused_add_rms_norm(x, res, w, 1e-6)
    normed_ref, new_res_ref = fused_add_rms_norm_reference(x, res, w, 1e-6)
    assert rel_err(new_res, new_res_ref) <= TOL
    assert rel_err(normed, normed_ref) <= TOL
    # 3-D input keeps its shape
    assert rms_norm(x.view(1, rows, hidden), w, 1e-6).shape == (1, rows, hidden)


# ---- rotary + kv write ------------------------------------------------------------------------

@pytest.mark.parametrize("num_tokens,num_heads,num_kv_heads,head_dim",
                         [(1, 56, 8, 128), (5, 56, 8, 128), (37, 56, 8, 128), (9, 8, 2, 32)])
def test_rotary_kv_write(num_tokens, num_heads, num_kv_heads, head_dim):
    torch.manual_seed(num_tokens * 1000 + head_dim)
    block_size, num_blocks = 16, 11
    width = (num_heads + 2 * num_kv_heads) * head_dim

    def views(qkv):
        q = qkv[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim)
        k = qkv[:, num_heads * head_dim: (num_heads + num_kv_heads) * head_dim]
        v = qkv[:, (num_heads + num_kv_heads) * head_dim:]
        return (q, k.view(num_tokens, num_kv_heads, head_dim),
                v.view(num_tokens, num_kv_heads, head_dim))

    qkv = randn(num_tokens, width)
    qkv_ref = qkv.clone()
    cos, sin = build_rope_cache(16384, head_dim, 100000.0, 4.0, device=DEV)
    positions = torch.randint(0, 16384, (num_tokens,), device=DEV)
    slots = torch.randperm(num_blocks * block_size, device=DEV)[:num_tokens]
    slots[::4] = -1                                                   # padding tokens
    k_cache = randn(num_blocks, block_size, num_kv_heads, head_dim)
    v_cache = randn(num_blocks, block_size, num_kv_heads, head_dim)
    k_cache_ref, v_cache_ref = k_cache.clone(), v_cache.clone()
    rotary_kv_write(positions, *views(qkv), cos, sin, k_cache, v_cache, slots)
    rotary_kv_write_reference(positions, *views(qkv_ref), cos, sin, k_cache_ref, v_cache_ref,
                              slots)
    assert rel_err(qkv, qkv_ref) <= TOL
    assert rel_err(k_cache, k_cache_ref) <= TOL
    assert torch.equal(v_cache, v_cache_ref)                          # a pure copy
    written = slots[slots >= 0]
    kc = k_cache.view(-1, num_kv_heads, head_dim)[written]
    kc_ref = k_cache_ref.view(-1, num_kv_heads, head_dim)[written]
    if written.numel():
        assert rel_err(kc, kc_ref) <= TOL


@pytest.mark.parametrize("fmt", ["fp8", "int4-fp8"])
@pytest.mark.parametrize("num_tokens,num_heads,num_kv_heads,head_dim",
                         [(5, 56, 8, 128), (37, 56, 8, 128), (9, 8, 2, 32), (6, 7, 1, 16),
                          (11, 6, 2, 64)])   # tiny-coder's heads: one int4 group per half
def test_rotary_kv_write_quantized(fmt, num_tokens, num_heads, num_kv_heads, head_dim):
    """Quantize-on-write: the page codes and scales equal the reference encoders' (bit for
    bit: correctly rounded divisions, round-half-even), q/k rotated as in bf16."""
    torch.manual_seed(num_tokens * 7 + head_dim)
    block_size, num_blocks = 16, 11
    nq, nkv = num_heads * head_dim, num_kv_heads * head_dim
    qkv = randn(num_tokens, nq + 2 * nkv, scale=3.0)
    cos, sin = build_rope_cache(16384, head_dim, 100000.0, 4.0, device=DEV)
    positions = torch.randint(0, 16384, (num_tokens,), device=DEV)
    slots = torch.randperm(num_blocks * block_size, device=DEV)[:num_tokens]
    slots[::4] = -1
    x, x_ref = qkv.clone(), qkv.clone()

    def views(t):
        q, k, v = t.split([nq, nkv, nkv], -1)
        return (q.view(num_tokens, num_heads, head_dim), k.view(num_tokens, num_kv_heads, head_dim),
                v.view(num_tokens, num_kv_heads, head_dim))

    pools = [QuantizedPages(c, num_blocks, block_size, num_kv_heads, head_dim, DEV)
             for c in KV_FORMATS[fmt]]
    rotary_kv_write(positions, *views(x), cos, sin, pools[0], pools[1], slots)
    rotary_kv_write_reference(positions, *views(x_ref), cos, sin,
                              *[QuantizedPages(c, num_blocks, block_size, num_kv_heads, head_dim,
                                               DEV) for c in KV_FORMATS[fmt]], slots)
    assert rel_err(x, x_ref) <= TOL
    # the pages hold exactly the reference encoding of the k (rotated, in the model dtype) and
    # v the kernel produced; fp32 rotary math may round k differently in its last bit
    _, k_rot, v = views(x)
    pools_ref = [QuantizedPages(c, num_blocks, block_size, num_kv_heads, head_dim, DEV)
                 for c in KV_FORMATS[fmt]]
    write_kv_reference(k_rot, v, pools_ref[0], pools_ref[1], slots)
    n = num_blocks * block_size
    for p, pr in zip(pools, pools_ref):
        codes, codes_ref = p.data.view(torch.uint8).view(n, -1), pr.data.view(torch.uint8).view(n, -1)
        bad = (codes != codes_ref).nonzero()
        assert not len(bad), (p.codec, len(bad), codes.numel(), bad[:4].tolist(),
                              codes[tuple(bad[:4].T)].tolist(), codes_ref[tuple(bad[:4].T)].tolist(),
                              (p.scale.view(n, -1) - pr.scale.view(n, -1)).abs().max().item())
        assert torch.equal(p.scale.view(n, -1), pr.scale.view(n, -1)), \
            (p.codec, (p.scale.view(n, -1) - pr.scale.view(n, -1)).abs().max().item())


# ---- silu * mul -------------------------------------------------------------------------------

@pytest.mark.parametrize("rows,inter", [(1, 19200), (5, 19200), (33, 688), (3, 1001)])
def test_silu_and_mul(rows, inter):
    torch.manual_seed(rows + inter)
    gate_up = randn(rows, 2 * inter, scale=2.0)
    assert rel_err(silu_and_mul(gate_up), silu_and_mul_reference(gate_up)) <= TOL


# ---- fp8 weight-only GEMV ---------------------------------------------------------------------

GEMV_SHAPES = [(9216, 7168), (7168, 19200), (1000, 520), (48, 4096)]
GEMV_TEST_CONFIGS = [
    GemvConfig(block_n=32, block_k=256, use_dot=False),
    GemvConfig(block_n=16, block_k=512, num_warps=4, num_stages=1, use_dot=False, prefetch=True),
    GemvConfig(block_n=32, block_k=512, num_warps=8, num_stages=1, programs_per_sm=1,
               use_dot=False, prefetch=True),
    GemvConfig(block_n=128, block_k=128, num_warps=8, num_stages=3, programs_per_sm=8),
    *GEMV_M1_SHAPE_CONFIGS.values(),  # thin tiles, one warp (the 33B shapes' M = 1 configs)
]


@pytest.mark.parametrize("n,k", GEMV_SHAPES)
@pytest.mark.parametrize("m", [1, 2, 3, 5, 16, 17, 33])
def test_fp8_gemv(m, n, k):
    torch.manual_seed(m * 7 + n + k)
    check_fp8_support(DEV)
    w_fp8, scale = quantize_fp8_per_channel(randn(n, k, scale=0.02))
    x = randn(m, k)
    ref = fp8_gemv_reference(x, w_fp8, scale)
    assert rel_err(fp8_gemv_triton(x, w_fp8, scale), ref) <= TOL
    for config in GEMV_TEST_CONFIGS:     # FMA configs fall back to the dot kernel past M = 4
        assert rel_err(fp8_gemv_triton(x, w_fp8, scale, config), ref) <= TOL, config
    if m <= 16:
        assert rel_err(fp8_linear(x, w_fp8, scale), ref) <= TOL


# one-row kernel: thin one-warp tiles with and without per-tile row sums, wider tiles, a split
ROW_TEST_CONFIGS = [
    GemvConfig(block_n=bn, block_k=bk, num_warps=w, num_stages=2, programs_per_sm=pps,
               use_dot=False, row_sum_each=r)
    for bn, bk, w, pps, r in ((2, 1024, 1, 1, False), (4, 256, 1, 1, True),
                              (8, 512, 2, 1, True), (16, 256, 4, 4, False), (32, 128, 4, 8, True))
]


@pytest.mark.parametrize("weights", ["fp8", "bf16"])
@pytest.mark.parametrize("n,k", [(9216, 7168), (7168, 19200), (1000, 512)])
def test_row_gemv_configs(weights, n, k):
    """The M = 1 kernel (`_gemv_row_kernel`) over fp8 or bf16 rows for each test tile."""
    torch.manual_seed(n + k + len(weights))
    w = randn(n, k, scale=0.02)
    scale = None
    if weights == "fp8":
        w, scale = quantize_fp8_per_channel(w)
    x = randn(1, k)
    ones = torch.ones(n, device=DEV)
    ref = fp8_gemv_reference(x.double(), w, ones if scale is None else scale)
    for config in ROW_TEST_CONFIGS:   # K = 19200 with block_k 512 / 1024: a masked last tile
        out = torch.full((1, n), float("nan"), device=DEV, dtype=BF16)
        out.copy_(fp8_gemv_triton(x, w, scale, config))
        assert rel_err(out, ref) <= 4e-3, config


DOT_F16_TEST_CONFIGS = [
    GemvConfig(block_n=bn, block_k=bk, num_warps=w, num_stages=st, programs_per_sm=pps,
               use_dot=True, dot_f16=True)
    for bn, bk, w, st, pps in ((16, 256, 1, 3, 1), (32, 512, 2, 3, 1), (64, 256, 4, 3, 4),
                               (128, 128, 4, 4, 4))
]


@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("n,k", [(9216, 7168), (7168, 19200), (1000, 512)])
def test_dot_f16_gemv(m, n, k):
    """The tensor-core GEMV with fp16 dots over fp8 weights (x padded to 16 rows)."""
    torch.manual_seed(n + k + m)
    w, scale = quantize_fp8_per_channel(randn(n, k, scale=0.02))
    x = randn(m, k)
    ref = fp8_gemv_reference(x.double(), w, scale)
    for config in DOT_F16_TEST_CONFIGS:
        out = torch.full((m, n), float("nan"), device=DEV, dtype=BF16)
        out.copy_(fp8_gemv_triton(x, w, scale, config))
        assert rel_err(out, ref) <= 4e-3, config


@pytest.mark.parametrize("weights", ["fp8", "bf16"])
def test_fused_silu_down_33b(weights):
    """The down projection with silu*mul fused in, on the 33B shape: the oracle's numbers,
    and the unfused pair's (same rounded activation, same tile) for every test tile and the
    committed fused config."""
    n, k = 7168, 19200
    torch.manual_seed(11)
    w = randn(n, k, scale=0.02)
    scale = None
    if weights == "fp8":
        w, scale = quantize_fp8_per_channel(w)
    gate_up = randn(1, 2 * k) * 2
    ref = gemv_silu_mul_reference(gate_up, w, scale)
    for config in [SILU_DOWN_M1_CONFIGS[weights][n, k], *ROW_TEST_CONFIGS]:
        fused = gemv_silu_mul_triton(gate_up, w, scale, config)
        pair = fp8_gemv_triton(silu_and_mul(gate_up), w, scale, config)
        assert rel_err(fused, ref) <= 4e-3, config
        assert rel_err(fused, pair) <= 1e-3, config


def test_pdl_chain_with_fused_silu_down_in_a_graph():
    """norm -> fp8 gate_up GEMV -> silu-fused fp8 down GEMV -> add+norm, captured with PDL and
    replayed on fresh inputs, equals plain launches bit for bit (the fused kernel loads its
    first weight tile before waiting for the gate_up GEMV, never the activation)."""
    from backend.kernels.triton_utils import _PDL, set_pdl

    default = _PDL["enabled"]
    torch.manual_seed(6)
    w_up, s_up = quantize_fp8_per_channel(randn(2 * 2048, 1024, scale=0.02))
    w_down, s_down = quantize_fp8_per_channel(randn(1024, 2048, scale=0.02))
    norm_w = randn(1024)
    down = GemvConfig(block_n=4, block_k=256, num_warps=1, num_stages=2, programs_per_sm=1,
                      use_dot=False, row_sum_each=True)

    def layer(x, residual):
        g = fp8_gemv_triton(rms_norm(x, norm_w, 1e-5), w_up, s_up)
        return fused_add_rms_norm(gemv_silu_mul_triton(g, w_down, s_down, down), residual,
                                  norm_w, 1e-5)

    x, res = randn(1, 1024), randn(1, 1024)
    try:
        set_pdl(True)
        layer(x, res)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = layer(x, res)
        for i in range(20):
            x.copy_(randn(1, 1024))
            res.copy_(randn(1, 1024))
            graph.replay()
            set_pdl(False)
            ref = layer(x, res)
            set_pdl(True)
            torch.cuda.synchronize()
            for o, r in zip(outs, ref):
                assert torch.equal(o, r), i
    finally:
        set_pdl(default)


@pytest.mark.parametrize("m", [1, 64, 200])
def test_fp8_scaled_mm_path_and_linear_dispatch(m):
    torch.manual_seed(m)
    w_fp8, scale = quantize_fp8_per_channel(randn(9216, 7168, scale=0.02))
    x = randn(1, m, 7168)
    w8a8_ref = fp8_scaled_mm_reference(x[0], w_fp8, scale)
    weight_only_ref = fp8_gemv_reference(x[0], w_fp8, scale)
    assert rel_err(fp8_scaled_mm(x[0], w_fp8, scale), w8a8_ref) <= TOL
    out = fp8_linear(x, w_fp8, scale)
    assert out.shape == (1, m, 9216)
    ref = weight_only_ref if m <= FP8_GEMV_MAX_M else w8a8_ref
    assert rel_err(out[0], ref) <= TOL
    # the two paths differ only by the activation rounding
    assert rel_err(w8a8_ref, weight_only_ref) <= 0.06


def test_quantize_fp8_per_token_kernel():
    torch.manual_seed(3)
    x = randn(37, 7168) * (torch.rand(37, 1, device=DEV) * 10).to(BF16)
    x_fp8, x_scale = quantize_fp8_per_token(x)
    ref_fp8, ref_scale = quantize_fp8_per_token_reference(x)
    torch.testing.assert_close(x_scale, ref_scale, rtol=1e-6, atol=0)
    assert x_fp8.float().abs().max().item() <= FP8_MAX
    mismatched = (x_fp8.float() != ref_fp8.float()).float().mean().item()
    assert mismatched <= 1e-3, mismatched     # fp32 division rounding may flip a rare tie
    assert rel_err(x_fp8.float() * x_scale, x) <= 0.04


# ---- programmatic dependent launch and the fp16 dots over quantized pages -----------------------

def test_pdl_chain_in_a_graph_equals_plain_launches():
    """A decode layer's chain of our kernels (norm -> fp8 GEMV -> silu*mul -> fp8 GEMV with a
    split-K reduce -> add+norm), captured with PDL and replayed on fresh inputs, equals plain
    launches bit for bit every time: each kernel waits for its predecessor before reading."""
    from backend.kernels.triton_utils import _PDL, set_pdl, use_pdl

    default = _PDL["enabled"]
    torch.manual_seed(5)
    w_up, s_up = quantize_fp8_per_channel(randn(2 * 2048, 1024, scale=0.02))
    w_down, s_down = quantize_fp8_per_channel(randn(1024, 2048, scale=0.02))
    norm_w = randn(1024)
    split_down = GemvConfig(block_n=16, block_k=256, num_warps=4, num_stages=3,
                            programs_per_sm=8, use_dot=False)

    def layer(x, residual):
        h = rms_norm(x, norm_w, 1e-5)
        g = fp8_gemv_triton(h, w_up, s_up)
        d = fp8_gemv_triton(silu_and_mul(g), w_down, s_down, split_down)
        return fused_add_rms_norm(d, residual, norm_w, 1e-5)

    x, res = randn(1, 1024), randn(1, 1024)
    try:
        set_pdl(True)
        assert use_pdl(x) == (torch.cuda.get_device_capability() >= (9, 0))
        layer(x, res)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = layer(x, res)
        for i in range(20):
            x.copy_(randn(1, 1024))
            res.copy_(randn(1, 1024))
            graph.replay()
            set_pdl(False)
            ref = layer(x, res)
            set_pdl(True)
            torch.cuda.synchronize()
            for o, r in zip(outs, ref):
                assert torch.equal(o, r), i
    finally:
        set_pdl(default)


@pytest.mark.parametrize("fmt", ["fp8", "int4-fp8"])
@pytest.mark.parametrize("quant_f16", [True, False])
@pytest.mark.parametrize("heads", [(56, 8, 128), (6, 2, 64)], ids=["33b", "tiny-coder"])
def test_paged_attention_quantized_dot_dtypes(fmt, quant_f16, heads):
    """Both dot variants over quantized pages (fp16: the default; bf16: the earlier one) match
    the reference, decode and mixed tilings, for the 33B's heads and tiny-coder's."""
    num_heads, num_kv_heads, head_dim = heads
    torch.manual_seed(17)
    for qlens, lens in (([1] * 9, [3000, 17, 640, 1, 2049, 77, 900, 16, 1500]),
                        ([1, 40, 1], [700, 40, 1200]), ([300], [300])):
        num_blocks, tables, qsl, context_lens = make_step(qlens, lens, 16)
        k_cache, v_cache = make_pools(fmt, num_blocks, 16, num_kv_heads, head_dim, BF16)
        q = randn(sum(qlens), num_heads, head_dim)
        out = torch.full_like(q, float("nan"))
        paged_attention_triton(q, k_cache, v_cache, tables, qsl, context_lens,
                               head_dim ** -0.5, max_query_len=max(qlens), out=out,
                               quant_f16=quant_f16)
        ref = paged_attention_reference(q, k_cache, v_cache, tables, qsl, context_lens,
                                        head_dim ** -0.5)
        assert rel_err(out, ref) <= TOL, (qlens, rel_err(out, ref))


@pytest.mark.parametrize("heads", [(56, 8, 128), (6, 2, 64)], ids=["33b", "tiny-coder"])
@pytest.mark.parametrize("splits", [None, 1, 12])
def test_paged_attention_quantized_decode_at_more_splits(heads, splits):
    """Quantized pages at the decode split policy's choice (None), unsplit, and at more context
    splits than the default: all match the reference (decode and mixed tilings)."""
    num_heads, num_kv_heads, head_dim = heads
    torch.manual_seed(23)
    for qlens, lens in (([1] * 9, [3000, 17, 640, 1, 2049, 77, 900, 16, 1500]),
                        ([1, 40, 1], [700, 40, 1200])):
        num_blocks, tables, qsl, context_lens = make_step(qlens, lens, 16)
        for fmt in ("fp8", "int4-fp8"):
            k_cache, v_cache = make_pools(fmt, num_blocks, 16, num_kv_heads, head_dim, BF16)
            q = randn(sum(qlens), num_heads, head_dim)
            ref = paged_attention_reference(q, k_cache, v_cache, tables, qsl, context_lens,
                                            head_dim ** -0.5)
            out = torch.full_like(q, float("nan"))
            paged_attention_triton(q, k_cache, v_cache, tables, qsl, context_lens,
                                   head_dim ** -0.5, max_query_len=max(qlens), out=out,
                                   num_splits=splits)
            assert rel_err(out, ref) <= TOL, (fmt, qlens, rel_err(out, ref))


@pytest.mark.parametrize("heads", [(56, 8, 128), (6, 2, 64), (7, 1, 16)],
                         ids=["33b", "tiny-coder", "whole-head-16"])
def test_int4_fp16_scale_layout_on_the_gpu(heads, monkeypatch):
    """int4 keys in 16-channel groups with fp16 scales (kv_quant.INT4_SCALE_DTYPE, not the
    default yet): the fused write is bit-exact against the reference encoders, and both dot
    variants of the attention kernel read the pages like the reference."""
    from backend.kv import formats as kv_quant

    monkeypatch.setattr(kv_quant, "INT4_GROUP", 16)
    monkeypatch.setattr(kv_quant, "INT4_SCALE_DTYPE", torch.float16)
    num_heads, num_kv_heads, head_dim = heads
    for num_tokens in (5, 37):
        test_rotary_kv_write_quantized("int4-fp8", num_tokens, num_heads, num_kv_heads,
                                       head_dim)
    for quant_f16 in (True, False):
        test_paged_attention_quantized_dot_dtypes("int4-fp8", quant_f16, heads)


@pytest.mark.parametrize("shape", list(BF16_GEMV_M1_CONFIGS), ids=lambda s: f"{s[0]}x{s[1]}")
def test_bf16_gemv_measured_configs(shape):
    """Our GEMV over bf16 rows (no scale), with each config the engine uses for a 33B shape."""
    n, k = shape
    torch.manual_seed(n + k)
    w = randn(n, k, scale=0.02)
    x = randn(1, k)
    out = torch.full((1, n), float("nan"), device=DEV, dtype=BF16)
    out.copy_(bf16_gemv(x, w, BF16_GEMV_M1_CONFIGS[shape]))
    assert rel_err(out, x.float() @ w.float().T) <= TOL


def test_gemv_linear_dispatch():
    """`install_gemv` turns a measured-shape linear into a GemvLinear: one row goes to our
    GEMV (close to F.linear), several rows stay on F.linear (bit for bit)."""
    from torch import nn

    from backend.kernels.dispatch import GemvLinear, install_gemv

    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(7168, 7168, bias=False), nn.Linear(100, 7168, bias=False))
    model = model.to(DEV, BF16)
    assert install_gemv(model) == 1 and type(model[0]) is GemvLinear
    assert type(model[1]) is nn.Linear
    x = randn(1, 1, 7168)
    y = model[0](x)
    assert y.shape == (1, 1, 7168)
    assert rel_err(y, F.linear(x, model[0].weight)) <= TOL
    xs = randn(3, 7168)
    assert torch.equal(model[0](xs), F.linear(xs, model[0].weight))


@pytest.mark.parametrize("heads", [(56, 8, 128), (6, 2, 64)], ids=["33b", "tiny-coder"])
@pytest.mark.parametrize("quant_f16", [True, False])
@pytest.mark.parametrize("splits", [None, 1, 12])
def test_int4_fill_rows_on_the_gpu(heads, quant_f16, splits):
    """int4 keys with the block being filled in bf16 fill rows (backend.kv.fill_slots): the
    attention kernel reads positions >= fill_lo from the rows, the rest from the codes, like
    the reference (decode and mixed tilings, split or not; rows unlike the codes, so the wrong
    source shows); the fused write stores exactly the rows the reference stores; a captured
    graph replays with new fill metadata."""
    num_heads, num_kv_heads, head_dim = heads
    torch.manual_seed(29)
    for qlens, lens in (([1] * 9, [3000, 17, 640, 1, 2049, 77, 900, 16, 1500]),
                        ([1, 40, 1], [70, 40, 120])):
        num_blocks, tables, qsl, context_lens = make_step(qlens, lens, 16)
        k_cache, v_cache = make_pools("int4-fp8", num_blocks, 16, num_kv_heads, head_dim, BF16)
        k_cache.attach_fill(len(lens) + 3, BF16)
        k_cache.fill.copy_(randn(*k_cache.fill.shape, scale=2.0))
        fill_slot = torch.randperm(len(lens) + 3, device=DEV)[:len(lens)].to(torch.int32)
        fill_slot[1] = -1
        fill_lo = torch.tensor([(n - 1) // 16 * 16 + (i % 3 if (n - 1) % 16 >= 2 else 0)
                                for i, n in enumerate(lens)], dtype=torch.int32, device=DEV)
        q = randn(sum(qlens), num_heads, head_dim)
        ref = paged_attention_reference(q, k_cache, v_cache, tables, qsl, context_lens,
                                        head_dim ** -0.5, fill_slot, fill_lo)
        codes = paged_attention_reference(q, k_cache, v_cache, tables, qsl, context_lens,
                                          head_dim ** -0.5)
        out = torch.full_like(q, float("nan"))
        paged_attention_triton(q, k_cache, v_cache, tables, qsl, context_lens,
                               head_dim ** -0.5, max_query_len=max(qlens), out=out,
                               num_splits=splits, quant_f16=quant_f16,
                               fill_slot=fill_slot, fill_lo=fill_lo)
        assert rel_err(out, ref) <= TOL, (qlens, rel_err(out, ref))
        assert rel_err(codes, ref) > 3 * rel_err(out, ref)
    # the write: tokens with a fill row store their rotated key (as written back into k, in
    # the model dtype) there, bit for bit; the other rows stay as they were
    n = 37
    cos, sin = build_rope_cache(4096, head_dim, 10000.0, device=DEV)
    positions = torch.randint(0, 4096, (n,), device=DEV)
    slots = torch.randperm(64 * 16, device=DEV)[:n]
    fill_index = torch.where(torch.arange(n, device=DEV) % 3 == 0,
                             torch.randperm(8 * 16, device=DEV)[:n], -1)
    k_pool, v_pool = make_pools("int4-fp8", 64, 16, num_kv_heads, head_dim, BF16)
    k_pool.attach_fill(8, BF16)
    q = randn(n, num_heads, head_dim)
    k = randn(n, num_kv_heads, head_dim)
    v = randn(n, num_kv_heads, head_dim)
    rotary_kv_write(positions, q, k, v, cos, sin, k_pool, v_pool, slots, fill_index)
    rows = k_pool.fill.view(-1, num_kv_heads, head_dim)
    written = fill_index >= 0
    assert torch.equal(rows[fill_index[written]], k[written])
    untouched = torch.ones(rows.shape[0], dtype=torch.bool, device=DEV)
    untouched[fill_index[written]] = False
    assert (rows[untouched] == 0).all()
    # graph capture: new fill slots / first positions at replay
    static = torch.empty_like(q := randn(3, num_heads, head_dim))
    num_blocks, tables, qsl, context_lens = make_step([1, 1, 1], [40, 1500, 9], 16)
    k_cache, v_cache = make_pools("int4-fp8", num_blocks, 16, num_kv_heads, head_dim, BF16)
    k_cache.attach_fill(4, BF16)
    k_cache.fill.copy_(randn(*k_cache.fill.shape, scale=2.0))
    fill_slot = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV)
    fill_lo = torch.tensor([32, 1488, 0], dtype=torch.int32, device=DEV)
    paged_attention(q, k_cache, v_cache, tables, qsl, context_lens, max_query_len=1,
                    max_context_len=2048, out=static, fill_slot=fill_slot, fill_lo=fill_lo)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_attention(q, k_cache, v_cache, tables, qsl, context_lens, max_query_len=1,
                        max_context_len=2048, out=static, fill_slot=fill_slot, fill_lo=fill_lo)
    fill_slot.copy_(torch.tensor([3, -1, 1], dtype=torch.int32))
    fill_lo.copy_(torch.tensor([38, 0, 4], dtype=torch.int32))
    graph.replay()
    ref = paged_attention_reference(q, k_cache, v_cache, tables, qsl, context_lens,
                                    head_dim ** -0.5, fill_slot, fill_lo)
    assert rel_err(static, ref) <= TOL
