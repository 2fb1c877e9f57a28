"""Paged attention for one whole step: prefill chunks and decodes together, in one launch, over
bf16 / fp8 / int4-fp8 KV pages. GQA; causal within a chunk against its cached prefix.

Layout (backend.kernels.forward_context / backend.kv.pools / backend.kv.formats):

    q               [num_tokens, num_heads, head_dim]     query head h reads kv head h // group
    query_start_loc int32 [num_seqs + 1]   sequence i's query tokens: qsl[i] .. qsl[i+1]
    context_lens    int32 [num_seqs]       tokens of context after this step (cached + new)
    block_tables    int32 [num_seqs, W]    logical block j of sequence i -> physical block
    k_cache/v_cache a pool tensor [num_blocks, block_size, num_kv_heads, head_dim] (model dtype)
                    or a `QuantizedPages` with that logical shape:
                      fp8   data fp8 [.., head_dim],        scale fp32 [nb, bs, Hkv]
                      int4  data uint8 [.., head_dim // 2], scale fp32 [nb, bs, Hkv, head_dim // G]

A sequence's new tokens are the last `q_len` of its context: query token j sits at position
`ctx - q_len + j` and sees keys `<=` that position (a decode is q_len = 1: the whole context).
Every query token must belong to a sequence (qsl[num_seqs] == num_tokens); a sequence of
context 0 gets zero rows (the graph path puts its padding tokens in such a sequence).

Triton plan (one partial launch, plus a merge launch when the context is split):

    grid (q_blocks, num_kv_heads, num_splits). A program serves BLOCK_Q query tokens of ONE
    sequence times all `group` query heads of one KV head: an M = BLOCK_Q * GROUP_P2 row tile,

        row r -> token tok0 + r // GROUP_P2, query head kv_head * group + r % GROUP_P2

    so each K/V tile read from the pages serves every query head that shares it. Sequence i
    owns the q-blocks starting at qsl[i] // BLOCK_Q + i (strictly increasing in i, so a binary
    search maps a program to its sequence); q_blocks = num_tokens // BLOCK_Q + num_seqs bounds
    the total from host shapes alone, and programs past a sequence's tokens exit at once.
    Decode-only steps use BLOCK_Q = 1 (a program is a sequence; no search).

    The program's keys [0, kv_end) (kv_end: the last token of the block's causal horizon) are
    cut into num_splits slices of whole BLOCK_N tiles; each tile gathers its rows page by page
    through the block table, dequantizes in registers, and runs an online softmax in fp32
    (log2 domain). One split writes the output directly; several write (o, lse) partials that
    the merge kernel combines per (token, head).

Dequantization costs nothing extra in the inner products where the scale factors out:
    fp8 K  (per-token scale s_t):    q . (c_t s_t)      = (q . c_t) s_t     -> scale the score column
    fp8 V  (per-token scale s_t):    sum_t p_t c_t s_t  = sum_t (p_t s_t) c_t -> scale p's column
    int4 K (per-32-channel scales):  codes * scale in registers (the tile's [N, groups] scales
        loaded once, widened in registers); the even and odd channels of a byte are two dots
        of head_dim / 2 each against q's even / odd channels (no interleave).
An E4M3 code converts to bf16 exactly, so the fp8 dots run on bf16 tensor cores.

num_splits and q_blocks depend only on host values (shapes and host bounds), never on device
data, so a launch is CUDA-graph safe for any contents of the metadata tensors.
"""
from __future__ import annotations

import math
import os

import torch

from backend.kernels.triton_utils import (
    HAS_TRITON,
    cdiv,
    next_power_of_2,
    num_sms,
    pdl_args,
    pdl_enter,
    tl,
    triton,
    triton_interpreting,
    use_triton,
)

# Split-K sizing. A decode takes as many context splits as put its programs in ONE wave of
# resident programs: DECODE_RESIDENT_PER_SM per SM over bf16 pages (64-token tiles, 2 stages),
# QUANT_DECODE_RESIDENT_PER_SM over quantized pages (128-token tiles, 3 stages). Measured on the
# H200 (33B heads, NOTES.md "Split policy"): a second, partial wave cost 10-35% (fp8 at 8 x 8k:
# 5 splits = 320 programs 100.6 us, 4 splits = 256 programs 75.1 us; bf16: 5 splits 89.9, 8
# splits 82.8). Mixed steps keep the earlier rule (at least PROGRAMS_PER_SM programs per SM;
# not re-measured). Every split keeps >= MIN_TOKENS_PER_SPLIT tokens (fewer makes the merge
# traffic dominate), and splits the longest context leaves empty are dropped (33 splits of 8k
# at 128-token tiles: 32 real ones and a merge over 64 slots; int4 23.2 us, 32 splits 21.5).
PROGRAMS_PER_SM = 2
DECODE_RESIDENT_PER_SM = 4
QUANT_DECODE_RESIDENT_PER_SM = 2
# Register cap for quantized decode (`quant_decode_plan`). The program takes 196 registers (233
# with fill rows) at 4 warps in an offline sm_90 compile (bench/kernels/triton_compile.py): two
# programs per SM by registers alone. Capped at 168 (Triton's maxnreg; 120-520 B of spills) three
# fit. H200, 33B heads, int4-fp8 + fill rows (BENCHMARKS, issue 12 "Sixth session"): the third
# program pays where it buys more splits (batch 8: 6 splits instead of 4, 4.5-6% faster at 2k,
# 8k and 16k) and costs where the split count stays (batch 1: +4%; batch 64, one split:
# +6-8%). So a decode of >= QUANT_DECODE_CAP_MIN_PROGRAMS programs is capped when the cap raises
# its split count. TIDEGATE_QUANT_DECODE_MAXNREG (A/B): 0 = never cap, N = always cap at N.
QUANT_DECODE_CAP_REGS = 168
QUANT_DECODE_CAP_MIN_PROGRAMS = 64     # batch 8 of the 33B; batch 1 (8 programs) was slower
_maxnreg_env = os.environ.get("TIDEGATE_QUANT_DECODE_MAXNREG")
QUANT_DECODE_MAXNREG = None if _maxnreg_env is None else (int(_maxnreg_env) or 0)
# TIDEGATE_MIN_TOKENS_PER_SPLIT (A/B, read at import): a small model's batch-1 decode at a
# short context pays a merge launch per layer for its splits (1.3B, H200, 512 tokens: 4 splits,
# merge 7.1 us of a 14.6 us attention; issue 32)
MIN_TOKENS_PER_SPLIT = int(os.environ.get("TIDEGATE_MIN_TOKENS_PER_SPLIT", "128"))
MAX_SPLITS = 64
BLOCK_N = 64            # context tokens per inner tile
PREFILL_ROWS = 64       # M rows of a program when the step has prefill chunks
# Tile settings from the H200 sweep (NOTES.md): 4 warps beat 8 everywhere though an sm_90
# compile shows them at 255 registers with some stack; quantized pages prefer 128-token tiles
# (more bytes in flight per program: a tile of fp8 codes is half a bf16 tile).
DECODE_WARPS = 4
PREFILL_WARPS = 4
QUANT_BLOCK_N, QUANT_NUM_STAGES = 128, 3   # decode tiling over fp8 / int4-fp8 pages
# fp8 / int4-fp8 pages: dequantize to fp16 and run fp16 dots (E4M3 -> f16 is one cvt per pair
# on sm_90, an int4 nibble two integer/half ops; bf16 needs a detour through f32). The codes are
# exact in fp16; q (bf16 -> fp16) and p (fp32 -> fp16) lose nothing bf16 would keep, except that
# q is clamped to fp16's range. TIDEGATE_QUANT_DOTS=bf16 keeps the bf16 dots (A/B).
QUANT_DOT_F16 = os.environ.get("TIDEGATE_QUANT_DOTS", "f16") != "bf16"
MERGE_TILE = 8192     # fp32 elements of one merge program's [heads, splits, head_dim] tile
NUM_STAGES = 2
_LOG2E = 1.4426950408889634

CODEC_NATIVE, CODEC_FP8, CODEC_INT4 = 0, 1, 2
_CODEC_IDS = {"fp8": CODEC_FP8, "int4": CODEC_INT4}


# ---- torch reference (the oracle) ------------------------------------------------------------

def paged_attention_reference(
    q: torch.Tensor, k_cache, v_cache, block_tables: torch.Tensor,
    query_start_loc: torch.Tensor, context_lens: torch.Tensor, scale: float,
    fill_slot: torch.Tensor | None = None, fill_lo: torch.Tensor | None = None,
) -> torch.Tensor:
    """`backend.kernels.reference.attention.prefill_attention` over every sequence (a decode is a one-token
    chunk); quantized pools are dequantized by their `pages`, fill rows read where given.
    fp32 math, q's dtype out."""
    from backend.kernels.reference.attention import prefill_attention

    return prefill_attention(q, k_cache, v_cache, block_tables, query_start_loc.tolist(),
                             context_lens.tolist(), scale, fill_slot, fill_lo)


# ---- host-side sizing ------------------------------------------------------------------------

def choose_block_q(max_query_len: int, group: int) -> int:
    """Query tokens per program: 1 for decode-only steps (the row tile is the group, padded to
    16), else enough tokens to make PREFILL_ROWS rows of the tile."""
    if max_query_len <= 1:
        return 1
    return max(1, PREFILL_ROWS // next_power_of_2(group))


def choose_num_splits(num_programs: int, max_context_len: int, sm_count: int = 132,
                      resident_per_sm: int | None = None, block_n: int = BLOCK_N) -> int:
    """Context splits of a launch of `num_programs` programs per split (see "Split-K sizing").

    `resident_per_sm` None (mixed steps): num_programs * splits >= PROGRAMS_PER_SM * sm_count.
    Else (decodes): the most splits with num_programs * splits <= resident_per_sm * sm_count.
    Both capped so each split keeps >= MIN_TOKENS_PER_SPLIT tokens of the longest context, at
    MAX_SPLITS, and to the splits that get at least one `block_n` tile of that context."""
    programs = max(1, num_programs)
    context = max(1, max_context_len)
    if resident_per_sm is None:
        wanted = cdiv(PROGRAMS_PER_SM * sm_count, programs)
    else:
        wanted = resident_per_sm * sm_count // programs
    splits = max(1, min(wanted, cdiv(context, MIN_TOKENS_PER_SPLIT), MAX_SPLITS))
    per_split = cdiv(cdiv(context, splits), block_n) * block_n   # as the kernel cuts it
    return cdiv(context, per_split)


def quant_decode_plan(num_programs: int, max_context_len: int, sm_count: int = 132,
                      block_n: int = QUANT_BLOCK_N, int4_keys: bool = True,
                      ) -> tuple[int, int | None]:
    """(context splits, register cap or None) of a decode over quantized pages with
    `num_programs` programs per split (sequences x kv heads); see QUANT_DECODE_CAP_REGS. Only
    int4 keys are capped by default (fp8 pages were not measured capped)."""
    def splits(regs: int | None) -> int:
        resident = QUANT_DECODE_RESIDENT_PER_SM if regs is None else 65536 // (regs * 128)
        return choose_num_splits(num_programs, max_context_len, sm_count, resident, block_n)

    if QUANT_DECODE_MAXNREG is not None:   # forced (A/B): 0 never caps
        cap = QUANT_DECODE_MAXNREG or None
        return splits(cap), cap
    base = splits(None)
    if int4_keys and num_programs >= QUANT_DECODE_CAP_MIN_PROGRAMS:
        capped = splits(QUANT_DECODE_CAP_REGS)
        if capped > base:
            return capped, QUANT_DECODE_CAP_REGS
    return base, None


def _pool_parts(cache) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """(codes tensor, scales or None, codec id) of a pool tensor or a `QuantizedPages`."""
    if isinstance(cache, torch.Tensor):
        return cache, None, CODEC_NATIVE
    return cache.data, cache.scale, _CODEC_IDS[cache.codec]


def _strides3(t: torch.Tensor | None) -> tuple[int, int, int]:
    return (0, 0, 0) if t is None else (t.stride(0), t.stride(1), t.stride(2))


if HAS_TRITON:

    @triton.jit
    def _attend_tile(s, m_i, l_i, acc, v_ptr, vs_ptr, page, row_in_page, kv_head, mask_n,
                     offs_d, mask_d, stride_vb, stride_vt, stride_vh, stride_vsb, stride_vst,
                     stride_vsh, V_CODEC: tl.constexpr, FP32_DOT: tl.constexpr,
                     V_DOT_DTYPE: tl.constexpr):
        """One tile's online-softmax update: scores s [M, N] (log2 domain, -inf where not
        visible) and the tile's values read from the pages -> the new (m_i, l_i, acc)."""
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v_rows = v_ptr + page * stride_vb + row_in_page * stride_vt + kv_head * stride_vh
        v = tl.load(v_rows[:, None] + offs_d[None, :],
                    mask=mask_n[:, None] & mask_d[None, :], other=0.0)           # [N, D]
        if V_CODEC == 1:
            v_scale = tl.load(vs_ptr + page * stride_vsb + row_in_page * stride_vst
                              + kv_head * stride_vsh, mask=mask_n, other=0.0)
            pv = p * v_scale[None, :]
        else:
            pv = p
        if FP32_DOT:
            acc = acc * alpha[:, None] + tl.dot(pv, v.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(pv.to(V_DOT_DTYPE), v.to(V_DOT_DTYPE))
        return m_new, l_i, acc

    @triton.jit
    def _paged_attention_kernel(
        q_ptr, out_ptr, part_o_ptr, part_lse_ptr,
        k_ptr, ks_ptr, v_ptr, vs_ptr,
        block_tables_ptr, qsl_ptr, context_lens_ptr,
        fill_ptr, fill_slot_ptr, fill_lo_ptr, stride_fs, stride_ft, stride_fh,
        qk_scale,                       # softmax scale * log2(e): scores live in the log2 domain
        num_seqs, num_splits,
        stride_qt, stride_qh, stride_ot, stride_oh,
        stride_kb, stride_kt, stride_kh, stride_ksb, stride_kst, stride_ksh,
        stride_vb, stride_vt, stride_vh, stride_vsb, stride_vst, stride_vsh,
        stride_bt,
        NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_P2: tl.constexpr,
        HEAD_DIM: tl.constexpr, D_P2: tl.constexpr, DH_P2: tl.constexpr,
        K_CODEC: tl.constexpr, V_CODEC: tl.constexpr, NUM_GROUPS: tl.constexpr,
        BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_Q: tl.constexpr,
        SINGLE_SPLIT: tl.constexpr, FP32_DOT: tl.constexpr, QUANT_F16: tl.constexpr,
        USE_PDL: tl.constexpr, HAS_FILL: tl.constexpr = False, FILL_N: tl.constexpr = 16,
    ):
        pdl_enter(USE_PDL)
        qb = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        M: tl.constexpr = BLOCK_Q * GROUP_P2

        # ---- which sequence and which of its query tokens ---------------------------------
        if BLOCK_Q == 1:
            seq = qb
        else:  # largest seq with qsl[seq] // BLOCK_Q + seq <= qb
            lo = qb * 0
            hi = lo + num_seqs - 1   # (a tensor even when num_seqs is specialized to 1)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                ok = tl.load(qsl_ptr + mid) // BLOCK_Q + mid <= qb
                lo = tl.where(ok, mid, lo)
                hi = tl.where(ok, hi, mid - 1)
            seq = lo
        q_start = tl.load(qsl_ptr + seq)
        q_len = tl.load(qsl_ptr + seq + 1) - q_start
        if BLOCK_Q == 1:
            tok0 = 0
        else:
            tok0 = (qb - (q_start // BLOCK_Q + seq)) * BLOCK_Q
        if tok0 < q_len:
            context_len = tl.load(context_lens_ptr + seq)
            if HAS_FILL:  # keys at positions >= f_lo come from the fill rows, after the loop
                f_slot = tl.load(fill_slot_ptr + seq)
                f_lo = tl.where(f_slot >= 0, tl.load(fill_lo_ptr + seq), context_len)
            offs_m = tl.arange(0, M)
            tok = tok0 + offs_m // GROUP_P2                      # [M] token within the chunk
            g = offs_m % GROUP_P2
            heads = kv_head * GROUP + g
            row_ok = (g < GROUP) & (tok < q_len)
            q_pos = context_len - q_len + tok                    # [M] absolute position
            kv_end = context_len - q_len + tl.minimum(tok0 + BLOCK_Q, q_len)
            per_split = tl.cdiv(tl.cdiv(kv_end, num_splits), BLOCK_N) * BLOCK_N
            start = split * per_split
            end = tl.minimum(start + per_split, kv_end)

            q_rows = q_ptr + (q_start + tok).to(tl.int64) * stride_qt + heads * stride_qh
            if K_CODEC == 2:  # int4 keys: q's even and odd channels meet the low / high nibbles
                offs_j = tl.arange(0, DH_P2)
                mask_j = offs_j < HEAD_DIM // 2
                qm = row_ok[:, None] & mask_j[None, :]
                q_even = tl.load(q_rows[:, None] + 2 * offs_j[None, :], mask=qm, other=0.0)
                q_odd = tl.load(q_rows[:, None] + 2 * offs_j[None, :] + 1, mask=qm, other=0.0)
                if FP32_DOT:
                    q_even = q_even.to(tl.float32)
                    q_odd = q_odd.to(tl.float32)
                elif QUANT_F16:  # clamped: a bf16 q beyond fp16's range must not become inf
                    q_even = tl.clamp(q_even.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
                    q_odd = tl.clamp(q_odd.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
            offs_d = tl.arange(0, D_P2)
            mask_d = offs_d < HEAD_DIM
            if K_CODEC != 2:
                q = tl.load(q_rows[:, None] + offs_d[None, :],
                            mask=row_ok[:, None] & mask_d[None, :], other=0.0)   # [M, D]
                if FP32_DOT:
                    q = q.to(tl.float32)
                elif QUANT_F16 and K_CODEC == 1:
                    q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
            dot_dtype = q_ptr.dtype.element_ty
            if FP32_DOT:
                dot_dtype = tl.float32
            # quantized pages: codes dequantize exactly to fp16 (fewer instructions than bf16)
            k_dot_dtype = dot_dtype
            v_dot_dtype = dot_dtype
            if QUANT_F16 and not FP32_DOT:
                if K_CODEC != 0:
                    k_dot_dtype = tl.float16
                if V_CODEC != 0:
                    v_dot_dtype = tl.float16

            m_i = tl.full([M], -1.0e30, dtype=tl.float32)
            l_i = tl.zeros([M], dtype=tl.float32)
            acc = tl.zeros([M, D_P2], dtype=tl.float32)
            bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
            for tile in range(start, end, BLOCK_N):
                offs_n = tile + tl.arange(0, BLOCK_N)
                mask_n = offs_n < end
                page = tl.load(bt_row + offs_n // BLOCK_SIZE, mask=mask_n, other=0).to(tl.int64)
                row_in_page = offs_n % BLOCK_SIZE
                # ---- scores [M, N] ----
                k_rows = k_ptr + page * stride_kb + row_in_page * stride_kt + kv_head * stride_kh
                if K_CODEC == 2:
                    ks_rows = (ks_ptr + page * stride_ksb + row_in_page * stride_kst
                               + kv_head * stride_ksh)
                    km = mask_n[:, None] & mask_j[None, :]
                    packed = tl.load(k_rows[:, None] + offs_j[None, :], mask=km, other=0)
                    # channel 2j is in group 2j // INT4_GROUP = j // (INT4_GROUP // 2): load the
                    # [N, groups] scales once and widen them in registers to [N, D/2]
                    offs_g = tl.arange(0, NUM_GROUPS)
                    ksc = tl.load(ks_rows[:, None] + offs_g[None, :], mask=mask_n[:, None],
                                  other=0.0)                                       # [N, G]
                    ksc = tl.reshape(tl.broadcast_to(ksc[:, :, None],
                                                     (BLOCK_N, NUM_GROUPS, DH_P2 // NUM_GROUPS)),
                                     (BLOCK_N, DH_P2))                             # [N, D/2]
                    if FP32_DOT:
                        lo_nib = ((packed & 15).to(tl.int32) - 8).to(tl.float32) * ksc
                        hi_nib = ((packed >> 4).to(tl.int32) - 8).to(tl.float32) * ksc
                        s = tl.dot(q_even, tl.trans(lo_nib), input_precision="ieee")
                        s += tl.dot(q_odd, tl.trans(hi_nib), input_precision="ieee")
                    elif QUANT_F16:
                        # nibble n -> fp16 by its bits: 0x6400 | n is 1024 + n exactly, so
                        # (1024 + n) - 1032 = n - 8 with two cheap integer/half ops, no cvt
                        ksc16 = ksc.to(tl.float16)
                        lo16 = ((packed & 15).to(tl.int16) | 0x6400).to(tl.float16, bitcast=True)
                        hi16 = ((packed >> 4).to(tl.int16) | 0x6400).to(tl.float16, bitcast=True)
                        lo_nib = (lo16 - 1032.0) * ksc16
                        hi_nib = (hi16 - 1032.0) * ksc16
                        s = tl.dot(q_even, tl.trans(lo_nib))
                        s += tl.dot(q_odd, tl.trans(hi_nib))
                    else:
                        lo_nib = ((packed & 15).to(tl.int32) - 8).to(tl.float32) * ksc
                        hi_nib = ((packed >> 4).to(tl.int32) - 8).to(tl.float32) * ksc
                        s = tl.dot(q_even, tl.trans(lo_nib.to(dot_dtype)))
                        s += tl.dot(q_odd, tl.trans(hi_nib.to(dot_dtype)))
                else:
                    k = tl.load(k_rows[:, None] + offs_d[None, :],
                                mask=mask_n[:, None] & mask_d[None, :], other=0.0)   # [N, D]
                    if FP32_DOT:
                        s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
                    else:
                        s = tl.dot(q, tl.trans(k.to(k_dot_dtype)))
                    if K_CODEC == 1:  # per-token scale factors out of the dot
                        k_scale = tl.load(ks_ptr + page * stride_ksb + row_in_page * stride_kst
                                          + kv_head * stride_ksh, mask=mask_n, other=0.0)
                        s = s * k_scale[None, :]
                visible = mask_n[None, :] & (offs_n[None, :] <= q_pos[:, None])
                if HAS_FILL:
                    visible = visible & (offs_n < f_lo)[None, :]
                s = tl.where(visible, s * qk_scale, float("-inf"))
                # ---- online softmax, values ----
                m_i, l_i, acc = _attend_tile(
                    s, m_i, l_i, acc, v_ptr, vs_ptr, page, row_in_page, kv_head, mask_n,
                    offs_d, mask_d, stride_vb, stride_vt, stride_vh, stride_vsb, stride_vst,
                    stride_vsh, V_CODEC, FP32_DOT, v_dot_dtype)

            if HAS_FILL:  # noqa: SIM102 (a constexpr, then a runtime test: Triton)
                # the block being filled (int4 keys only): positions f_lo .. context_len - 1
                # (<= one block) of this split's range, keys from the fill rows at full
                # precision, values from the pages as above
                if tl.maximum(f_lo, start) < end:
                    offs_n = f_lo + tl.arange(0, FILL_N)
                    mask_n = (offs_n >= start) & (offs_n < end)
                    page = tl.load(bt_row + offs_n // BLOCK_SIZE, mask=mask_n,
                                   other=0).to(tl.int64)
                    row_in_page = offs_n % BLOCK_SIZE
                    f_rows = (fill_ptr + f_slot.to(tl.int64) * stride_fs
                              + row_in_page * stride_ft + kv_head * stride_fh)
                    fm = mask_n[:, None] & mask_j[None, :]
                    fe = tl.load(f_rows[:, None] + 2 * offs_j[None, :], mask=fm, other=0.0)
                    fo = tl.load(f_rows[:, None] + 2 * offs_j[None, :] + 1, mask=fm, other=0.0)
                    if FP32_DOT:
                        fe = fe.to(tl.float32)
                        fo = fo.to(tl.float32)
                        s = tl.dot(q_even, tl.trans(fe), input_precision="ieee")
                        s += tl.dot(q_odd, tl.trans(fo), input_precision="ieee")
                    else:
                        if QUANT_F16:
                            fe = tl.clamp(fe.to(tl.float32), -65504.0, 65504.0)
                            fo = tl.clamp(fo.to(tl.float32), -65504.0, 65504.0)
                        s = tl.dot(q_even, tl.trans(fe.to(k_dot_dtype)))
                        s += tl.dot(q_odd, tl.trans(fo.to(k_dot_dtype)))
                    visible = mask_n[None, :] & (offs_n[None, :] <= q_pos[:, None])
                    s = tl.where(visible, s * qk_scale, float("-inf"))
                    m_i, l_i, acc = _attend_tile(
                        s, m_i, l_i, acc, v_ptr, vs_ptr, page, row_in_page, kv_head, mask_n,
                        offs_d, mask_d, stride_vb, stride_vt, stride_vh, stride_vsb,
                        stride_vst, stride_vsh, V_CODEC, FP32_DOT, v_dot_dtype)

            nonempty = l_i > 0.0
            o = acc / tl.where(nonempty, l_i, 1.0)[:, None]
            store_mask = row_ok[:, None] & mask_d[None, :]
            token = (q_start + tok).to(tl.int64)
            if SINGLE_SPLIT:
                tl.store(out_ptr + token[:, None] * stride_ot + heads[:, None] * stride_oh
                         + offs_d[None, :], o.to(out_ptr.dtype.element_ty), mask=store_mask)
            else:
                # part_o [num_tokens, num_heads, num_splits, HEAD_DIM] fp32; part_lse [.., .., S]
                prow = (token * NUM_HEADS + heads) * num_splits + split                # [M]
                tl.store(part_o_ptr + prow[:, None] * HEAD_DIM + offs_d[None, :], o,
                         mask=store_mask)
                lse = tl.where(nonempty, m_i + tl.log2(tl.where(nonempty, l_i, 1.0)),
                               float("-inf"))
                tl.store(part_lse_ptr + prow, lse, mask=row_ok)

    @triton.jit
    def _merge_splits_kernel(
        part_o_ptr, part_lse_ptr, out_ptr, stride_ot, stride_oh, num_splits,
        NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, D_P2: tl.constexpr,
        SPLITS_P2: tl.constexpr, HEADS_PER_PROGRAM: tl.constexpr, USE_PDL: tl.constexpr,
    ):
        """out[token, heads] = sum_s w_s o_s / sum_s w_s with w_s = 2^(lse_s - max lse)."""
        pdl_enter(USE_PDL)
        token = tl.program_id(0).to(tl.int64)
        heads = tl.program_id(1) * HEADS_PER_PROGRAM + tl.arange(0, HEADS_PER_PROGRAM)
        offs_s = tl.arange(0, SPLITS_P2)
        offs_d = tl.arange(0, D_P2)
        mask_h = heads < NUM_HEADS
        mask_hs = mask_h[:, None] & (offs_s < num_splits)[None, :]
        row = (token * NUM_HEADS + heads[:, None]) * num_splits + offs_s[None, :]   # [Hb, S]
        lse = tl.load(part_lse_ptr + row, mask=mask_hs, other=float("-inf"))
        m = tl.max(lse, axis=1)
        m = tl.where(m == float("-inf"), 0.0, m)            # all splits empty: weights all 0
        w = tl.exp2(lse - m[:, None])                        # [Hb, S]
        den = tl.sum(w, axis=1)
        o = tl.load(part_o_ptr + row[:, :, None] * HEAD_DIM + offs_d[None, None, :],
                    mask=mask_hs[:, :, None] & (offs_d < HEAD_DIM)[None, None, :],
                    other=0.0)                                                   # [Hb, S, D]
        o = tl.sum(o * w[:, :, None], axis=1) / tl.where(den > 0.0, den, 1.0)[:, None]
        tl.store(out_ptr + token * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
                 o.to(out_ptr.dtype.element_ty),
                 mask=mask_h[:, None] & (offs_d < HEAD_DIM)[None, :])


def paged_attention_triton(
    q: torch.Tensor, k_cache, v_cache, block_tables: torch.Tensor,
    query_start_loc: torch.Tensor, context_lens: torch.Tensor, scale: float,
    max_query_len: int, max_context_len: int | None = None, num_splits: int | None = None,
    out: torch.Tensor | None = None, block_q: int | None = None,
    num_warps: int | None = None, block_n: int | None = None, num_stages: int | None = None,
    quant_f16: bool | None = None, fp32_dot: bool | None = None,
    fill_slot: torch.Tensor | None = None, fill_lo: torch.Tensor | None = None,
    maxnreg: int | None = None,
) -> torch.Tensor:
    num_tokens, num_heads, head_dim = q.shape
    num_seqs = context_lens.shape[0]
    k_data, k_scale, k_codec = _pool_parts(k_cache)
    v_data, v_scale, v_codec = _pool_parts(v_cache)
    _, block_size, num_kv_heads, _ = k_cache.shape
    if v_codec == CODEC_INT4:
        raise ValueError("int4 values are not a KV format (int4 keys pair with fp8 values)")
    fill = getattr(k_cache, "fill", None) if fill_slot is not None else None
    if fill is not None:
        if k_codec != CODEC_INT4:
            raise ValueError("fill rows (the block being filled) are read for int4 keys only")
        assert fill.stride(-1) == 1 and fill_lo is not None
    assert q.stride(-1) == 1 and k_data.stride(-1) == 1 and v_data.stride(-1) == 1
    assert num_heads % num_kv_heads == 0 and head_dim >= 16
    assert query_start_loc.shape[0] == num_seqs + 1 and block_tables.shape[0] >= num_seqs
    group = num_heads // num_kv_heads
    num_groups = k_scale.shape[-1] if k_codec == CODEC_INT4 else 1   # int4 scales per head
    if k_codec == CODEC_INT4 and next_power_of_2(head_dim) != head_dim:
        raise ValueError(f"int4 keys need a power-of-2 head_dim, got {head_dim}")
    if fp32_dot is None:
        fp32_dot = q.dtype == torch.float32 or triton_interpreting()
    if quant_f16 is None:
        quant_f16 = QUANT_DOT_F16
    if out is None:
        out = torch.empty_like(q)
    if num_tokens == 0 or num_seqs == 0:
        return out
    if block_q is None:
        block_q = choose_block_q(max_query_len, group)
    group_p2 = max(16, next_power_of_2(group)) if block_q == 1 else next_power_of_2(group)
    if block_q * group_p2 < 16:
        block_q = 16 // group_p2
    if num_warps is None:
        num_warps = DECODE_WARPS if block_q == 1 else PREFILL_WARPS
    quant_decode = block_q == 1 and k_codec != CODEC_NATIVE
    if block_n is None:
        block_n = QUANT_BLOCK_N if quant_decode else BLOCK_N
    if num_stages is None:
        num_stages = QUANT_NUM_STAGES if quant_decode else NUM_STAGES
    num_q_blocks = num_seqs if block_q == 1 else num_tokens // block_q + num_seqs
    if max_context_len is None:  # an upper bound without a device sync
        max_context_len = block_tables.shape[1] * block_size
    if quant_decode:
        plan_splits, plan_cap = quant_decode_plan(num_seqs * num_kv_heads, max_context_len,
                                                  num_sms(q.device), block_n,
                                                  k_codec == CODEC_INT4)
        if num_splits is None:
            num_splits = plan_splits
        if maxnreg is None and not triton_interpreting():
            maxnreg = plan_cap
    launch_opts = {} if maxnreg is None else {"maxnreg": maxnreg}
    if num_splits is None:  # (a quantized decode took its plan's splits above)
        busy_blocks = num_seqs if block_q == 1 else max(1, cdiv(num_tokens, block_q))
        resident = DECODE_RESIDENT_PER_SM if block_q == 1 else None
        num_splits = choose_num_splits(busy_blocks * num_kv_heads, max_context_len,
                                       num_sms(q.device), resident, block_n)
    if num_splits > 1:
        part_o = torch.empty((num_tokens, num_heads, num_splits, head_dim),
                             dtype=torch.float32, device=q.device)
        part_lse = torch.empty((num_tokens, num_heads, num_splits), dtype=torch.float32,
                               device=q.device)
    else:
        part_o = part_lse = out  # unused
    d_p2 = max(16, next_power_of_2(head_dim))
    _paged_attention_kernel[(num_q_blocks, num_kv_heads, num_splits)](
        q, out, part_o, part_lse,
        k_data, k_data if k_scale is None else k_scale,
        v_data, v_data if v_scale is None else v_scale,
        block_tables, query_start_loc, context_lens,
        k_data if fill is None else fill,
        context_lens if fill is None else fill_slot, context_lens if fill is None else fill_lo,
        *((0, 0, 0) if fill is None else (fill.stride(0), fill.stride(1), fill.stride(2))),
        scale * _LOG2E, num_seqs, num_splits,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_data.stride(0), k_data.stride(1), k_data.stride(2), *_strides3(k_scale),
        v_data.stride(0), v_data.stride(1), v_data.stride(2), *_strides3(v_scale),
        block_tables.stride(0),
        NUM_HEADS=num_heads, GROUP=group, GROUP_P2=group_p2,
        HEAD_DIM=head_dim, D_P2=d_p2, DH_P2=max(16, next_power_of_2(head_dim // 2)),
        K_CODEC=k_codec, V_CODEC=v_codec, NUM_GROUPS=num_groups,
        BLOCK_SIZE=block_size, BLOCK_N=block_n, BLOCK_Q=block_q,
        SINGLE_SPLIT=num_splits == 1, FP32_DOT=fp32_dot, QUANT_F16=quant_f16,
        HAS_FILL=fill is not None, FILL_N=max(16, next_power_of_2(block_size)),
        num_warps=num_warps, num_stages=num_stages, **launch_opts, **pdl_args(q),
    )
    if num_splits > 1:
        splits_p2 = next_power_of_2(num_splits)
        # heads per merge program: a [heads, splits, head_dim] fp32 tile of <= 8K elements
        hpp = min(next_power_of_2(num_heads), max(1, MERGE_TILE // (splits_p2 * d_p2)))
        _merge_splits_kernel[(num_tokens, cdiv(num_heads, hpp))](
            part_o, part_lse, out, out.stride(0), out.stride(1), num_splits,
            NUM_HEADS=num_heads, HEAD_DIM=head_dim, D_P2=d_p2,
            SPLITS_P2=splits_p2, HEADS_PER_PROGRAM=hpp,
            num_warps=4, **pdl_args(q),
        )
    return out


def paged_attention(
    q: torch.Tensor, k_cache, v_cache, block_tables: torch.Tensor,
    query_start_loc: torch.Tensor, context_lens: torch.Tensor, scale: float | None = None,
    *, max_query_len: int, max_context_len: int | None = None,
    out: torch.Tensor | None = None,
    fill_slot: torch.Tensor | None = None, fill_lo: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of every query token of a step over the paged cache -> [num_tokens, H, D].

    Host bounds, never read from the device: `max_query_len` (1 = a decode-only step, which
    takes the one-sequence-per-program tiling) and `max_context_len` (split sizing; default the
    block-table width). `out` (optional) receives the result (a static buffer under graphs).
    `fill_slot` / `fill_lo` (per sequence, `backend.kernels.forward_context`): an int4 key pool's fill rows are
    read for positions >= fill_lo of sequences with a slot (`backend.kv.fill_slots`).
    """
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if use_triton(q):
        return paged_attention_triton(q, k_cache, v_cache, block_tables, query_start_loc,
                                      context_lens, scale, max_query_len, max_context_len,
                                      out=out, fill_slot=fill_slot, fill_lo=fill_lo)
    ref = paged_attention_reference(q, k_cache, v_cache, block_tables, query_start_loc,
                                    context_lens, scale, fill_slot, fill_lo)
    if out is None:
        return ref
    out.copy_(ref)
    return out
