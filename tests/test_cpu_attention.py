"""The CPU attention (C paged kernel + torch's fused attention for fresh prefills) against the
torch reference on mixed steps (decodes, fresh prefills alone and in runs of equal length,
chunks after a cached prefix), GQA and MHA, padding rows included, fp32 and bf16."""
from __future__ import annotations

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
