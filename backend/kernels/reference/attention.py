"""Paged attention, torch reference. The oracle for `backend/kernels/` and the CPU path.

Three functions with kernel-shaped signatures (a Triton kernel replaces each one 1:1):

    write_kv(k, v, k_cache, v_cache, slot_mapping)
        k, v:      [num_tokens, num_kv_heads, head_dim]
        k_cache:   [num_blocks, block_size, num_kv_heads, head_dim] (written in place)
        slot_mapping: [num_tokens] int64, -1 = skip (padding)

    prefill_attention(q, k_cache, v_cache, block_tables, query_start_loc_host,
                      context_lens_host, scale) -> [num_prefill_tokens, num_heads, head_dim]
        q: [num_prefill_tokens, num_heads, head_dim], packed sequences, no padding.
        Sequence i's queries are the last `query_len_i` tokens of its `context_lens_host[i]`
        tokens of context (cached prefix | this chunk); causal within the context.

    decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale)
        -> [num_decodes, num_heads, head_dim]
        q: [num_decodes, num_heads, head_dim], one query token per sequence, attending to its
        whole context (device tensors only: no host sync, so it can be captured in a CUDA graph).

K/V are written before attention reads, so a sequence's new tokens attend to themselves.
GQA: query head h reads KV head h // (num_heads // num_kv_heads).

A cache may instead be a quantized pool (`backend.kv.formats.QuantizedPages`, `--kv-cache-dtype
fp8|int4-fp8`) with the same logical shape: `write_kv` quantizes into it and the attention
functions dequantize (to fp32) only the pages they read (`read_pages`). An int4 key pool with a
fill buffer (`backend.kv.fill_slots`) also takes each step's last-block keys at full precision
(`write_kv(..., fill_index)`) and the attention functions read a sequence's positions >= its
`fill_lo` from there (`fill_slot`, `fill_lo`: per sequence, as in `backend.kernels.forward_context`).
"""
from __future__ import annotations

import torch

from backend.kernels.forward_context import ForwardContext


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, fill_index: torch.Tensor | None = None) -> None:
    num_blocks, block_size = k_cache.shape[:2]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    if not isinstance(k_cache, torch.Tensor):  # quantized pools: quantize on write
        k_cache.write(slots, k[: slot_mapping.shape[0]][valid])
        v_cache.write(slots, v[: slot_mapping.shape[0]][valid])
        if fill_index is not None and getattr(k_cache, "fill", None) is not None:
            rows = fill_index[: slot_mapping.shape[0]]
            keep = rows >= 0
            k_cache.write_fill(rows[keep], k[: slot_mapping.shape[0]][keep])
        return
    k_flat = k_cache.view(num_blocks * block_size, *k_cache.shape[2:])
    v_flat = v_cache.view(num_blocks * block_size, *v_cache.shape[2:])
    k_flat.index_copy_(0, slots, k[: slot_mapping.shape[0]][valid].to(k_cache.dtype))
    v_flat.index_copy_(0, slots, v[: slot_mapping.shape[0]][valid].to(v_cache.dtype))


def read_pages(cache, block_ids: torch.Tensor) -> torch.Tensor:
    """Blocks `block_ids` (long, any shape) of a pool: [*block_ids.shape, block_size, Hkv, D].
    A quantized pool dequantizes them here, inside attention (fp32)."""
    if isinstance(cache, torch.Tensor):
        return cache[block_ids]
    return cache.pages(block_ids)


def _gather_context(cache: torch.Tensor, block_table: torch.Tensor, context_len: int,
                    fill_slot: int = -1, fill_lo: int = 0) -> torch.Tensor:
    """[context_len, num_kv_heads, head_dim] of one sequence, read through its block table;
    positions fill_lo .. context_len - 1 from fill slot `fill_slot` when it is >= 0."""
    block_size = cache.shape[1]
    num_blocks = -(-context_len // block_size)
    pages = read_pages(cache, block_table[:num_blocks].long())  # [nb, bs, Hkv, D]
    k = pages.reshape(-1, *cache.shape[2:])[:context_len]
    if fill_slot >= 0 and fill_lo < context_len:
        offsets = torch.arange(fill_lo, context_len, device=k.device) % block_size
        k = k.clone()
        k[fill_lo:] = cache.fill[fill_slot, offsets].to(k.dtype)
    return k


def _fill_args(cache, fill_slot: torch.Tensor | None, fill_lo: torch.Tensor | None):
    """Host lists of the fill slots / first fill positions, or None where nothing is filled."""
    if fill_slot is None or getattr(cache, "fill", None) is None:
        return None
    return fill_slot.tolist(), fill_lo.tolist()


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      block_tables: torch.Tensor, query_start_loc_host: list[int],
                      context_lens_host: list[int], scale: float,
                      fill_slot: torch.Tensor | None = None,
                      fill_lo: torch.Tensor | None = None) -> torch.Tensor:
    num_heads = q.shape[1]
    out = torch.empty_like(q)
    fill = _fill_args(k_cache, fill_slot, fill_lo)
    for i, context_len in enumerate(context_lens_host):
        start, end = query_start_loc_host[i], query_start_loc_host[i + 1]
        query_len = end - start
        slot_lo = (fill[0][i], fill[1][i]) if fill is not None else ()
        k = _gather_context(k_cache, block_tables[i], context_len, *slot_lo)  # [C, Hkv, D]
        v = _gather_context(v_cache, block_tables[i], context_len)
        rep = num_heads // k.shape[1]
        k = k.repeat_interleave(rep, dim=1).transpose(0, 1).to(q.dtype)  # [H, C, D]
        v = v.repeat_interleave(rep, dim=1).transpose(0, 1).to(q.dtype)
        qi = q[start:end].transpose(0, 1)  # [H, Q, D]
        scores = torch.matmul(qi.float(), k.float().transpose(1, 2)) * scale  # [H, Q, C]
        # query j sits at position context_len - query_len + j; it sees keys at <= that
        q_pos = torch.arange(context_len - query_len, context_len, device=q.device)
        k_pos = torch.arange(context_len, device=q.device)
        scores.masked_fill_(k_pos[None, :] > q_pos[:, None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[start:end] = torch.matmul(probs, v.float()).transpose(0, 1).to(q.dtype)
    return out


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                     fill_slot: torch.Tensor | None = None,
                     fill_lo: torch.Tensor | None = None) -> torch.Tensor:
    num_seqs, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    max_blocks = block_tables.shape[1]
    idx = block_tables.long()
    # [B, max_blocks * block_size, Hkv, D]: every page in the table, masked past context_len
    k = read_pages(k_cache, idx).reshape(num_seqs, max_blocks * block_size, num_kv_heads, head_dim)
    if fill_slot is not None and getattr(k_cache, "fill", None) is not None:
        # positions >= fill_lo (of a sequence with a slot) from its fill rows: only the block
        # holding fill_lo can have any, so only that block is rewritten; no host sync
        lo = fill_lo.long()
        first = lo // block_size * block_size
        pos = first[:, None] + torch.arange(block_size, device=q.device)        # [B, bs]
        use = (pos >= lo[:, None]) & (fill_slot[:, None] >= 0)
        pos = pos.clamp(max=max_blocks * block_size - 1)
        seq = torch.arange(num_seqs, device=q.device)[:, None]
        rows = k_cache.fill[fill_slot.long().clamp(min=0)].to(k.dtype)         # [B, bs, Hkv, D]
        k[seq, pos] = torch.where(use[:, :, None, None], rows, k[seq, pos])
    v = read_pages(v_cache, idx).reshape(num_seqs, max_blocks * block_size, num_kv_heads, head_dim)
    rep = num_heads // num_kv_heads
    qg = q.view(num_seqs, num_kv_heads, rep, head_dim).float()  # [B, Hkv, rep, D]
    scores = torch.einsum("bgrd,bcgd->bgrc", qg, k.float()) * scale  # [B, Hkv, rep, C]
    k_pos = torch.arange(max_blocks * block_size, device=q.device)
    mask = k_pos[None, :] >= context_lens[:, None].long()  # [B, C]
    scores = scores.masked_fill(mask[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("bgrc,bcgd->bgrd", probs, v.float())
    return out.reshape(num_seqs, num_heads, head_dim).to(q.dtype)


class TorchAttention:
    """Attention backend object injected into the model: paged write, then attention."""

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 k_cache: torch.Tensor, v_cache: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """q: [T, H, D], k/v: [T, Hkv, D] for all T tokens of the step (padding included).
        Returns [T, H, D]; rows of padding tokens are zeros."""
        write_kv(k, v, k_cache, v_cache, ctx.slot_mapping, ctx.fill_index)
        out = torch.zeros_like(q)
        d, p = ctx.num_decode_tokens, ctx.num_prefill_tokens
        fs, fl = ctx.fill_slot, ctx.fill_lo
        if d:
            out[:d] = decode_attention(q[:d], k_cache, v_cache, ctx.block_tables[:d],
                                       ctx.context_lens[:d], self.scale,
                                       *((fs[:d], fl[:d]) if fs is not None else ()))
        if p:
            n = ctx.num_prefills
            starts = [x - d for x in ctx.query_start_loc_host[d:d + n + 1]]
            out[d:d + p] = prefill_attention(
                q[d:d + p], k_cache, v_cache, ctx.block_tables[d:d + n], starts,
                ctx.context_lens_host[d:d + n], self.scale,
                *((fs[d:d + n], fl[d:d + n]) if fs is not None else ()))
        return out
