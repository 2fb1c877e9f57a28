"""Rotary embedding (neox / LLaMA rotate-half) applied in place to q and k, fused with the write
of k and v into their KV pages.

    q [num_tokens, num_heads, head_dim], k/v [num_tokens, num_kv_heads, head_dim]
        (strided views of the fused qkv projection output are fine; the last dim is contiguous)
    positions    int64 [num_tokens]
    cos, sin     fp32 [max_positions, head_dim // 2]       (build_rope_cache)
    slot_mapping int64 [num_tokens]   slot = block * block_size + offset; < 0 -> not written
    k_cache/v_cache [num_blocks, block_size, num_kv_heads, head_dim]

Rotate-half, per head, with x = [x1 | x2] split at head_dim // 2 and angle pos * inv_freq[i]:

    out1 = x1 * cos - x2 * sin
    out2 = x2 * cos + x1 * sin          (fp32 math, one rounding to the model dtype)

Triton: one program per token does all q heads, all k heads (rotated, then stored both in place
and into the page), and copies v into its page: q/k/v are read once and written once.
"""
from __future__ import annotations

import torch

from backend.kernels.triton_utils import HAS_TRITON, next_power_of_2, tl, triton, use_triton


def build_rope_cache(max_positions: int, head_dim: int, base: float,
                     scaling_factor: float = 1.0, device: torch.device | str | None = None,
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin fp32 [max_positions, head_dim // 2]; linear scaling divides the position."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    pos = torch.arange(max_positions, dtype=torch.float64) / scaling_factor
    angles = torch.outer(pos, inv_freq)                       # [max_positions, head_dim // 2]
    return (angles.cos().to(torch.float32).to(device),
            angles.sin().to(torch.float32).to(device))


def apply_rotary_reference(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                           sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotary on x [num_tokens, heads, head_dim]; returns a new tensor."""
    half = x.shape[-1] // 2
    acc_dtype = torch.promote_types(x.dtype, torch.float32)
    c = cos[positions].to(acc_dtype)[:, None, :]               # [num_tokens, 1, half]
    s = sin[positions].to(acc_dtype)[:, None, :]
    x1, x2 = x[..., :half].to(acc_dtype), x[..., half:].to(acc_dtype)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


def write_kv_reference(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                       v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """k/v rows -> their slots in the pages; rows whose slot is negative are skipped."""
    block_size = k_cache.shape[1]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, offsets] = k[valid].to(k_cache.dtype)
    v_cache[blocks, offsets] = v[valid].to(v_cache.dtype)


def rotary_kv_write_reference(positions, q, k, v, cos, sin, k_cache, v_cache, slot_mapping) -> None:
    q.copy_(apply_rotary_reference(q, positions, cos, sin))
    k.copy_(apply_rotary_reference(k, positions, cos, sin))
    write_kv_reference(k, v, k_cache, v_cache, slot_mapping)


if HAS_TRITON:

    @triton.jit
    def _rotate_half_in_place(base_ptr, stride_h, heads, half_offs, cos, sin,
                              NUM: tl.constexpr, HALF: tl.constexpr):
        mask = (heads < NUM)[:, None] & (half_offs < HALF)[None, :]
        ptr = base_ptr + heads[:, None] * stride_h + half_offs[None, :]
        x1 = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(ptr + HALF, mask=mask, other=0.0).to(tl.float32)
        o1 = (x1 * cos - x2 * sin).to(base_ptr.dtype.element_ty)
        o2 = (x2 * cos + x1 * sin).to(base_ptr.dtype.element_ty)
        tl.store(ptr, o1, mask=mask)
        tl.store(ptr + HALF, o2, mask=mask)
        return o1, o2

    @triton.jit
    def _rotary_kv_kernel(
        positions_ptr, q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
        stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_cos,
        stride_kcb, stride_kct, stride_kch, stride_vcb, stride_vct, stride_vch,
        NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
        HEADS_P2: tl.constexpr, KV_HEADS_P2: tl.constexpr,
        HALF: tl.constexpr, HALF_P2: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    ):
        t = tl.program_id(0).to(tl.int64)
        pos = tl.load(positions_ptr + t).to(tl.int64)
        r = tl.arange(0, HALF_P2)
        cos = tl.load(cos_ptr + pos * stride_cos + r, mask=r < HALF, other=0.0)[None, :]
        sin = tl.load(sin_ptr + pos * stride_cos + r, mask=r < HALF, other=0.0)[None, :]

        heads = tl.arange(0, HEADS_P2)
        _rotate_half_in_place(q_ptr + t * stride_qt, stride_qh, heads, r, cos, sin,
                              NUM_HEADS, HALF)
        kv_heads = tl.arange(0, KV_HEADS_P2)
        k1, k2 = _rotate_half_in_place(k_ptr + t * stride_kt, stride_kh, kv_heads, r, cos, sin,
                                       NUM_KV_HEADS, HALF)

        slot = tl.load(slot_ptr + t).to(tl.int64)
        if slot >= 0:
            block = slot // BLOCK_SIZE
            offset = slot % BLOCK_SIZE
            mask = (kv_heads < NUM_KV_HEADS)[:, None] & (r < HALF)[None, :]
            kc = (k_cache_ptr + block * stride_kcb + offset * stride_kct
                  + kv_heads[:, None] * stride_kch + r[None, :])
            tl.store(kc, k1.to(k_cache_ptr.dtype.element_ty), mask=mask)
            tl.store(kc + HALF, k2.to(k_cache_ptr.dtype.element_ty), mask=mask)
            vp = v_ptr + t * stride_vt + kv_heads[:, None] * stride_vh + r[None, :]
            v1 = tl.load(vp, mask=mask, other=0.0)
            v2 = tl.load(vp + HALF, mask=mask, other=0.0)
            vc = (v_cache_ptr + block * stride_vcb + offset * stride_vct
                  + kv_heads[:, None] * stride_vch + r[None, :])
            tl.store(vc, v1.to(v_cache_ptr.dtype.element_ty), mask=mask)
            tl.store(vc + HALF, v2.to(v_cache_ptr.dtype.element_ty), mask=mask)


def rotary_kv_write(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Rotate q and k in place and store k, v into the pages at slot_mapping (one launch)."""
    if not use_triton(q):
        rotary_kv_write_reference(positions, q, k, v, cos, sin, k_cache, v_cache, slot_mapping)
        return
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    assert head_dim % 2 == 0 and q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    assert cos.stride() == sin.stride() and cos.stride(-1) == 1
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    if num_tokens == 0:
        return
    half = head_dim // 2
    _rotary_kv_kernel[(num_tokens,)](
        positions, q, k, v, cos, sin, k_cache, v_cache, slot_mapping,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        cos.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads,
        HEADS_P2=next_power_of_2(num_heads), KV_HEADS_P2=next_power_of_2(num_kv_heads),
        HALF=half, HALF_P2=next_power_of_2(half), BLOCK_SIZE=k_cache.shape[1],
        num_warps=4,
    )
