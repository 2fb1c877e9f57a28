"""The CPU attention (C paged kernel + torch's fused attention for fresh prefills) against the
torch reference on mixed steps (decodes, fresh prefills alone and in runs of equal length,
chunks after a cached prefix), GQA and MHA, padding rows included, fp32 and bf16."""
from __future__ import annotations

import os
import random

import pytest
import torch

from backend.kernels.cpu.attention import CpuAttention, load_library
from backend.kernels.forward_context import ForwardContext
from backend.kernels.reference.attention import TorchAttention

pytestmark = pytest.mark.skipif(load_library() is None, reason="no C compiler for the CPU kernel")


def _step(seq_specs, num_heads, num_kv_heads, head_dim, block_size, num_blocks, pad, seed):
    """seq_specs: (query_len, context_len) per sequence, decodes (query_len 1) first."""
    g = torch.Generator().manual_seed(seed)
    rnd = random.Random(seed)
    free = list(range(num_blocks))
    rnd.shuffle(free)
    width = max(-(-c // block_size) for _, c in seq_specs)
    tables = torch.zeros(len(seq_specs) + 3, width + 2, dtype=torch.int32)  # a wider static buffer
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g)
    slots, positions, qsl = [], [], [0]
    for i, (q_len, ctx) in enumerate(seq_specs):
        nb = -(-ctx // block_size)
        tables[i, :nb] = torch.tensor([free.pop() for _ in range(nb)], dtype=torch.int32)
        for p in range(ctx - q_len, ctx):
            slots.append(int(tables[i, p // block_size]) * block_size + p % block_size)
            positions.append(p)
        qsl.append(qsl[-1] + q_len)
    n = qsl[-1]
    slots += [-1] * pad
    num_decodes = next((i for i, (q_len, _) in enumerate(seq_specs) if q_len != 1), len(seq_specs))
    ctx = ForwardContext(
        positions=torch.tensor(positions + [0] * pad), slot_mapping=torch.tensor(slots),
        block_tables=tables[:len(seq_specs), :width],
        context_lens=torch.tensor([c for _, c in seq_specs], dtype=torch.int32),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32), num_decode_tokens=num_decodes,
        num_prefills=len(seq_specs) - num_decodes, num_prefill_tokens=n - num_decodes,
        query_start_loc_host=qsl, context_lens_host=[c for _, c in seq_specs],
        max_context_len=max(c for _, c in seq_specs), block_size=block_size)
    q = torch.randn(n + pad, num_heads, head_dim, generator=g)
    k = torch.randn(n + pad, num_kv_heads, head_dim, generator=g)
    v = torch.randn(n + pad, num_kv_heads, head_dim, generator=g)
    return q, k, v, k_cache, v_cache, ctx


@pytest.mark.parametrize("heads", [(6, 2), (4, 4), (8, 1)])
@pytest.mark.parametrize("block_size", [16, 5])
def test_kernel_matches_reference_on_mixed_steps(heads, block_size):
    num_heads, num_kv_heads = heads
    specs = [(1, 1), (1, 17), (1, 40), (9, 9), (5, 37), (16, 16), (3, 3), (3, 3)]
    q, k, v, kc, vc, ctx = _step(specs, num_heads, num_kv_heads, 32, block_size, 64, pad=3, seed=1)
    scale = 32 ** -0.5
    kc2, vc2 = kc.clone(), vc.clone()
    want = TorchAttention(scale)(q, k, v, kc, vc, ctx)
    attn = CpuAttention(scale)
    assert attn.uses_kernel
    got = attn(q, k, v, kc2, vc2, ctx)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)  # same pages written
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert torch.count_nonzero(got[-3:]) == 0  # padding rows stay zero


def test_kernel_follows_the_block_table_not_slot_order():
    # one long decode whose blocks are scattered: a wrong page walk changes the result
    q, k, v, kc, vc, ctx = _step([(1, 200)], 4, 2, 64, 16, 40, pad=0, seed=7)
    want = TorchAttention(0.125)(q, k, v, kc.clone(), vc.clone(), ctx)
    got = CpuAttention(0.125)(q, k, v, kc, vc, ctx)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("heads", [(6, 2), (4, 4)])
def test_bf16_matches_the_fp32_reference_to_bf16_rounding(heads):
    # runs of equal-length fresh prefills take one fused call; a cached-prefix chunk sits
    # between them; the bf16 pages are written exactly as the reference writes them
    specs = [(1, 1), (1, 33), (4, 4), (4, 4), (4, 4), (5, 37), (7, 7), (7, 7), (1, 2)]
    specs = sorted(specs, key=lambda s: s[0] != 1)  # decodes first
    q, k, v, kc, vc, ctx = _step(specs, *heads, 64, 16, 48, pad=2, seed=5)
    q, k, v, kc, vc = (t.to(torch.bfloat16) for t in (q, k, v, kc, vc))
    kc2, vc2 = kc.clone(), vc.clone()
    TorchAttention(0.125)(q, k, v, kc, vc, ctx)  # the reference's page writes
    got = CpuAttention(0.125)(q, k, v, kc2, vc2, ctx)
    assert got.dtype == torch.bfloat16
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)
    want = TorchAttention(0.125)(q.float(), k.float(), v.float(), kc.float(), vc.float(), ctx)
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)
    assert torch.count_nonzero(got[-2:]) == 0


def test_fp16_pools_fall_back_to_the_reference():
    q, k, v, kc, vc, ctx = _step([(1, 20), (4, 4)], 4, 2, 16, 16, 8, pad=0, seed=3)
    q, k, v, kc, vc = (t.to(torch.float16) for t in (q, k, v, kc, vc))
    want = TorchAttention(0.25)(q, k, v, kc.clone(), vc.clone(), ctx)
    got = CpuAttention(0.25)(q, k, v, kc, vc, ctx)
    assert torch.equal(got, want)


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f
                         if line.startswith("flags")), set())
    except OSError:
        return set()


def test_amx_path_is_on_where_the_cpu_has_amx():
    # a build without -mamx-* or a refused arch_prctl would silently keep the portable kernel
    lib = load_library()
    if os.environ.get("TIDEGATE_CPU_MARCH", "native") != "native":
        assert lib.cpu_amx_mode(-1) == 0  # e.g. the AVX2 build (tests/test_cpu_kernels_avx2.py)
        pytest.skip("a build for another CPU than this one")
    if not {"amx_tile", "amx_bf16"} <= _cpu_flags():
        assert lib.cpu_amx_mode(-1) == 0
        pytest.skip("this CPU has no AMX: the portable kernel runs (tested above)")
    assert lib.cpu_amx_mode(-1) == 1


def _call_amx(lib, q, kc, vc, ctx, out, num_heads, scale):
    n = ctx.num_seqs
    return lib.paged_attention_bf16_amx(
        q.data_ptr(), q.stride(0), kc.data_ptr(), vc.data_ptr(), ctx.block_tables.data_ptr(),
        ctx.block_tables.stride(0), ctx.query_start_loc.data_ptr(), ctx.context_lens.data_ptr(),
        n, num_heads, kc.shape[2], q.shape[2], kc.shape[1], scale, out.data_ptr())


@pytest.mark.parametrize("heads,head_dim,block_size", [
    ((6, 2), 64, 16), ((4, 1), 64, 32), ((8, 8), 128, 16), ((16, 1), 32, 16), ((6, 3), 96, 48),
    ((4, 2), 80, 16), ((6, 2), 48, 16), ((2, 1), 112, 32), ((8, 2), 16, 16)])
def test_amx_kernel_matches_the_reference_and_the_portable_kernel(heads, head_dim, block_size):
    """Decodes at contexts around the 16- and 32-key tile edges (1, 15, 16, 17, 31, 32, 33, 200)
    and chunks after a cached prefix (every query its own causal length), through the AMX path
    called directly (it must take these shapes) and through the public entry with AMX off."""
    lib = load_library()
    if lib.cpu_amx_mode(-1) != 1:
        pytest.skip("no AMX on this CPU (or not granted): the portable kernel is tested above")
    num_heads, _ = heads
    specs = [(1, c) for c in (1, 15, 16, 17, 31, 32, 33, 200)] + [(5, 37), (16, 48), (3, 70)]
    q, k, v, kc, vc, ctx = _step(specs, *heads, head_dim, block_size, 64, pad=0, seed=11)
    q, kc, vc = (t.to(torch.bfloat16) for t in (q, kc, vc))
    kflat, vflat = kc.view(-1, *kc.shape[2:]), vc.view(-1, *vc.shape[2:])
    kflat[ctx.slot_mapping] = k.to(torch.bfloat16)  # this step's rows, as the layer writes them
    vflat[ctx.slot_mapping] = v.to(torch.bfloat16)
    # slots nobody wrote hold NaN: the tiles read whole 16-key runs, past the context's end
    written = torch.zeros(kc.shape[0] * block_size, dtype=torch.bool)
    for i, (_, c) in enumerate(specs):
        for p in range(c):
            written[int(ctx.block_tables[i, p // block_size]) * block_size + p % block_size] = True
    kflat[~written] = float("nan")
    vflat[~written] = float("nan")
    scale = head_dim ** -0.5
    got = torch.empty_like(q)
    assert _call_amx(lib, q, kc, vc, ctx, got, num_heads, scale) == 0
    kk, vv = k.to(torch.bfloat16).float(), v.to(torch.bfloat16).float()
    want = TorchAttention(scale)(q.float(), kk, vv, kc.float().nan_to_num(),
                                 vc.float().nan_to_num(), ctx)
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)
    lib.cpu_amx_mode(0)
    try:
        portable = torch.empty_like(q)
        assert lib.paged_attention_bf16(
            q.data_ptr(), q.stride(0), kc.data_ptr(), vc.data_ptr(), ctx.block_tables.data_ptr(),
            ctx.block_tables.stride(0), ctx.query_start_loc.data_ptr(),
            ctx.context_lens.data_ptr(), ctx.num_seqs, num_heads, kc.shape[2], head_dim,
            block_size, scale, portable.data_ptr()) == 0
    finally:
        lib.cpu_amx_mode(1)
    # same math (fp32 scores and sums), other summation order: a bf16 ulp or two
    torch.testing.assert_close(got.float(), portable.float(), rtol=1e-2, atol=4e-3)


@pytest.mark.parametrize("head_dim,block_size", [(64, 5), (64, 8), (72, 16), (256, 16)])
def test_amx_kernel_refuses_what_it_does_not_take(head_dim, block_size):
    # 16-key runs must not cross a page; head_dim in 16s (a tile's pairs), at most 128
    lib = load_library()
    q, _, _, kc, vc, ctx = _step([(1, 20)], 4, 2, head_dim, block_size, 8, pad=0, seed=2)
    q, kc, vc = (t.to(torch.bfloat16) for t in (q, kc, vc))
    out = torch.zeros_like(q)
    assert _call_amx(lib, q, kc, vc, ctx, out, 4, 0.1) == 1
    assert torch.count_nonzero(out) == 0


def test_amx_kernel_leaves_onednn_bf16_matmuls_working():
    # oneDNN's bf16 matmuls use AMX tiles in this same thread: a matmul before and after the
    # kernel gives the same bits. The kernel restores the caller's tile configuration; torch
    # 2.13's oneDNN configures the tiles at each call, so this passes with a plain release
    # too: it guards the interleaving (a fault, a changed result), not the restore itself
    lib = load_library()
    if lib.cpu_amx_mode(-1) != 1:
        pytest.skip("no AMX on this CPU (or not granted)")
    g = torch.Generator().manual_seed(4)
    a = torch.randn(64, 384, generator=g).to(torch.bfloat16)
    w = torch.randn(1024, 384, generator=g).to(torch.bfloat16)
    before = torch.nn.functional.linear(a, w)
    q, _, _, kc, vc, ctx = _step([(1, 40), (1, 7)], 6, 2, 64, 16, 8, pad=0, seed=6)
    q, kc, vc = (t.to(torch.bfloat16) for t in (q, kc, vc))
    for _ in range(3):
        assert _call_amx(lib, q, kc, vc, ctx, torch.empty_like(q), 6, 0.125) == 0
        assert torch.equal(torch.nn.functional.linear(a, w), before)
