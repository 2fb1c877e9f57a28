"""Rotary embedding (neox / LLaMA rotate-half) applied in place to q and k, fused with the write
of k and v into their KV pages.

    q [num_tokens, num_heads, head_dim], k/v [num_tokens, num_kv_heads, head_dim]
        (strided views of the fused qkv projection output are fine; the last dim is contiguous)
    positions    int64 [num_tokens]
    cos, sin     fp32 [max_positions, head_dim // 2]       (build_rope_cache)
    slot_mapping int64 [num_tokens]   slot = block * block_size + offset; < 0 -> not written
    k_cache/v_cache [num_blocks, block_size, num_kv_heads, head_dim] pool tensors, or
                    `backend.kv.formats.QuantizedPages` (fp8 / int4): quantized on write, here

Rotate-half, per head, with x = [x1 | x2] split at head_dim // 2 and angle pos * inv_freq[i]:

    out1 = x1 * cos - x2 * sin
    out2 = x2 * cos + x1 * sin          (fp32 math, one rounding to the model dtype)

Triton: one program per token does all q heads, all k heads (rotated, then stored both in place
and into the page), and copies v into its page: q/k/v are read once and written once.

Quantized pages are encoded in the same program, from the registers that hold the rotated k
(rounded to the model dtype first, as the reference stores k before quantizing it) and v:
    fp8   per (token, kv head): scale = max(amax * (1/448), 1e-12), codes = x / scale in E4M3
    int4  per (token, kv head, G channels): scale = max(amax_G * (1/7), 1e-12), q = rint(x / scale)
          in [-7, 7], byte j = (q[2j+1] + 8) << 4 | (q[2j] + 8). Each rotary half splits into
          its even / odd channels (a reshape), so bytes and group scales come out per half.
          With fp16 scales (kv_quant.INT4_SCALE_DTYPE) the scale is rounded to fp16 first and
          the halves are read back from memory as [heads, groups, channels] tiles instead.
The formats are those of `backend.kv.formats` (the reference codecs this kernel is tested against).
An int4 key pool with fill rows (`QuantizedPages.fill`, `backend.kv.fill_slots`) also gets each
token's rotated key, in the model dtype, at row `fill_index[t]` when that is >= 0.
"""
from __future__ import annotations

import torch

from backend.kernels.triton_utils import (
    HAS_TRITON,
    next_power_of_2,
    pdl_args,
    pdl_enter,
    tl,
    triton,
    use_triton,
)
from backend.kv.formats import INV_FP8_MAX, INV_INT4_MAX, TINY_F16


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


def write_kv_reference(k: torch.Tensor, v: torch.Tensor, k_cache, v_cache,
                       slot_mapping: torch.Tensor, fill_index: torch.Tensor | None = None) -> None:
    """k/v rows -> their slots in the pages; rows whose slot is negative are skipped. Quantized
    pools encode with `backend.kv.formats` (through `backend.kernels.reference.attention.write_kv`), and an int4
    key pool with fill rows also stores the keys of rows whose `fill_index` is >= 0 there."""
    if not isinstance(k_cache, torch.Tensor):
        from backend.kernels.reference.attention import write_kv

        write_kv(k, v, k_cache, v_cache, slot_mapping, fill_index)
        return
    block_size = k_cache.shape[1]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, offsets] = k[valid].to(k_cache.dtype)
    v_cache[blocks, offsets] = v[valid].to(v_cache.dtype)


def rotary_kv_write_reference(positions, q, k, v, cos, sin, k_cache, v_cache, slot_mapping,
                              fill_index=None) -> None:
    q.copy_(apply_rotary_reference(q, positions, cos, sin))
    k.copy_(apply_rotary_reference(k, positions, cos, sin))
    write_kv_reference(k, v, k_cache, v_cache, slot_mapping, fill_index)


if HAS_TRITON:
    _INV_FP8 = tl.constexpr(INV_FP8_MAX)     # the codecs' reciprocals (fp32 in the kernel)
    _INV_INT4 = tl.constexpr(INV_INT4_MAX)
    _TINY_F16 = tl.constexpr(TINY_F16)       # the floor of fp16 int4 scales

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
    def _rint(x):
        """Round half to even (torch.round), for |x| < 2^20 (callers: |x| <= 16). Built on
        floor: the (x + 1.5 * 2^23) - 1.5 * 2^23 trick was folded to x by the compiler on the
        GPU (H200, Triton 3.6) though not by the interpreter."""
        r = tl.floor(x + 0.5)                      # exact: x has few enough fraction bits
        tie_odd = ((r - x) == 0.5) & ((r - 2.0 * tl.floor(r * 0.5)) != 0.0)
        return tl.where(tie_odd, r - 1.0, r)

    @triton.jit
    def _round_e4m3(x):
        """x fp32 rounded (half to even) onto the E4M3 grid, saturated at +-448: then the cast
        to float8 is exact. Done by hand because Triton's interpreter rounds a value that
        carries into the next binade wrong (-125.6 -> -64); on the GPU it matches the hardware
        conversion, for a few ALU operations per element of a memory-bound kernel."""
        exp = (x.to(tl.int32, bitcast=True) >> 23) & 0xFF       # biased fp32 exponent
        exp = tl.maximum(exp, 127 - 6)                          # E4M3 subnormals: ulp 2^-9
        ulp = ((exp - 3) << 23).to(tl.float32, bitcast=True)    # 3 mantissa bits
        inv_ulp = ((254 - (exp - 3)) << 23).to(tl.float32, bitcast=True)  # exact 1 / ulp
        return tl.clamp(_rint(x * inv_ulp) * ulp, -448.0, 448.0)

    @triton.jit
    def _store_fp8(x1, x2, data_ptr, scale_ptr, mask, heads, HALF: tl.constexpr):
        """x1 | x2 [heads, HALF] fp32 -> E4M3 codes at data_ptr (+ r, + HALF + r) and one scale
        per head at scale_ptr + heads (pointers already at this token's slot)."""
        amax = tl.maximum(tl.max(tl.abs(x1), axis=1), tl.max(tl.abs(x2), axis=1))
        # scale: amax * fp32(1/448) as backend.kv.formats; codes: a correctly rounded division
        # like torch's (Triton's `/` on fp32 is the approximate div.full)
        scale = tl.maximum(amax * _INV_FP8, 1.0e-12)
        c1 = _round_e4m3(tl.math.div_rn(x1, scale[:, None]))
        c2 = _round_e4m3(tl.math.div_rn(x2, scale[:, None]))
        tl.store(data_ptr, c1.to(data_ptr.dtype.element_ty), mask=mask)
        tl.store(data_ptr + HALF, c2.to(data_ptr.dtype.element_ty), mask=mask)
        return scale

    @triton.jit
    def _int4_half(x, scale, HEADS_P2: tl.constexpr, HALF: tl.constexpr, SUB: tl.constexpr):
        """One rotary half x [heads, HALF] fp32 with its group scales [heads, HALF // SUB] ->
        packed bytes [heads, HALF // 2] (low nibble: even channel)."""
        even, odd = tl.split(tl.reshape(x, (HEADS_P2, HALF // 2, 2)))
        s = scale[:, :, None]
        even = tl.reshape(even, (HEADS_P2, HALF // SUB, SUB // 2))
        odd = tl.reshape(odd, (HEADS_P2, HALF // SUB, SUB // 2))
        qe = tl.clamp(_rint(tl.math.div_rn(even, s)), -7.0, 7.0)
        qo = tl.clamp(_rint(tl.math.div_rn(odd, s)), -7.0, 7.0)
        lo = (qe + 8.0).to(tl.int32)
        hi = (qo + 8.0).to(tl.int32)
        return tl.reshape(lo | (hi << 4), (HEADS_P2, HALF // 2)).to(tl.uint8)

    @triton.jit
    def _int4_pack(even, odd, scale):
        """Even and odd channels [heads, n] fp32 with one scale per head [heads] -> packed bytes
        [heads, n] (low nibble: even channel)."""
        s = scale[:, None]
        qe = tl.clamp(_rint(tl.math.div_rn(even, s)), -7.0, 7.0)
        qo = tl.clamp(_rint(tl.math.div_rn(odd, s)), -7.0, 7.0)
        lo = (qe + 8.0).to(tl.int32)
        hi = (qo + 8.0).to(tl.int32)
        return (lo | (hi << 4)).to(tl.uint8)

    @triton.jit
    def _int4_groups_f16(kr, kc, ks, mask, TINY: tl.constexpr):
        """One rotary half of the fp16-scale layout: even channels at kr, odd at kr + 1 (both
        [heads, groups, channels-per-group // 2] pointers into the stored rotated keys), bytes
        to kc (same shape), one scale per group to ks ([heads, groups]). The scale is rounded
        to fp16 before the codes are computed, as `backend.kv.formats.quantize_int4`."""
        even = tl.load(kr, mask=mask, other=0.0).to(tl.float32)
        odd = tl.load(kr + 1, mask=mask, other=0.0).to(tl.float32)
        amax = tl.maximum(tl.max(tl.abs(even), axis=2), tl.max(tl.abs(odd), axis=2))
        scale = tl.maximum(amax * _INV_INT4, TINY).to(tl.float16).to(tl.float32)
        s = scale[:, :, None]
        qe = tl.clamp(_rint(tl.math.div_rn(even, s)), -7.0, 7.0)
        qo = tl.clamp(_rint(tl.math.div_rn(odd, s)), -7.0, 7.0)
        lo = (qe + 8.0).to(tl.int32)
        hi = (qo + 8.0).to(tl.int32)
        tl.store(kc, (lo | (hi << 4)).to(tl.uint8), mask=mask)
        tl.store(ks, scale.to(tl.float16), mask=tl.max(mask.to(tl.int32), axis=2) > 0)

    @triton.jit
    def _int4_scale_f16(kr, mask, TINY: tl.constexpr):
        """`_int4_groups_f16`'s scales alone -> [heads, groups] fp32 (for head_dim 16, whose one
        group spans both rotary halves)."""
        even = tl.load(kr, mask=mask, other=0.0).to(tl.float32)
        odd = tl.load(kr + 1, mask=mask, other=0.0).to(tl.float32)
        amax = tl.maximum(tl.max(tl.abs(even), axis=2), tl.max(tl.abs(odd), axis=2))
        return tl.maximum(amax * _INV_INT4, TINY).to(tl.float16).to(tl.float32)

    @triton.jit
    def _int4_pack_groups(kr, kc, mask, scale):
        """`_int4_groups_f16`'s bytes alone, with given scales [heads, groups]."""
        even = tl.load(kr, mask=mask, other=0.0).to(tl.float32)
        odd = tl.load(kr + 1, mask=mask, other=0.0).to(tl.float32)
        s = scale[:, :, None]
        qe = tl.clamp(_rint(tl.math.div_rn(even, s)), -7.0, 7.0)
        qo = tl.clamp(_rint(tl.math.div_rn(odd, s)), -7.0, 7.0)
        lo = (qe + 8.0).to(tl.int32)
        hi = (qo + 8.0).to(tl.int32)
        tl.store(kc, (lo | (hi << 4)).to(tl.uint8), mask=mask)

    @triton.jit
    def _int4_amax(x, HEADS_P2: tl.constexpr, HALF: tl.constexpr, SUB: tl.constexpr):
        """amax over each SUB consecutive channels of x [heads, HALF] -> [heads, HALF // SUB]."""
        return tl.max(tl.reshape(tl.abs(x), (HEADS_P2, HALF // SUB, SUB)), axis=2)

    @triton.jit
    def _rotary_kv_kernel(
        positions_ptr, q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, slot_ptr,
        kc_ptr, ks_ptr, vc_ptr, vs_ptr, fill_ptr, fill_index_ptr, stride_fr, stride_fh,
        stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_cos,
        stride_kcb, stride_kct, stride_kch, stride_ksb, stride_kst, stride_ksh,
        stride_vcb, stride_vct, stride_vch, stride_vsb, stride_vst, stride_vsh,
        NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
        HEADS_P2: tl.constexpr, KV_HEADS_P2: tl.constexpr,
        HALF: tl.constexpr, HALF_P2: tl.constexpr, BLOCK_SIZE: tl.constexpr,
        K_CODEC: tl.constexpr, V_CODEC: tl.constexpr, INT4_SUB: tl.constexpr,
        INT4_WHOLE_HEAD: tl.constexpr, USE_PDL: tl.constexpr,
        INT4_HALF_IS_GROUP: tl.constexpr = False, INT4_SCALE_F16: tl.constexpr = False,
        HAS_FILL: tl.constexpr = False,
    ):
        pdl_enter(USE_PDL)
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
        if HAS_FILL:  # the block being filled: the rotated key at full precision as well
            frow = tl.load(fill_index_ptr + t).to(tl.int64)
            if frow >= 0:
                fmask = (kv_heads < NUM_KV_HEADS)[:, None] & (r < HALF)[None, :]
                fp = fill_ptr + frow * stride_fr + kv_heads[:, None] * stride_fh + r[None, :]
                tl.store(fp, k1.to(fill_ptr.dtype.element_ty), mask=fmask)
                tl.store(fp + HALF, k2.to(fill_ptr.dtype.element_ty), mask=fmask)

        slot = tl.load(slot_ptr + t).to(tl.int64)
        if slot >= 0:
            block = slot // BLOCK_SIZE
            offset = slot % BLOCK_SIZE
            head_ok = kv_heads < NUM_KV_HEADS
            mask = head_ok[:, None] & (r < HALF)[None, :]
            # ---- keys ----
            kc = kc_ptr + block * stride_kcb + offset * stride_kct + kv_heads[:, None] * stride_kch
            ks = ks_ptr + block * stride_ksb + offset * stride_kst + kv_heads * stride_ksh
            if K_CODEC == 0:
                tl.store(kc + r[None, :], k1.to(kc_ptr.dtype.element_ty), mask=mask)
                tl.store(kc + HALF + r[None, :], k2.to(kc_ptr.dtype.element_ty), mask=mask)
            elif K_CODEC == 1:
                k_scale = _store_fp8(k1.to(tl.float32), k2.to(tl.float32), kc + r[None, :],
                                     ks, mask, kv_heads, HALF)
                tl.store(ks, k_scale, mask=head_ok)
            elif INT4_SCALE_F16:
                # int4 keys with fp16 group scales (kv_quant.INT4_SCALE_DTYPE): no reshape at
                # all, as below: the rotated keys just stored are read back as [heads, groups,
                # channels // 2] even / odd tiles straight from memory, per rotary half
                tl.debug_barrier()
                HG: tl.constexpr = INT4_SUB // 2           # a group's channels per nibble side
                NG: tl.constexpr = HALF // INT4_SUB        # groups per rotary half
                j3 = (tl.arange(0, NG)[None, :, None] * HG
                      + tl.arange(0, HG)[None, None, :])    # [1, NG, HG] byte index in a half
                m3 = head_ok[:, None, None] & (j3 < HALF // 2)
                kr3 = k_ptr + t * stride_kt + kv_heads[:, None, None] * stride_kh + 2 * j3
                kc3 = kc[:, :, None] + j3
                ks2 = ks[:, None] + tl.arange(0, NG)[None, :]
                if INT4_WHOLE_HEAD:  # head_dim 16: one group spans both halves
                    s = tl.maximum(_int4_scale_f16(kr3, m3, _TINY_F16),
                                   _int4_scale_f16(kr3 + HALF, m3, _TINY_F16))
                    tl.store(ks2, s.to(tl.float16), mask=head_ok[:, None])
                    _int4_pack_groups(kr3, kc3, m3, s)
                    _int4_pack_groups(kr3 + HALF, kc3 + HALF // 2, m3, s)
                else:   # (this form was checked on the H200)
                    _int4_groups_f16(kr3, kc3, ks2, m3, _TINY_F16)
                    _int4_groups_f16(kr3 + HALF, kc3 + HALF // 2, ks2 + NG, m3, _TINY_F16)
            elif INT4_HALF_IS_GROUP:
                # head_dim 64 with groups of 32 (tiny-coder). Both in-register forms (the
                # grouped [heads, groups] tiles, then one [heads] scale per half) wrote wrong
                # codes for some tokens' second head on the H200, differently run to run, while
                # Triton's interpreter agreed with the reference bit for bit; both pair even and
                # odd channels with reshape + split on a [2, 16, 2] tile, smaller than the
                # program's 128 threads (replicated layout). Here nothing is reshaped: the
                # rotated keys this program just stored are read back as even and odd channels
                # (a barrier makes the block's stores visible to all its threads first).
                tl.debug_barrier()
                j = tl.arange(0, HALF // 2)
                bmask = head_ok[:, None] & (j < HALF // 2)[None, :]
                kr = k_ptr + t * stride_kt + kv_heads[:, None] * stride_kh + 2 * j[None, :]
                ke1 = tl.load(kr, mask=bmask, other=0.0).to(tl.float32)
                ko1 = tl.load(kr + 1, mask=bmask, other=0.0).to(tl.float32)
                ke2 = tl.load(kr + HALF, mask=bmask, other=0.0).to(tl.float32)
                ko2 = tl.load(kr + HALF + 1, mask=bmask, other=0.0).to(tl.float32)
                hs1 = tl.maximum(tl.maximum(tl.max(tl.abs(ke1), axis=1),
                                            tl.max(tl.abs(ko1), axis=1)) * _INV_INT4, 1.0e-12)
                hs2 = tl.maximum(tl.maximum(tl.max(tl.abs(ke2), axis=1),
                                            tl.max(tl.abs(ko2), axis=1)) * _INV_INT4, 1.0e-12)
                tl.store(kc + j[None, :], _int4_pack(ke1, ko1, hs1), mask=bmask)
                tl.store(kc + HALF // 2 + j[None, :], _int4_pack(ke2, ko2, hs2), mask=bmask)
                tl.store(ks, hs1, mask=head_ok)
                tl.store(ks + 1, hs2, mask=head_ok)
            else:
                k1f = k1.to(tl.float32)
                k2f = k2.to(tl.float32)
                a1 = _int4_amax(k1f, KV_HEADS_P2, HALF, INT4_SUB)     # [heads, HALF // SUB]
                a2 = _int4_amax(k2f, KV_HEADS_P2, HALF, INT4_SUB)
                if INT4_WHOLE_HEAD:  # one group spans both halves (head_dim <= 32)
                    a1 = tl.maximum(a1, a2)
                    a2 = a1
                s1 = tl.maximum(a1 * _INV_INT4, 1.0e-12)
                s2 = tl.maximum(a2 * _INV_INT4, 1.0e-12)
                j = tl.arange(0, HALF // 2)
                bmask = head_ok[:, None] & (j < HALF // 2)[None, :]
                tl.store(kc + j[None, :], _int4_half(k1f, s1, KV_HEADS_P2, HALF, INT4_SUB),
                         mask=bmask)
                tl.store(kc + HALF // 2 + j[None, :],
                         _int4_half(k2f, s2, KV_HEADS_P2, HALF, INT4_SUB), mask=bmask)
                gs = tl.arange(0, HALF // INT4_SUB)
                smask = head_ok[:, None] & (gs < HALF // INT4_SUB)[None, :]
                if INT4_WHOLE_HEAD:
                    tl.store(ks[:, None] + gs[None, :], s1, mask=smask)
                else:
                    tl.store(ks[:, None] + gs[None, :], s1, mask=smask)
                    tl.store(ks[:, None] + HALF // INT4_SUB + gs[None, :], s2, mask=smask)
            # ---- values ----
            vp = v_ptr + t * stride_vt + kv_heads[:, None] * stride_vh + r[None, :]
            v1 = tl.load(vp, mask=mask, other=0.0)
            v2 = tl.load(vp + HALF, mask=mask, other=0.0)
            vc = (vc_ptr + block * stride_vcb + offset * stride_vct
                  + kv_heads[:, None] * stride_vch + r[None, :])
            if V_CODEC == 0:
                tl.store(vc, v1.to(vc_ptr.dtype.element_ty), mask=mask)
                tl.store(vc + HALF, v2.to(vc_ptr.dtype.element_ty), mask=mask)
            else:
                vs = vs_ptr + block * stride_vsb + offset * stride_vst + kv_heads * stride_vsh
                v_scale = _store_fp8(v1.to(tl.float32), v2.to(tl.float32), vc, vs, mask,
                                     kv_heads, HALF)
                tl.store(vs, v_scale, mask=head_ok)


def _pool_parts(cache) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """(codes, scales or None, codec id: 0 model dtype, 1 fp8, 2 int4) of a KV pool."""
    if isinstance(cache, torch.Tensor):
        return cache, None, 0
    return cache.data, cache.scale, {"fp8": 1, "int4": 2}[cache.codec]


def _strides3(t: torch.Tensor | None) -> tuple[int, int, int]:
    return (0, 0, 0) if t is None else (t.stride(0), t.stride(1), t.stride(2))


def rotary_kv_write(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    cos: torch.Tensor, sin: torch.Tensor, k_cache, v_cache,
                    slot_mapping: torch.Tensor, fill_index: torch.Tensor | None = None) -> None:
    """Rotate q and k in place and store k, v into the pages at slot_mapping (one launch);
    quantized pools (`QuantizedPages`) are encoded in the same launch. `fill_index` (int64 per
    token, -1 = none): an int4 key pool's fill rows also take those tokens' rotated keys."""
    if not use_triton(q):
        rotary_kv_write_reference(positions, q, k, v, cos, sin, k_cache, v_cache, slot_mapping,
                                  fill_index)
        return
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    kc, ks, k_codec = _pool_parts(k_cache)
    vc, vs, v_codec = _pool_parts(v_cache)
    assert head_dim % 2 == 0 and q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    assert cos.stride() == sin.stride() and cos.stride(-1) == 1
    assert kc.stride(-1) == 1 and vc.stride(-1) == 1 and v_codec != 2
    if num_tokens == 0:
        return
    fill = getattr(k_cache, "fill", None) if fill_index is not None else None
    if fill is not None:
        assert fill.is_contiguous() and fill_index.dtype == torch.int64
    half = head_dim // 2
    int4_sub, whole_head, scale_f16 = 2, False, False
    if k_codec == 2:
        group = 2 * kc.shape[-1] // ks.shape[-1]          # channels per int4 scale
        if next_power_of_2(head_dim) != head_dim or (group != head_dim and half % group):
            raise ValueError(f"int4 keys in the Triton write need a power-of-2 head_dim whose "
                             f"halves hold whole groups (head_dim {head_dim}, group {group})")
        whole_head = group == head_dim
        int4_sub = min(group, half)
        scale_f16 = ks.dtype == torch.float16
        if scale_f16 and int4_sub < 4:
            raise ValueError(f"int4 keys with fp16 scales in the Triton write need >= 4 "
                             f"channels per group and rotary half (head_dim {head_dim})")
    _rotary_kv_kernel[(num_tokens,)](
        positions, q, k, v, cos, sin, slot_mapping,
        kc, kc if ks is None else ks, vc, vc if vs is None else vs,
        kc if fill is None else fill, slot_mapping if fill is None else fill_index,
        0 if fill is None else fill.stride(1), 0 if fill is None else fill.stride(2),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        cos.stride(0),
        kc.stride(0), kc.stride(1), kc.stride(2), *_strides3(ks),
        vc.stride(0), vc.stride(1), vc.stride(2), *_strides3(vs),
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads,
        HEADS_P2=next_power_of_2(num_heads), KV_HEADS_P2=next_power_of_2(num_kv_heads),
        HALF=half, HALF_P2=next_power_of_2(half), BLOCK_SIZE=kc.shape[1],
        K_CODEC=k_codec, V_CODEC=v_codec, INT4_SUB=int4_sub, INT4_WHOLE_HEAD=whole_head,
        INT4_HALF_IS_GROUP=k_codec == 2 and not whole_head and int4_sub == half,
        INT4_SCALE_F16=scale_f16, HAS_FILL=fill is not None,
        num_warps=4, **pdl_args(q),
    )
