"""The kernels' torch references (the oracles of tests/test_kernels_gpu.py) against naive float64
math, on the CPU. Always runs."""
from __future__ import annotations

import math

import pytest
import torch

from backend.kernels.fp8_gemv import (
    FP8_DTYPE,
    FP8_MAX,
    GemvConfig,
    dequantize_fp8_per_channel,
    fp8_gemv,
    fp8_gemv_reference,
    fp8_linear,
    fp8_scaled_mm_reference,
    quantize_fp8_per_channel,
    quantize_fp8_per_token,
    quantize_fp8_per_token_reference,
    split_k_for,
)
from backend.kernels.paged_attention import (
    MIN_TOKENS_PER_SPLIT,
    choose_num_splits,
    paged_attention,
    paged_attention_reference,
)
from backend.kernels.rmsnorm import (
    fused_add_rms_norm,
    fused_add_rms_norm_reference,
    rms_norm,
    rms_norm_reference,
)
from backend.kernels.rotary_kv import (
    apply_rotary_reference,
    build_rope_cache,
    rotary_kv_write,
    rotary_kv_write_reference,
)
from backend.kernels.silu_mul import silu_and_mul, silu_and_mul_reference


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all()
    return ((out - ref).norm() / ref.norm()).item()


def make_paged_kv(num_seqs, num_kv_heads, head_dim, block_size, context_lens, dtype, gen):
    """Random pools and block tables; each sequence gets its blocks scattered over the pool."""
    max_blocks = max(1, max(-(-n // block_size) for n in context_lens)) + 1
    num_blocks = num_seqs * max_blocks + 5
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    v_cache = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    perm = torch.randperm(num_blocks, generator=gen)[: num_seqs * max_blocks]
    block_tables = perm.view(num_seqs, max_blocks).to(torch.int32)
    return k_cache, v_cache, block_tables, torch.tensor(context_lens, dtype=torch.int32)


def naive_paged_attention(q, k_cache, v_cache, block_tables, context_lens, scale):
    """Token by token through the block table, softmax written out, all float64."""
    num_seqs, num_heads, _ = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.zeros(q.shape, dtype=torch.float64)
    for s in range(num_seqs):
        n = int(context_lens[s])
        for h in range(num_heads):
            kvh = h // group
            keys, values = [], []
            for t in range(n):
                block = int(block_tables[s, t // block_size])
                keys.append(k_cache[block, t % block_size, kvh].double())
                values.append(v_cache[block, t % block_size, kvh].double())
            if not keys:
                continue
            scores = [float(q[s, h].double() @ key) * scale for key in keys]
            top = max(scores)
            weights = [math.exp(x - top) for x in scores]
            total = sum(weights)
            out[s, h] = sum(w / total * val for w, val in zip(weights, values))
    return out


# ---- paged attention (decode rows: one query token per sequence) --------------------------------

def _decode_qsl(n: int) -> torch.Tensor:
    return torch.arange(n + 1, dtype=torch.int32)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_paged_attention_reference_matches_naive(dtype, tol):
    gen = torch.Generator().manual_seed(1)
    num_heads, num_kv_heads, head_dim, block_size = 14, 2, 16, 4   # group 7, like the 33B model
    lens = [1, 9, 16, 23, 0]                                       # 0: a padding row
    k_cache, v_cache, block_tables, context_lens = make_paged_kv(
        len(lens), num_kv_heads, head_dim, block_size, lens, dtype, gen)
    q = torch.randn(len(lens), num_heads, head_dim, generator=gen, dtype=torch.float64).to(dtype)
    scale = head_dim ** -0.5
    out = paged_attention_reference(q, k_cache, v_cache, block_tables, _decode_qsl(len(lens)),
                                    context_lens, scale)
    ref = naive_paged_attention(q, k_cache, v_cache, block_tables, context_lens, scale)
    assert out.dtype == dtype
    assert rel_err(out, ref) <= tol
    assert (out[-1] == 0).all()


def test_paged_attention_dispatch_on_cpu_is_reference():
    gen = torch.Generator().manual_seed(2)
    k_cache, v_cache, block_tables, context_lens = make_paged_kv(
        3, 2, 32, 16, [5, 40, 17], torch.float32, gen)
    q = torch.randn(3, 8, 32, generator=gen)
    out = paged_attention(q, k_cache, v_cache, block_tables, _decode_qsl(3), context_lens,
                          max_query_len=1)
    ref = paged_attention_reference(q, k_cache, v_cache, block_tables, _decode_qsl(3),
                                    context_lens, 32 ** -0.5)
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("num_seqs", [1, 3, 8, 24, 64, 128])
@pytest.mark.parametrize("max_context_len", [1, 100, 2048, 16384])
def test_choose_num_splits_fills_the_chip(num_seqs, max_context_len):
    """Mixed steps: at least PROGRAMS_PER_SM programs per SM unless splits run out of work."""
    splits = choose_num_splits(num_seqs * 8, max_context_len, 132)
    assert splits >= 1
    programs = num_seqs * 8 * splits
    enough_tokens = -(-max_context_len // splits) >= MIN_TOKENS_PER_SPLIT or splits == 1
    assert enough_tokens
    # either the chip is filled or more splits would leave splits without enough work (or
    # one of them empty: the kernel cuts the context in whole 64-token tiles)
    more = splits + 1
    per_split = math.ceil(math.ceil(max_context_len / more) / 64) * 64
    assert programs >= 2 * 132 or -(-max_context_len // more) < MIN_TOKENS_PER_SPLIT \
        or splits == 64 or splits * per_split >= max_context_len


@pytest.mark.parametrize("num_seqs", [1, 3, 8, 24, 32, 64, 128])
@pytest.mark.parametrize("max_context_len", [1, 100, 2048, 8192, 16384])
@pytest.mark.parametrize("resident, block_n", [(4, 64), (2, 128)], ids=["bf16", "quantized"])
def test_decode_splits_fill_one_wave_and_none_is_empty(num_seqs, max_context_len, resident,
                                                       block_n):
    """Decodes: the most splits whose programs fit one wave of `resident` programs per SM
    (or 1), each split >= MIN_TOKENS_PER_SPLIT tokens, and every split gets a tile."""
    programs = num_seqs * 8
    splits = choose_num_splits(programs, max_context_len, 132, resident, block_n)
    assert splits == 1 or programs * splits <= resident * 132
    assert splits == 1 or -(-max_context_len // splits) >= MIN_TOKENS_PER_SPLIT
    per_split = math.ceil(math.ceil(max_context_len / splits) / block_n) * block_n
    assert (splits - 1) * per_split < max_context_len          # the last split is not empty
    more = splits + 1   # one more would overfill the wave, starve a split, or leave one empty
    more_per_split = math.ceil(math.ceil(max_context_len / more) / block_n) * block_n
    assert (programs * more > resident * 132 or -(-max_context_len // more) < MIN_TOKENS_PER_SPLIT
            or more > 64 or splits * more_per_split >= max_context_len)


def test_decode_split_choices_measured_on_the_h200():
    """The choices the H200 sweep found best (NOTES.md "Split policy"; 33B: 8 KV heads)."""
    assert choose_num_splits(8 * 8, 8192, 132, 2, 128) == 4      # quantized, 8 x 8k: 75 vs 101 us
    assert choose_num_splits(8 * 8, 16384, 132, 2, 128) == 4
    assert choose_num_splits(8 * 8, 8192, 132, 4, 64) == 8       # bf16, 8 x 8k: 83 vs 90 us
    assert choose_num_splits(1 * 8, 8192, 132, 2, 128) == 32     # not 33 (one would be empty)
    assert choose_num_splits(64 * 8, 8192, 132, 2, 128) == 1


# ---- rmsnorm ----------------------------------------------------------------------------------

def naive_rms_norm(x, weight, eps):
    x, weight = x.double(), weight.double()
    return weight * x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-13), (torch.float32, 1e-6),
                                       (torch.bfloat16, 1e-2)])
def test_rms_norm_references(dtype, tol):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(7, 300, generator=gen, dtype=torch.float64).to(dtype)
    res = torch.randn(7, 300, generator=gen, dtype=torch.float64).to(dtype)
    w = (1 + 0.1 * torch.randn(300, generator=gen, dtype=torch.float64)).to(dtype)
    assert rel_err(rms_norm_reference(x, w, 1e-6), naive_rms_norm(x, w, 1e-6)) <= tol
    normed, new_res = fused_add_rms_norm_reference(x, res, w, 1e-6)
    summed = x.double() + res.double()
    assert rel_err(new_res, summed) <= tol
    assert rel_err(normed, naive_rms_norm(summed, w, 1e-6)) <= tol
    # CPU dispatch is the reference
    torch.testing.assert_close(rms_norm(x, w, 1e-6), rms_norm_reference(x, w, 1e-6))
    normed2, new_res2 = fused_add_rms_norm(x, res, w, 1e-6)
    torch.testing.assert_close(normed2, normed)
    torch.testing.assert_close(new_res2, new_res)


# ---- rotary + kv write ------------------------------------------------------------------------

def naive_rotary(x, positions, head_dim, base, factor):
    """Per element, angle = (pos / factor) * base^(-2i/d), float64 trig."""
    out = torch.empty(x.shape, dtype=torch.float64)
    half = head_dim // 2
    for t in range(x.shape[0]):
        for i in range(half):
            angle = (float(positions[t]) / factor) * base ** (-2.0 * i / head_dim)
            c, s = math.cos(angle), math.sin(angle)
            x1, x2 = x[t, :, i].double(), x[t, :, i + half].double()
            out[t, :, i] = x1 * c - x2 * s
            out[t, :, i + half] = x2 * c + x1 * s
    return out


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-6), (torch.bfloat16, 1e-2)])
def test_rotary_kv_write_reference(dtype, tol):
    gen = torch.Generator().manual_seed(4)
    num_tokens, num_heads, num_kv_heads, head_dim, block_size = 6, 7, 1, 16, 4
    base, factor = 100000.0, 4.0
    width = (num_heads + 2 * num_kv_heads) * head_dim
    qkv = torch.randn(num_tokens, width, generator=gen, dtype=torch.float64).to(dtype)
    q = qkv[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim)
    k = qkv[:, num_heads * head_dim: (num_heads + num_kv_heads) * head_dim].view(
        num_tokens, num_kv_heads, head_dim)
    v = qkv[:, (num_heads + num_kv_heads) * head_dim:].view(num_tokens, num_kv_heads, head_dim)
    q0, k0, v0 = q.clone(), k.clone(), v.clone()
    positions = torch.tensor([0, 1, 5, 900, 4095, 77])
    slots = torch.tensor([3, 8, -1, 0, 11, 6])
    cos, sin = build_rope_cache(4096, head_dim, base, factor)
    k_cache = torch.randn(4, block_size, num_kv_heads, head_dim, generator=gen,
                          dtype=torch.float64).to(dtype)
    v_cache = torch.randn(k_cache.shape, generator=gen, dtype=torch.float64).to(dtype)
    k_cache0, v_cache0 = k_cache.clone(), v_cache.clone()
    rotary_kv_write_reference(positions, q, k, v, cos, sin, k_cache, v_cache, slots)

    # float32 cos/sin tables: ~1e-7 absolute on the angles' trig values
    assert rel_err(q, naive_rotary(q0, positions, head_dim, base, factor)) <= tol
    k_rot = naive_rotary(k0, positions, head_dim, base, factor)
    assert rel_err(k, k_rot) <= tol
    assert torch.equal(v, v0)
    written = set()
    for t, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        written.add(slot)
        assert torch.equal(k_cache[slot // block_size, slot % block_size], k[t])
        assert torch.equal(v_cache[slot // block_size, slot % block_size], v0[t])
    for slot in range(4 * block_size):
        if slot not in written:   # untouched slots keep their old contents
            assert torch.equal(k_cache[slot // block_size, slot % block_size],
                               k_cache0[slot // block_size, slot % block_size])
            assert torch.equal(v_cache[slot // block_size, slot % block_size],
                               v_cache0[slot // block_size, slot % block_size])


def test_rotary_dispatch_on_cpu_is_reference():
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(3, 4, 8, generator=gen)
    k = torch.randn(3, 2, 8, generator=gen)
    v = torch.randn(3, 2, 8, generator=gen)
    cos, sin = build_rope_cache(16, 8, 10000.0)
    positions = torch.tensor([2, 0, 9])
    kc, vc = torch.zeros(2, 4, 2, 8), torch.zeros(2, 4, 2, 8)
    expect_q = apply_rotary_reference(q, positions, cos, sin)
    rotary_kv_write(positions, q, k, v, cos, sin, kc, vc, torch.tensor([1, 7, -1]))
    torch.testing.assert_close(q, expect_q)
    torch.testing.assert_close(kc[1, 3], k[1])


# ---- silu * mul -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-14), (torch.bfloat16, 1e-2)])
def test_silu_and_mul_reference(dtype, tol):
    gen = torch.Generator().manual_seed(6)
    gate_up = (3 * torch.randn(5, 2 * 37, generator=gen, dtype=torch.float64)).to(dtype)
    g, u = gate_up[:, :37].double(), gate_up[:, 37:].double()
    naive = g / (1 + torch.exp(-g)) * u
    assert rel_err(silu_and_mul_reference(gate_up), naive) <= tol
    torch.testing.assert_close(silu_and_mul(gate_up), silu_and_mul_reference(gate_up))


# ---- fp8 --------------------------------------------------------------------------------------

def test_quantize_fp8_per_channel_round_trip():
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(48, 96, generator=gen) * torch.linspace(0.01, 5, 48)[:, None]
    w_fp8, scale = quantize_fp8_per_channel(w.to(torch.bfloat16))
    assert w_fp8.dtype == FP8_DTYPE and scale.dtype == torch.float32 and scale.shape == (48,)
    # each row's largest magnitude maps to +-448 exactly
    assert torch.allclose(w_fp8.float().abs().amax(dim=1), torch.full((48,), FP8_MAX))
    deq = dequantize_fp8_per_channel(w_fp8, scale)
    # e4m3 keeps 3 mantissa bits: relative rounding error <= 2^-4 for normal numbers
    err = (deq.double() - w.to(torch.bfloat16).double()).abs()
    bound = w.abs().double() * 2.0 ** -4 + scale.double()[:, None] * 2.0 ** -9 + 1e-2 * w.abs().double()
    assert (err <= bound).all()
    assert rel_err(deq, w) <= 0.04


@pytest.mark.parametrize("m", [1, 3, 16, 33])
def test_fp8_gemv_reference_matches_float64(m):
    gen = torch.Generator().manual_seed(8)
    w_fp8, scale = quantize_fp8_per_channel(torch.randn(40, 72, generator=gen))
    x = torch.randn(m, 72, generator=gen, dtype=torch.float64)
    naive = x @ (w_fp8.double() * scale.double()[:, None]).T
    assert rel_err(fp8_gemv_reference(x, w_fp8, scale), naive) <= 1e-14
    xb = x.to(torch.bfloat16)
    assert rel_err(fp8_gemv_reference(xb, w_fp8, scale), xb.double() @ (
        w_fp8.double() * scale.double()[:, None]).T) <= 1e-2
    # CPU dispatch is the weight-only reference, with leading dims kept
    torch.testing.assert_close(fp8_gemv(xb, w_fp8, scale), fp8_gemv_reference(xb, w_fp8, scale))
    y = fp8_linear(xb.view(1, m, 72), w_fp8, scale)
    assert y.shape == (1, m, 40)
    torch.testing.assert_close(y[0], fp8_gemv_reference(xb, w_fp8, scale))


def test_per_token_quant_and_w8a8_reference():
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(5, 64, generator=gen) * torch.tensor([0.1, 1, 10, 100, 1e-3])[:, None]
    x_fp8, x_scale = quantize_fp8_per_token_reference(x)
    assert x_scale.shape == (5, 1)
    torch.testing.assert_close(x_scale[:, 0], x.abs().amax(dim=1) / FP8_MAX)
    assert rel_err(x_fp8.float() * x_scale, x) <= 0.04
    x_fp8b, x_scaleb = quantize_fp8_per_token(x)          # CPU dispatch
    assert torch.equal(x_fp8b.float(), x_fp8.float()) and torch.equal(x_scaleb, x_scale)
    w_fp8, scale = quantize_fp8_per_channel(torch.randn(24, 64, generator=gen))
    w8a8 = fp8_scaled_mm_reference(x, w_fp8, scale)
    assert rel_err(w8a8, fp8_gemv_reference(x, w_fp8, scale)) <= 0.06


@pytest.mark.parametrize("n,k", [(9216, 7168), (7168, 7168), (38400, 7168), (7168, 19200),
                                 (40, 72)])
def test_split_k_covers_k_exactly(n, k):
    config = GemvConfig()
    split_k, k_per_split = split_k_for(n, k, config, 132)
    assert k_per_split % config.block_k == 0
    assert (split_k - 1) * k_per_split < k <= split_k * k_per_split
    n_tiles = -(-n // config.block_n)
    k_blocks = -(-k // config.block_k)
    wanted = min(config.programs_per_sm * 132, n_tiles * k_blocks)
    assert n_tiles * split_k * 2 >= wanted


@pytest.mark.parametrize("qlens,pad", [([7, 1, 12], 2), ([20], 0)], ids=["3-prompts", "one"])
@pytest.mark.parametrize("enable_gqa", [False, True])
def test_fresh_prompts_sdpa_matches_paged_reference(monkeypatch, enable_gqa, qlens, pad):
    """Whole prompts over their own k/v (the eager flash path of the CUDA kernels) equal the
    paged reference reading the same k/v back from the pages; GQA 7 (kv heads expanded, or
    SDPA's own GQA); padding rows zero; one prompt filling the step (SDPA's own output may be
    returned without a copy)."""
    from backend.kernels import dispatch as kernel_dispatch
    from backend.kernels.dispatch import fresh_prompts_sdpa
    from backend.kernels.reference.attention import write_kv

    monkeypatch.setattr(kernel_dispatch, "SDPA_ENABLE_GQA", enable_gqa)

    gen = torch.Generator().manual_seed(5)
    heads, kv_heads, head_dim, block_size = 14, 2, 16, 4
    total = sum(qlens)
    q = torch.randn(total + pad, heads, head_dim, generator=gen)
    k = torch.randn(total + pad, kv_heads, head_dim, generator=gen)
    v = torch.randn(total + pad, kv_heads, head_dim, generator=gen)
    k_cache = torch.zeros(16, block_size, kv_heads, head_dim)
    v_cache = torch.zeros_like(k_cache)
    tables = torch.arange(15).view(3, 5).to(torch.int32)
    slots = torch.tensor([int(tables[i, p // block_size]) * block_size + p % block_size
                          for i, n in enumerate(qlens) for p in range(n)])
    write_kv(k[:total], v[:total], k_cache, v_cache, slots)
    qsl = [0, *torch.tensor(qlens).cumsum(0).tolist()]
    out = fresh_prompts_sdpa(q, k, v, qsl, 0.3, torch.full_like(q, float("nan")))
    assert out.shape == q.shape
    ref = paged_attention_reference(q[:total], k_cache, v_cache, tables[:len(qlens)],
                                    torch.tensor(qsl, dtype=torch.int32),
                                    torch.tensor(qlens, dtype=torch.int32), 0.3)
    torch.testing.assert_close(out[:total], ref, rtol=1e-5, atol=1e-5)
    assert (out[total:] == 0).all()
