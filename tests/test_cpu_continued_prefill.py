"""CPU attention: a long chunk after a cached prefix (an agent's follow-up turn) takes torch's
fused attention over its context gathered from the pages, causal from the end; it matches the
torch reference beside decodes, fresh prefills and short chunks (which stay on the paged kernel),
GQA and MHA, pages in shuffled order, odd block sizes, query slices, fp32 and bf16."""
from __future__ import annotations

import pytest
import torch
from test_cpu_attention import _step

from backend.kernels.cpu import attention as cpu_attention
from backend.kernels.cpu.attention import CONTINUED_MIN_QUERY, CpuAttention, load_library
from backend.kernels.reference.attention import TorchAttention

pytestmark = pytest.mark.skipif(load_library() is None, reason="no C compiler for the CPU kernel")

M = CONTINUED_MIN_QUERY
# decodes first; then: long chunks after a prefix (fused), a short one (paged), fresh prefills
SPECS = [(1, 1), (1, 50), (M, M + 1), (M + 9, 130), (M - 1, 90), (12, 12), (M + 3, M + 3),
         (2 * M, 2 * M + 17)]


def _spy(monkeypatch) -> list[tuple[int, int]]:
    calls = []
    real = CpuAttention._continued_prefill

    def spy(self, q, kc, vc, tables, out, start, q_len, ctx_len, row):
        calls.append((q_len, ctx_len))
        return real(self, q, kc, vc, tables, out, start, q_len, ctx_len, row)

    monkeypatch.setattr(CpuAttention, "_continued_prefill", spy)
    return calls


@pytest.mark.parametrize("heads", [(6, 2), (4, 4), (8, 1)])
@pytest.mark.parametrize("block_size", [16, 5])
def test_long_chunks_after_a_prefix_match_the_reference(heads, block_size, monkeypatch):
    calls = _spy(monkeypatch)
    q, k, v, kc, vc, ctx = _step(SPECS, *heads, 32, block_size, 160, pad=3, seed=11)
    kc2, vc2 = kc.clone(), vc.clone()
    want = TorchAttention(32 ** -0.5)(q, k, v, kc, vc, ctx)
    got = CpuAttention(32 ** -0.5)(q, k, v, kc2, vc2, ctx)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert torch.count_nonzero(got[-3:]) == 0
    # exactly the long chunks after a prefix went the fused way
    assert calls == [(M, M + 1), (M + 9, 130), (2 * M, 2 * M + 17)]


def test_query_slices_give_the_same_result(monkeypatch):
    q, k, v, kc, vc, ctx = _step([(1, 30), (3 * M, 300)], 6, 2, 64, 16, 40, pad=0, seed=3)
    whole = CpuAttention(0.125)(q, k, v, kc.clone(), vc.clone(), ctx)
    # scores of ~5 query rows per slice: the slices' key ranges and masks must line up
    monkeypatch.setattr(cpu_attention, "CONTINUED_SCORE_BYTES", 4 * 6 * 300 * 5)
    sliced = CpuAttention(0.125)(q, k, v, kc.clone(), vc.clone(), ctx)
    torch.testing.assert_close(sliced, whole, rtol=1e-5, atol=1e-6)
    want = TorchAttention(0.125)(q, k, v, kc.clone(), vc.clone(), ctx)
    torch.testing.assert_close(sliced, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("heads", [(6, 2), (16, 16)])
def test_bf16_matches_the_fp32_reference_to_bf16_rounding(heads):
    q, k, v, kc, vc, ctx = _step(SPECS, *heads, 64, 16, 160, pad=2, seed=5)
    q, k, v, kc, vc = (t.to(torch.bfloat16) for t in (q, k, v, kc, vc))
    kc2, vc2 = kc.clone(), vc.clone()
    TorchAttention(0.125)(q, k, v, kc, vc, ctx)  # the reference's page writes
    got = CpuAttention(0.125)(q, k, v, kc2, vc2, ctx)
    assert got.dtype == torch.bfloat16 and torch.equal(kc, kc2)
    want = TorchAttention(0.125)(q.float(), k.float(), v.float(), kc.float(), vc.float(), ctx)
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)
