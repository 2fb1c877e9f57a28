"""The Triton attention and rotary/KV-write kernels run on the CPU through Triton's interpreter
(TRITON_INTERPRET=1), checked against their torch references: all three KV formats, decode-only
and mixed prefill + decode steps, cached prefixes, random block tables, split contexts, a
context-0 padding sequence, GQA 7 padded to 8/16 rows, outputs poisoned with NaN first.

Runs wherever `triton` imports (CI installs it on Linux x86-64). The interpreter computes the
dots in fp32 (its bf16 dot is broken), so the bf16 tensor-core path is checked on the GPU
(tests/test_kernels_gpu.py); everything else (indexing, masking, splits, dequantization,
quantize-on-write) is the same code.
"""
from __future__ import annotations

import os

import pytest
import torch

from tests.interpreter_run import run_in_interpreter

triton = pytest.importorskip("triton")

from backend.kv.formats import QuantizedPages

FORMATS = {"auto": None, "fp8": ("fp8", "fp8"), "int4-fp8": ("int4", "fp8")}
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"

# Triton picks interpreted or compiled functions (its own library's too) when `@triton.jit`
# runs, i.e. at import; so this file runs itself in a fresh interpreter-mode process.
if not INTERPRETING:

    def test_kernels_in_triton_interpreter(tmp_path):
        # every case collected in the interpreter ran and passed, none skipped (the exit code
        # alone is 0 when all are skipped)
        assert run_in_interpreter(__file__, tmp_path) > 0


@pytest.fixture(scope="module")
def kernels():
    from backend.kernels import paged_attention, rotary_kv

    return paged_attention, rotary_kv


def _pools(fmt, num_blocks, block_size, kv_heads, head_dim, dtype, gen):
    """K and V pools of `fmt` filled with random (never zero) content."""
    if FORMATS[fmt] is None:
        k = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
        v = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
        return k, v
    kc, vc = FORMATS[fmt]
    k = QuantizedPages(kc, num_blocks, block_size, kv_heads, head_dim, "cpu")
    v = QuantizedPages(vc, num_blocks, block_size, kv_heads, head_dim, "cpu")
    slots = torch.arange(num_blocks * block_size)
    k.write(slots, 2 * torch.randn(len(slots), kv_heads, head_dim, generator=gen))
    v.write(slots, torch.randn(len(slots), kv_heads, head_dim, generator=gen))
    return k, v


def _step(query_lens, context_lens, num_blocks, block_size, gen):
    """Metadata of one step: per-sequence query starts, contexts and random block tables."""
    width = max(1, max(-(-c // block_size) for c in context_lens)) + 1
    perm = torch.randperm(num_blocks, generator=gen)[: len(context_lens) * width]
    tables = perm.view(len(context_lens), width).to(torch.int32)
    qsl = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor(query_lens).cumsum(0)
    return tables, qsl, torch.tensor(context_lens, dtype=torch.int32)


ATTN_CASES = [
    # (heads, kv heads, head_dim, block, query lens, context lens, splits)
    # decode-only: one sequence per program; split context; a context-0 padding row
    (8, 2, 32, 4, [1, 1, 1], [5, 37, 0], 1),
    (8, 2, 32, 4, [1, 1], [29, 64], 3),
    # mixed: 2 decodes, a chunk on a cached prefix, a fresh prompt, an empty trailing sequence
    (8, 2, 32, 4, [1, 1, 9, 6, 0], [17, 3, 30, 6, 0], 1),
    (8, 2, 32, 4, [1, 9], [40, 12], 2),
    # GQA 7 (the 33B ratio), head_dim 16; padding tokens in a context-0 sequence
    (7, 1, 16, 8, [1, 5, 3], [12, 21, 0], 1),
]


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("case", ATTN_CASES, ids=lambda c: f"q{c[4]}-ctx{c[5]}-s{c[6]}")
def test_paged_attention_matches_reference(kernels, fmt, case):
    pa, _ = kernels
    heads, kv_heads, head_dim, block_size, qlens, ctxs, splits = case
    gen = torch.Generator().manual_seed(hash((fmt, str(case))) % 2**31)
    num_blocks = 3 * len(ctxs) * (max(ctxs) // block_size + 2)
    k, v = _pools(fmt, num_blocks, block_size, kv_heads, head_dim, torch.float32, gen)
    tables, qsl, lens = _step(qlens, ctxs, num_blocks, block_size, gen)
    q = torch.randn(sum(qlens), heads, head_dim, generator=gen)
    out = torch.full_like(q, float("nan"))  # poisoned: every row must be written
    pa.paged_attention_triton(q, k, v, tables, qsl, lens, 0.3, max_query_len=max(qlens),
                              num_splits=splits, out=out)
    ref = pa.paged_attention_reference(q, k, v, tables, qsl, lens, 0.3)
    assert torch.isfinite(out).all()
    err = ((out - ref).norm() / ref.norm()).item()
    assert err < 1e-5, err
    # a context-0 sequence (padding) reads nothing and comes out zero
    for i, c in enumerate(ctxs):
        if c == 0:
            assert out[qsl[i]:qsl[i + 1]].abs().max().item() == 0.0 if qsl[i] < qsl[i + 1] else True


@pytest.mark.parametrize("fmt", ["fp8", "int4-fp8"])
@pytest.mark.parametrize("case", [ATTN_CASES[1], ATTN_CASES[2], ATTN_CASES[4]],
                         ids=lambda c: f"q{c[4]}-ctx{c[5]}-s{c[6]}")
def test_paged_attention_quantized_fp16_dots(kernels, fmt, case):
    """The GPU default for quantized pages: codes dequantized to fp16 (int4 nibbles through
    their fp16 bit pattern) and fp16 dots, here with fp16 dots in the interpreter. Its error
    against the fp32 reference is fp16 rounding of q and p (codes are exact in fp16)."""
    pa, _ = kernels
    heads, kv_heads, head_dim, block_size, qlens, ctxs, splits = case
    gen = torch.Generator().manual_seed(hash(("f16", fmt, str(case))) % 2**31)
    num_blocks = 3 * len(ctxs) * (max(ctxs) // block_size + 2)
    k, v = _pools(fmt, num_blocks, block_size, kv_heads, head_dim, torch.float32, gen)
    tables, qsl, lens = _step(qlens, ctxs, num_blocks, block_size, gen)
    q = torch.randn(sum(qlens), heads, head_dim, generator=gen)
    out = torch.full_like(q, float("nan"))
    pa.paged_attention_triton(q, k, v, tables, qsl, lens, 0.3, max_query_len=max(qlens),
                              num_splits=splits, out=out, quant_f16=True, fp32_dot=False)
    ref = pa.paged_attention_reference(q, k, v, tables, qsl, lens, 0.3)
    real = torch.tensor([c > 0 for c, n in zip(ctxs, qlens) for _ in range(n)])
    assert torch.isfinite(out).all()
    err = ((out[real] - ref[real]).norm() / ref[real].norm()).item()
    assert 0 < err < 3e-3, err   # > 0: the fp16 path really ran (fp32 dots would be ~1e-7)


def test_paged_attention_bf16_io_and_dispatch(kernels):
    """bf16 q/out and pages through the public dispatcher (default tiling and split choice)."""
    pa, _ = kernels
    gen = torch.Generator().manual_seed(7)
    k, v = _pools("auto", 40, 4, 2, 32, torch.bfloat16, gen)
    tables, qsl, lens = _step([1, 4], [21, 11], 40, 4, gen)
    q = torch.randn(5, 8, 32, generator=gen).to(torch.bfloat16)
    out = pa.paged_attention(q, k, v, tables, qsl, lens, max_query_len=4)
    ref = pa.paged_attention_reference(q, k, v, tables, qsl, lens, 32 ** -0.5)
    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    assert out.dtype == torch.bfloat16 and err < 1e-2, err


def _qkv(tokens, heads, kv_heads, head_dim, gen):
    qkv = 3 * torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], -1)
    return qkv, (q.view(tokens, heads, head_dim), k.view(tokens, kv_heads, head_dim),
                 v.view(tokens, kv_heads, head_dim))


def _raw(pool, slots):
    """(code bytes, scales) of `slots` of a pool (a plain tensor: its values, no scales)."""
    if isinstance(pool, torch.Tensor):
        return pool.reshape(-1, *pool.shape[2:])[slots], None
    n = pool.shape[0] * pool.shape[1]
    data = pool.data.view(torch.uint8)
    return (data.view(n, *data.shape[2:])[slots], pool.scale.view(n, *pool.scale.shape[2:])[slots])


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_rotary_kv_write_quantizes_like_reference(kernels, fmt, head_dim):
    """Rotated q/k in place, and the page contents (codes and scales, bit for bit) equal the
    reference rotary followed by `backend.kv.formats`'s encoders; a slot of -1 writes nothing."""
    _, rk = kernels
    heads, kv_heads, block_size, num_blocks, tokens = 4, 2, 4, 8, 6
    gen = torch.Generator().manual_seed(head_dim + len(fmt))
    cos, sin = rk.build_rope_cache(64, head_dim, 10000.0)
    positions = torch.randint(0, 64, (tokens,), generator=gen)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    slots[2] = -1
    qkv, _ = _qkv(tokens, heads, kv_heads, head_dim, gen)
    results = []
    for write in (rk.rotary_kv_write, rk.rotary_kv_write_reference):
        x = qkv.clone()
        q, k, v = x.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], -1)
        views = (q.view(tokens, heads, head_dim), k.view(tokens, kv_heads, head_dim),
                 v.view(tokens, kv_heads, head_dim))
        if FORMATS[fmt] is None:
            pools = [torch.full((num_blocks, block_size, kv_heads, head_dim), float("nan"))
                     for _ in range(2)]
        else:
            pools = [QuantizedPages(c, num_blocks, block_size, kv_heads, head_dim, "cpu")
                     for c in FORMATS[fmt]]
            for p in pools:  # poison: unwritten slots keep it
                p.data.view(torch.uint8).fill_(0x55)
                p.scale.fill_(-1.0)
        write(positions, *views, cos, sin, pools[0], pools[1], slots)
        results.append((x, pools))
    (x_kernel, pools_kernel), (x_ref, pools_ref) = results
    torch.testing.assert_close(x_kernel, x_ref, rtol=1e-6, atol=1e-6)
    written = slots[slots >= 0]
    for pk, pr in zip(pools_kernel, pools_ref):
        (ck, sk), (cr, sr) = _raw(pk, written), _raw(pr, written)
        assert torch.equal(ck, cr)
        if sk is not None:
            assert torch.equal(sk, sr)
        # the skipped token's slot stays poisoned
        all_slots = torch.arange(num_blocks * block_size)
        untouched = all_slots[~torch.isin(all_slots, written)]
        raw_untouched, _ = _raw(pk, untouched)
        if isinstance(pk, torch.Tensor):
            assert torch.isnan(raw_untouched).all()
        else:
            assert (raw_untouched == 0x55).all()


@pytest.mark.parametrize("head_dim", [16, 32, 64, 128])
def test_int4_fp16_scale_layout_write_and_attention(kernels, head_dim, monkeypatch):
    """int4 keys in 16-channel groups with fp16 scales (kv_quant.INT4_SCALE_DTYPE): the fused
    write encodes them bit for bit like the reference, and the attention kernel reads them
    (fp32 and fp16 dots, decode split and mixed steps) like the reference."""
    from backend.kv import formats as kv_quant

    monkeypatch.setattr(kv_quant, "INT4_GROUP", 16)
    monkeypatch.setattr(kv_quant, "INT4_SCALE_DTYPE", torch.float16)
    assert QuantizedPages("int4", 1, 4, 2, head_dim, "cpu").scale.dtype == torch.float16
    test_rotary_kv_write_quantizes_like_reference(kernels, "int4-fp8", head_dim)
    pa, _ = kernels
    for qlens, ctxs, splits in (([1, 1, 1], [40, 7, 100], 3), ([1, 9, 1], [33, 20, 61], 1)):
        gen = torch.Generator().manual_seed(head_dim + splits)
        k, v = _pools("int4-fp8", 40, 16, 2, head_dim, torch.float32, gen)
        tables, qsl, lens = _step(qlens, ctxs, 40, 16, gen)
        q = torch.randn(sum(qlens), 14, head_dim, generator=gen)
        ref = pa.paged_attention_reference(q, k, v, tables, qsl, lens, 0.3)
        for kw, tol in (({}, 1e-5), ({"quant_f16": True, "fp32_dot": False}, 3e-3)):
            out = torch.full_like(q, float("nan"))
            pa.paged_attention_triton(q, k, v, tables, qsl, lens, 0.3, out=out,
                                      max_query_len=max(qlens), num_splits=splits, **kw)
            assert torch.isfinite(out).all()
            assert ((out - ref).norm() / ref.norm()).item() < tol, kw


@pytest.mark.parametrize("fill", [False, True], ids=["codes", "fill-rows"])
def test_kernel_write_then_kernel_attention_reads_it(kernels, fill):
    """A mixed step end to end on int4-fp8 pages: the fused write quantizes, the attention
    kernel dequantizes what it wrote, and both equal the reference write + reference attention.
    With fill rows the write also stores the rotated keys of the tokens that have one (and only
    those: the others keep the rows' old contents), bit for bit as the reference."""
    pa, rk = kernels
    heads, kv_heads, head_dim, block_size, num_blocks = 8, 2, 32, 4, 24
    gen = torch.Generator().manual_seed(11)
    cos, sin = rk.build_rope_cache(64, head_dim, 10000.0)
    qlens, ctxs = [1, 7], [10, 7]
    tables, qsl, lens = _step(qlens, ctxs, num_blocks, block_size, gen)
    positions = torch.tensor([9] + list(range(7)))
    slots = torch.stack([tables[0, 9 // block_size] * block_size + 9 % block_size] +
                        [tables[1, p // block_size] * block_size + p % block_size
                         for p in range(7)]).long()
    # sequence 0 (slot 2) reads 8..9 from its rows, sequence 1 (slot 0) 4..6; tokens of
    # sequence 1 before its last block write no row; row 8 (position 8) keeps its old 0.5
    fill_kw = {}
    fill_index = None
    if fill:
        fill_kw = {"fill_slot": torch.tensor([2, 0], dtype=torch.int32),
                   "fill_lo": torch.tensor([8, 4], dtype=torch.int32)}
        fill_index = torch.tensor([2 * block_size + 1, -1, -1, -1, -1, 0, 1, 2])
    base_k, base_v = _pools("int4-fp8", num_blocks, block_size, kv_heads, head_dim,
                            torch.float32, gen)
    qkv, _ = _qkv(8, heads, kv_heads, head_dim, gen)
    outs, rows = [], []
    for write, attend in ((rk.rotary_kv_write, pa.paged_attention_triton),
                          (rk.rotary_kv_write_reference, None)):
        k_pool = QuantizedPages("int4", num_blocks, block_size, kv_heads, head_dim, "cpu")
        v_pool = QuantizedPages("fp8", num_blocks, block_size, kv_heads, head_dim, "cpu")
        for dst, src in ((k_pool, base_k), (v_pool, base_v)):
            dst.data.copy_(src.data)
            dst.scale.copy_(src.scale)
        if fill:
            k_pool.attach_fill(3, torch.float32)
            k_pool.fill.fill_(0.5)
        x = qkv.clone()
        q, k, v = x.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], -1)
        q = q.view(8, heads, head_dim)
        write(positions, q, k.view(8, kv_heads, head_dim), v.view(8, kv_heads, head_dim),
              cos, sin, k_pool, v_pool, slots, fill_index)
        if fill:
            rows.append(k_pool.fill.clone())
        if attend is None:
            outs.append(pa.paged_attention_reference(q, k_pool, v_pool, tables, qsl, lens, 0.2,
                                                     fill_kw.get("fill_slot"),
                                                     fill_kw.get("fill_lo")))
        else:
            outs.append(attend(q, k_pool, v_pool, tables, qsl, lens, 0.2, max_query_len=7,
                               **fill_kw))
    if fill:
        assert torch.equal(rows[0], rows[1])
        assert (rows[0].view(-1, kv_heads, head_dim)[[3, 4, 5, 6, 7, 8, 10, 11]] == 0.5).all()
    err = ((outs[0] - outs[1]).norm() / outs[1].norm()).item()
    assert err < 1e-5, err


def _fill_meta(ctxs, block_size, num_slots, gen):
    """Fill slots (-1 for every third sequence and for context 0) and first fill positions
    inside each sequence's last block."""
    slots = torch.randperm(num_slots, generator=gen)[: len(ctxs)].to(torch.int32)
    lo = torch.zeros(len(ctxs), dtype=torch.int32)
    for i, c in enumerate(ctxs):
        if c == 0 or i % 3 == 2:
            slots[i] = -1
            continue
        last = (c - 1) // block_size * block_size
        lo[i] = last + int(torch.randint(0, c - last, (1,), generator=gen))
    return slots, lo


@pytest.mark.parametrize("quant_f16", [False, True], ids=["fp32-dots", "fp16-dots"])
@pytest.mark.parametrize("case", ATTN_CASES, ids=lambda c: f"q{c[4]}-ctx{c[5]}-s{c[6]}")
def test_paged_attention_reads_the_block_being_filled(kernels, case, quant_f16):
    """int4 keys with fill rows (backend.kv.fill_slots): positions >= fill_lo of a sequence with a
    slot come from its rows at full precision (here different from the codes, so reading the
    wrong one shows), the others from the codes: kernel = reference, split or not."""
    pa, _ = kernels
    heads, kv_heads, head_dim, block_size, qlens, ctxs, splits = case
    gen = torch.Generator().manual_seed(hash(("fill", str(case))) % 2**31)
    num_blocks = 3 * len(ctxs) * (max(ctxs) // block_size + 2)
    k, v = _pools("int4-fp8", num_blocks, block_size, kv_heads, head_dim, torch.float32, gen)
    k.attach_fill(len(ctxs) + 2, torch.float32)
    k.fill.copy_(3 * torch.randn(k.fill.shape, generator=gen))
    tables, qsl, lens = _step(qlens, ctxs, num_blocks, block_size, gen)
    fill_slot, fill_lo = _fill_meta(ctxs, block_size, len(ctxs) + 2, gen)
    q = torch.randn(sum(qlens), heads, head_dim, generator=gen)
    out = torch.full_like(q, float("nan"))
    pa.paged_attention_triton(q, k, v, tables, qsl, lens, 0.3, max_query_len=max(qlens),
                              num_splits=splits, out=out, quant_f16=quant_f16,
                              fp32_dot=not quant_f16, fill_slot=fill_slot, fill_lo=fill_lo)
    ref = pa.paged_attention_reference(q, k, v, tables, qsl, lens, 0.3, fill_slot, fill_lo)
    codes_only = pa.paged_attention_reference(q, k, v, tables, qsl, lens, 0.3)
    assert torch.isfinite(out).all()
    err = ((out - ref).norm() / ref.norm()).item()
    assert err < (2e-3 if quant_f16 else 1e-5), err
    assert ((codes_only - ref).norm() / ref.norm()).item() > 20 * err


if not INTERPRETING:  # the cases are collected only inside test_kernels_in_triton_interpreter
    del (test_paged_attention_matches_reference, test_paged_attention_bf16_io_and_dispatch,
         test_paged_attention_quantized_fp16_dots,
         test_rotary_kv_write_quantizes_like_reference,
         test_kernel_write_then_kernel_attention_reads_it,
         test_int4_fp16_scale_layout_write_and_attention,
         test_paged_attention_reads_the_block_being_filled)
