"""Quantized KV pages: `--kv-cache-dtype fp8` and `int4-fp8`. Quantize on write, dequantize on read.

One `QuantizedPages` object replaces one per-layer K (or V) pool tensor of `backend.kv.pools`. It
keeps the pool's *logical* shape `[num_blocks, block_size, num_kv_heads, head_dim]` (what the
attention functions read off `cache.shape`), but memory holds only the quantized codes and their
fp32 scales, in two tensors indexed by the same (block, offset, kv head):

  fp8 (K and V alike; E4M3, per-(token, kv-head) scale = amax * (1/448)):

      data   [num_blocks, block_size, Hkv, D]         float8_e4m3fn   D bytes / token-head
      scale  [num_blocks, block_size, Hkv]            float32         4 bytes / token-head

             block b ──┬─ offset 0 ─┬─ head 0: [c0 c1 ... c(D-1)]  fp8   x = c * scale[b,0,0]
                       │            └─ head 1: [...]
                       └─ offset 1 ─ ...

  int4 (keys of int4-fp8; symmetric, q in [-7, 7], per-(token, kv-head, group of G channels)
  scale = amax_group * (1/7); two channels per byte, stored offset-binary (q + 8)):

      data   [num_blocks, block_size, Hkv, D // 2]    uint8           D/2 bytes / token-head
      scale  [num_blocks, block_size, Hkv, D // G]    float32         4 D/G bytes / token-head

             byte j of a head = (q[2j+1] + 8) << 4 | (q[2j] + 8)     (low nibble: even channel)
             channels [g*G, (g+1)*G) share scale[..., g]             (G = 32, or D if D < 32)

  int4-fp8 = int4 keys + fp8 values (values carry no outlier channels worth a group scale; keys
  do, and the group scale bounds each group's error by its own amax, not the head's).

  int4 key pools may also carry fill rows (`attach_fill`): each running sequence's current, partly
  filled block of keys in the model dtype, read instead of the codes for that block (most of
  int4's perplexity loss is a query reading its nearest keys quantized; `backend.kv.fill_slots`).

Why per token (not per block) scales: a block fills one token at a time (decode), so a per-block
scale would have to be fixed in advance (clipping) or the block re-quantized whenever a larger
value arrives (read-modify-write of up to block_size tokens per step, and a race with prefix
sharing). Per-token scales make every write independent and final, copy-on-write copies a block's
codes and scales together, and the error of a token never depends on its neighbours. The cost is
4 bytes per token-head next to D code bytes (6% at D = 64, 3% at D = 128).

Bytes per token per layer (K + V), head_dim D, Hkv kv heads:
    bf16        4 D Hkv                  D=128: 512 Hkv
    fp8         (2 D + 8) Hkv            D=128: 264 Hkv  (1.94x fewer bytes than bf16)
    int4-fp8    (1.5 D + 4 D/G + 4) Hkv  D=128: 212 Hkv  (2.42x)
"""
from __future__ import annotations

import os

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0              # largest finite E4M3 value
INT4_MAX = 7                 # symmetric: codes -7..7 (offset-binary 1..15 in a nibble)
INT4_GROUP = 32              # channels of head_dim per int4 scale
SCALE_DTYPE = torch.float32
# The int4 keys' scale dtype. fp16 scales with 16-channel groups take exactly the bytes of fp32
# scales with 32-channel groups and measured +1.14% perplexity on tiny-coder v2 against +2.06%
# (BENCHMARKS, "Attention sinks and the block being filled"); every path (reference, CPU,
# Triton write and attention) takes either layout from the pool's own shapes and dtypes. The
# default stays 32 / fp32 for speed: on the H200 (session 5, BENCHMARKS issue 12) the 16-channel
# layout measured +1.33% through the CUDA kernels (32: +2.08%) but its decode attention is
# 1.12-1.25x bf16's at 8 x 8k, 8 x 16k and batch 64 (32: 0.92-1.05x). Not profiled: widening
# 8 scales a row (not 4) to the codes' layout is the one difference in the kernel's loop.
# Session 6: with the block being filled kept in bf16 (`attach_fill`, `backend.kv.fill_slots`, on
# by default) g32 measures +1.13% through the CUDA kernels (one-block chunks, as a decode reads)
# and greedy agreement 0.954: inside the quality goal at g32's speed.
INT4_SCALE_DTYPE = torch.float32
# TIDEGATE_INT4_LAYOUT=g16 selects the 16-channel / fp16-scale layout in this process (g32, the
# default, the one above): for the GPU perplexity and speed runs that decide the default, without
# editing code. Read once at import, as the constants it sets are.
INT4_LAYOUTS = {"g32": (32, torch.float32), "g16": (16, torch.float16)}
_layout = os.environ.get("TIDEGATE_INT4_LAYOUT", "g32")
if _layout not in INT4_LAYOUTS:
    raise ValueError(f"TIDEGATE_INT4_LAYOUT={_layout!r}: expected one of {sorted(INT4_LAYOUTS)}")
INT4_GROUP, INT4_SCALE_DTYPE = INT4_LAYOUTS[_layout]
_TINY = 1e-12                # scale floor: an all-zero vector quantizes to zeros, not NaNs
TINY_F16 = 2.0 ** -14        # the floor of fp16 scales (fp16's smallest normal: no subnormals)
# Scales are amax times these reciprocals (not amax / max): torch on CUDA turns a division by a
# Python number into that product anyway, so CPU, CUDA and the Triton write kernel
# (backend/kernels/rotary_kv.py) all compute the same fp32 scale, bit for bit.
INV_FP8_MAX = 1.0 / FP8_MAX
INV_INT4_MAX = 1.0 / INT4_MAX

# format -> (key codec, value codec)
FORMATS: dict[str, tuple[str, str]] = {"fp8": ("fp8", "fp8"), "int4-fp8": ("int4", "fp8")}


def int4_group_size(head_dim: int) -> int:
    g = min(INT4_GROUP, head_dim)
    if head_dim % 2 or head_dim % g:
        raise ValueError(f"int4 KV needs an even head_dim divisible by {g}, got {head_dim}")
    return g


# ---- codecs: x [..., D] float <-> (codes, scales) --------------------------------------------------

def quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] -> (codes [..., D] float8_e4m3fn, scale [...] fp32), x ~= codes * scale."""
    xf = x.float()
    scale = (xf.abs().amax(dim=-1) * INV_FP8_MAX).clamp_min(_TINY)
    codes = (xf / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return codes, scale


def dequantize_fp8(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return codes.float() * scale[..., None]


def quantize_int4(x: torch.Tensor, group: int, scale_dtype: torch.dtype = torch.float32,
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] -> (packed [..., D/2] uint8, scale [..., D/group] in `scale_dtype`). An fp16
    scale is rounded (and floored at fp16's smallest normal) before the codes are computed."""
    d = x.shape[-1]
    xg = x.float().reshape(*x.shape[:-1], d // group, group)
    amax = xg.abs().amax(dim=-1) * INV_INT4_MAX
    if scale_dtype == torch.float16:
        scale = amax.clamp_min(TINY_F16).to(torch.float16)
    else:
        scale = amax.clamp_min(_TINY)
    q = torch.round(xg / scale.float()[..., None]).clamp_(-INT4_MAX, INT4_MAX).reshape(x.shape)
    u = (q + 8).to(torch.uint8)
    return u[..., 0::2] | (u[..., 1::2] << 4), scale


def dequantize_int4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    group = 2 * packed.shape[-1] // scale.shape[-1]
    lo = (packed & 0xF).to(torch.int16) - 8
    hi = (packed >> 4).to(torch.int16) - 8
    q = torch.stack((lo, hi), dim=-1).reshape(*packed.shape[:-1], 2 * packed.shape[-1]).float()
    return (q.reshape(*scale.shape, group) * scale.float()[..., None]).reshape(q.shape)


def token_head_bytes(codec: str, head_dim: int) -> int:
    """Bytes one (token, kv head) takes in one pool (K or V) of `codec`, scales included."""
    if codec == "fp8":
        return head_dim + SCALE_DTYPE.itemsize
    if codec == "int4":
        return head_dim // 2 + (head_dim // int4_group_size(head_dim)) * INT4_SCALE_DTYPE.itemsize
    raise ValueError(f"unknown KV codec {codec!r}")


def kv_bytes_per_token(fmt: str, num_layers: int, num_kv_heads: int, head_dim: int) -> int:
    """Bytes of K and V for one token across all layers in KV format `fmt`."""
    k_codec, v_codec = FORMATS[fmt]
    per_head = token_head_bytes(k_codec, head_dim) + token_head_bytes(v_codec, head_dim)
    return num_layers * num_kv_heads * per_head


# ---- the pool object -----------------------------------------------------------------------------

class QuantizedPages:
    """One layer's K or V pool in a quantized codec (see the module docstring for the layout).

    The attention reference (`backend.kernels.reference.attention`) writes with `write(slots, x)` and reads with
    `pages(block_ids)`; `copy_blocks` serves copy-on-write. `shape` is the logical pool shape."""

    def __init__(self, codec: str, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, device: torch.device | str) -> None:
        self.codec = codec
        # the block being filled at full precision (int4 keys; see `attach_fill`): None = off
        self.fill: torch.Tensor | None = None
        self.shape = torch.Size((num_blocks, block_size, num_kv_heads, head_dim))
        lead = (num_blocks, block_size, num_kv_heads)
        if codec == "fp8":
            self.data = torch.zeros((*lead, head_dim), dtype=FP8_DTYPE, device=device)
            self.scale = torch.zeros(lead, dtype=SCALE_DTYPE, device=device)
        elif codec == "int4":   # layout: the module's INT4_GROUP / INT4_SCALE_DTYPE now
            self.group = int4_group_size(head_dim)
            self.data = torch.zeros((*lead, head_dim // 2), dtype=torch.uint8, device=device)
            self.scale = torch.zeros((*lead, head_dim // self.group), dtype=INT4_SCALE_DTYPE,
                                     device=device)
        else:
            raise ValueError(f"unknown KV codec {codec!r}")

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def nbytes(self) -> int:
        """The pages' bytes (codes and scales; the fill rows are per sequence, not per block)."""
        return self.data.nbytes + self.scale.nbytes

    def attach_fill(self, num_slots: int, dtype: torch.dtype) -> None:
        """Keep the block being filled at full precision: `fill [num_slots, block_size, Hkv, D]`
        in the model dtype, one block-sized row set per fill slot (a running sequence's, see
        `backend.kv.fill_slots`). The writer still stores every key's codes (a token's int4 scales
        are its own, so its codes never change) and also its key here; attention reads a
        sequence's keys at positions >= its `fill_lo` from this copy instead of the codes."""
        self.fill = torch.zeros((num_slots, *self.shape[1:]), dtype=dtype, device=self.device)

    def write_fill(self, rows: torch.Tensor, x: torch.Tensor) -> None:
        """x [n, Hkv, D] into flat fill rows [n] (slot * block_size + offset; all valid)."""
        self.fill.view(-1, *self.shape[2:]).index_copy_(0, rows, x.to(self.fill.dtype))

    def quantize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.codec == "fp8":
            return quantize_fp8(x)
        return quantize_int4(x, self.group, self.scale.dtype)

    def dequantize(self, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return dequantize_fp8(codes, scale) if self.codec == "fp8" else dequantize_int4(codes, scale)

    # Codes are moved as raw bytes (a uint8 view): torch has no index_copy_/gather for float8.
    def write(self, slots: torch.Tensor, x: torch.Tensor) -> None:
        """Quantize x [n, Hkv, D] into flat slots [n] (int64, all valid)."""
        codes, scale = self.quantize(x)
        n = self.shape[0] * self.shape[1]
        bits = self.data.view(torch.uint8)
        bits.view(n, *bits.shape[2:]).index_copy_(0, slots, codes.view(torch.uint8))
        self.scale.view(n, *self.scale.shape[2:]).index_copy_(0, slots, scale)

    def pages(self, block_ids: torch.Tensor) -> torch.Tensor:
        """Blocks `block_ids` (any shape, long) dequantized: fp32 [*block_ids.shape, bs, Hkv, D]."""
        codes = self.data.view(torch.uint8)[block_ids].view(self.data.dtype)
        return self.dequantize(codes, self.scale[block_ids])

    def copy_blocks(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        bits = self.data.view(torch.uint8)
        bits.index_copy_(0, dst, bits.index_select(0, src))
        self.scale.index_copy_(0, dst, self.scale.index_select(0, src))
