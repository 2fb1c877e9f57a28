"""Paged decode attention for GQA: one new query token per sequence against its paged KV.

Layout (backend.kv_cache / backend.context):

    q            [num_seqs, num_heads, head_dim]                query head h reads kv head h // group
    k_cache      [num_blocks, block_size, num_kv_heads, head_dim]   same for v_cache
    block_tables int32 [num_seqs, max_blocks]   logical block j of sequence s -> physical block
    context_lens int32 [num_seqs]                tokens of context (0 = padding row -> zeros out)

Triton plan (two launches):

    partial kernel, grid (num_seqs, num_kv_heads, num_splits):
        one program serves all `group` query heads of one KV head (33B: 7, padded to 16 rows of
        a tensor-core tile and masked) over one contiguous slice of the context:

        context:  | split 0 | split 1 | ... | split S-1 |     each slice a multiple of BLOCK_N
                  0                               context_len
        every BLOCK_N tile gathers its rows page by page through the block table; scores and the
        running softmax (max, sum) stay in fp32; out: normalized partial o and its log-sum-exp.
    reduce kernel, grid (num_seqs, num_heads): merge the splits by their log-sum-exp.

    With one split the partial kernel writes the output directly and the reduce is skipped.

num_splits depends only on host values (num_seqs, num_kv_heads, an upper bound on the context),
never on device data, so the launch is CUDA-graph safe: each sequence divides its own context
over the splits inside the kernel; splits past its end write lse = -inf and drop out of the merge.
"""
from __future__ import annotations

import math

import torch

from backend.kernels.triton_utils import (
    HAS_TRITON,
    cdiv,
    next_power_of_2,
    num_sms,
    tl,
    triton,
    use_triton,
)

# Split-K sizing: aim for PROGRAMS_PER_SM programs per multiprocessor, but give each split at
# least MIN_TOKENS_PER_SPLIT tokens of context (fewer makes the merge traffic dominate).
PROGRAMS_PER_SM = 2
MIN_TOKENS_PER_SPLIT = 128
MAX_SPLITS = 64
BLOCK_N = 64          # context tokens per inner tile
NUM_WARPS = 4
NUM_STAGES = 2
_LOG2E = 1.4426950408889634


def paged_decode_attention_reference(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
) -> torch.Tensor:
    """Torch oracle: gather each sequence's K/V through its block table, dense softmax attention.

    Computes in fp32 (float64 when given float64), returns q's dtype; context_len 0 -> zeros.
    """
    num_seqs, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    acc_dtype = torch.promote_types(q.dtype, torch.float32)
    out = torch.zeros_like(q)
    lens = context_lens.tolist()
    for s in range(num_seqs):
        n = int(lens[s])
        if n == 0:
            continue
        blocks = block_tables[s, : cdiv(n, block_size)].long()
        # [num_used_blocks, block_size, kvh, d] -> [n, kvh, d] -> [n, heads, d]
        k = k_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:n].to(acc_dtype)
        v = v_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:n].to(acc_dtype)
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[s].to(acc_dtype), k) * scale   # [heads, n]
        probs = torch.softmax(scores, dim=-1)
        out[s] = torch.einsum("hn,nhd->hd", probs, v).to(q.dtype)
    return out


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_context_len: int,
                      sm_count: int = 132) -> int:
    """Splits so that num_seqs * num_kv_heads * splits >= PROGRAMS_PER_SM * sm_count, each split
    keeping >= MIN_TOKENS_PER_SPLIT tokens of the longest context."""
    base = max(1, num_seqs * num_kv_heads)
    wanted = cdiv(PROGRAMS_PER_SM * sm_count, base)
    useful = max(1, cdiv(max(1, max_context_len), MIN_TOKENS_PER_SPLIT))
    return max(1, min(wanted, useful, MAX_SPLITS))


if HAS_TRITON:

    @triton.jit
    def _decode_partial_kernel(
        q_ptr, k_ptr, v_ptr, block_tables_ptr, context_lens_ptr,
        out_ptr, part_o_ptr, part_lse_ptr,
        qk_scale,                       # softmax scale * log2(e): scores live in the log2 domain
        num_splits,
        stride_qs, stride_qh,
        stride_kb, stride_kt, stride_kh,
        stride_vb, stride_vt, stride_vh,
        stride_bt, stride_os, stride_oh,
        NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_P2: tl.constexpr,
        HEAD_DIM: tl.constexpr, HEAD_DIM_P2: tl.constexpr,
        BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_SPLIT: tl.constexpr,
        IEEE_DOT: tl.constexpr,
    ):
        seq = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)

        context_len = tl.load(context_lens_ptr + seq)
        # this sequence's slice of the context: a multiple of BLOCK_N tokens per split
        per_split = tl.cdiv(tl.cdiv(context_len, num_splits), BLOCK_N) * BLOCK_N
        start = split * per_split
        end = tl.minimum(start + per_split, context_len)

        offs_g = tl.arange(0, GROUP_P2)
        offs_d = tl.arange(0, HEAD_DIM_P2)
        mask_g = offs_g < GROUP
        mask_d = offs_d < HEAD_DIM
        heads = kv_head * GROUP + offs_g                                  # [G]
        q = tl.load(q_ptr + seq * stride_qs + heads[:, None] * stride_qh + offs_d[None, :],
                    mask=mask_g[:, None] & mask_d[None, :], other=0.0)    # [G, D]

        m_i = tl.full([GROUP_P2], -1.0e30, dtype=tl.float32)
        l_i = tl.zeros([GROUP_P2], dtype=tl.float32)
        acc = tl.zeros([GROUP_P2, HEAD_DIM_P2], dtype=tl.float32)

        bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
        for tile in range(start, end, BLOCK_N):
            offs_n = tile + tl.arange(0, BLOCK_N)
            mask_n = offs_n < end
            page = tl.load(bt_row + offs_n // BLOCK_SIZE, mask=mask_n, other=0).to(tl.int64)
            row_in_page = offs_n % BLOCK_SIZE
            kv_mask = mask_n[:, None] & mask_d[None, :]
            k = tl.load(k_ptr + page[:, None] * stride_kb + row_in_page[:, None] * stride_kt
                        + kv_head * stride_kh + offs_d[None, :], mask=kv_mask, other=0.0)  # [N, D]
            v = tl.load(v_ptr + page[:, None] * stride_vb + row_in_page[:, None] * stride_vt
                        + kv_head * stride_vh + offs_d[None, :], mask=kv_mask, other=0.0)  # [N, D]
            if IEEE_DOT:
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))                                 # [G, N] fp32
            s = tl.where(mask_n[None, :], s * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if IEEE_DOT:
                acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new

        nonempty = l_i > 0.0
        o = acc / tl.where(nonempty, l_i, 1.0)[:, None]
        store_mask = mask_g[:, None] & mask_d[None, :]
        if SINGLE_SPLIT:
            tl.store(out_ptr + seq * stride_os + heads[:, None] * stride_oh + offs_d[None, :],
                     o.to(out_ptr.dtype.element_ty), mask=store_mask)
        else:
            # part_o [num_seqs, num_heads, num_splits, HEAD_DIM] fp32; part_lse [.., .., splits]
            row = (seq * NUM_HEADS + heads) * num_splits + split                   # [G]
            tl.store(part_o_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], o, mask=store_mask)
            lse = tl.where(nonempty, m_i + tl.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
            tl.store(part_lse_ptr + row, lse, mask=mask_g)

    @triton.jit
    def _decode_reduce_kernel(
        part_o_ptr, part_lse_ptr, out_ptr, stride_os, stride_oh, num_splits,
        NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_P2: tl.constexpr,
        SPLITS_P2: tl.constexpr,
    ):
        seq = tl.program_id(0)
        head = tl.program_id(1)
        offs_s = tl.arange(0, SPLITS_P2)
        offs_d = tl.arange(0, HEAD_DIM_P2)
        mask_s = offs_s < num_splits
        mask_d = offs_d < HEAD_DIM
        base = (seq * NUM_HEADS + head) * num_splits
        lse = tl.load(part_lse_ptr + base + offs_s, mask=mask_s, other=float("-inf"))
        m = tl.max(lse, axis=0)
        m = tl.where(m == float("-inf"), 0.0, m)            # all splits empty: weights all 0
        w = tl.exp2(lse - m)                                 # [S]
        den = tl.sum(w, axis=0)
        o = tl.load(part_o_ptr + (base + offs_s)[:, None] * HEAD_DIM + offs_d[None, :],
                    mask=mask_s[:, None] & mask_d[None, :], other=0.0)         # [S, D]
        o = tl.sum(o * w[:, None], axis=0) / tl.where(den > 0.0, den, 1.0)
        tl.store(out_ptr + seq * stride_os + head * stride_oh + offs_d,
                 o.to(out_ptr.dtype.element_ty), mask=mask_d)


def paged_decode_attention_triton(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
    max_context_len: int | None = None, num_splits: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    assert num_heads % num_kv_heads == 0 and head_dim >= 16
    group = num_heads // num_kv_heads
    if max_context_len is None:  # an upper bound without a device sync
        max_context_len = block_tables.shape[1] * block_size
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_context_len, num_sms(q.device))
    if out is None:
        out = torch.empty_like(q)
    if num_seqs == 0:
        return out
    head_dim_p2 = next_power_of_2(head_dim)
    if num_splits > 1:
        part_o = torch.empty((num_seqs, num_heads, num_splits, head_dim),
                             dtype=torch.float32, device=q.device)
        part_lse = torch.empty((num_seqs, num_heads, num_splits), dtype=torch.float32,
                               device=q.device)
    else:
        part_o = part_lse = out  # unused
    _decode_partial_kernel[(num_seqs, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, out, part_o, part_lse,
        scale * _LOG2E, num_splits,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        NUM_HEADS=num_heads, GROUP=group, GROUP_P2=max(16, next_power_of_2(group)),
        HEAD_DIM=head_dim, HEAD_DIM_P2=head_dim_p2,
        BLOCK_SIZE=block_size, BLOCK_N=BLOCK_N, SINGLE_SPLIT=num_splits == 1,
        IEEE_DOT=q.dtype == torch.float32,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    if num_splits > 1:
        _decode_reduce_kernel[(num_seqs, num_heads)](
            part_o, part_lse, out, out.stride(0), out.stride(1), num_splits,
            NUM_HEADS=num_heads, HEAD_DIM=head_dim, HEAD_DIM_P2=head_dim_p2,
            SPLITS_P2=next_power_of_2(num_splits),
            num_warps=4,
        )
    return out


def paged_decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float | None = None,
    max_context_len: int | None = None, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention over the paged cache -> [num_seqs, num_heads, head_dim] in q's dtype.

    `max_context_len` (host int, optional) bounds the context for split sizing; without it the
    block-table width is used, so no device sync happens either way. `out` (optional) receives
    the result (a static buffer under CUDA graphs).
    """
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if use_triton(q):
        return paged_decode_attention_triton(q, k_cache, v_cache, block_tables, context_lens,
                                             scale, max_context_len, out=out)
    ref = paged_decode_attention_reference(q, k_cache, v_cache, block_tables, context_lens, scale)
    if out is None:
        return ref
    out.copy_(ref)
    return out
