"""Paged KV storage: one preallocated pool per layer for K and one for V.

    k_caches[layer]: [num_blocks, block_size, num_kv_heads, head_dim]   (model dtype)
    v_caches[layer]: same

`kv_cache_dtype` (`--kv-cache-dtype`) picks the pool format:
    auto       plain tensors in the model dtype (above)
    fp8        `backend.kv.formats.QuantizedPages`: E4M3 K and V + per-(token, kv-head) scales
    int4-fp8   `QuantizedPages`: INT4 K (per-group scales, 2 channels a byte) + E4M3 V
A quantized pool keeps the logical shape above; the attention reference quantizes on write and
dequantizes the pages it reads (`backend.kernels.reference.attention`). The model never sees the difference.

Slot `s` of the pool is block `s // block_size`, offset `s % block_size`. Which blocks a
sequence owns is decided by `scheduler.BlockManager`; this object only holds the memory and
copies blocks when told (copy-on-write).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from backend.config import ModelConfig
from backend.kv.formats import FORMATS, QuantizedPages, kv_bytes_per_token

KV_CACHE_DTYPES = ("auto", *FORMATS)  # auto = the model dtype
# int4 keys keep the block being filled at full precision by default (`backend.kv.fill_slots`);
# TIDEGATE_KV_FILL_BLOCK=0 turns it off in this process (A/B runs, read at allocation)
FILL_BLOCK_ENV = "TIDEGATE_KV_FILL_BLOCK"


def uses_fill_block(kv_cache_dtype: str) -> bool:
    """Whether pools of this format get fill rows: int4 keys, unless turned off by the env."""
    return (kv_cache_dtype in FORMATS and FORMATS[kv_cache_dtype][0] == "int4"
            and os.environ.get(FILL_BLOCK_ENV, "1") != "0")


def fill_bytes(config: ModelConfig, block_size: int, dtype: str, num_slots: int) -> int:
    """Bytes of the fill rows across all layers: one block of keys in the model dtype a slot."""
    per_token = config.kv_bytes_per_token(dtype) // 2   # keys only
    return num_slots * block_size * per_token


@dataclass
class KVCache:
    k_caches: list  # torch.Tensor per layer, or QuantizedPages for a quantized kv_cache_dtype
    v_caches: list
    num_blocks: int
    block_size: int
    kv_cache_dtype: str = "auto"

    @classmethod
    def allocate(cls, config: ModelConfig, num_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device | str,
                 kv_cache_dtype: str = "auto", fill_slots: int = 0) -> KVCache:
        """`fill_slots` > 0: int4 key pools also keep that many sequences' block being filled
        in `dtype` (`QuantizedPages.attach_fill`); other formats ignore it."""
        shape = (num_blocks, block_size, config.num_key_value_heads, config.head_dim)
        if kv_cache_dtype != "auto":
            k_codec, v_codec = _formats(kv_cache_dtype)
            n = config.num_hidden_layers
            k = [QuantizedPages(k_codec, *shape, device) for _ in range(n)]
            v = [QuantizedPages(v_codec, *shape, device) for _ in range(n)]
            if fill_slots > 0 and k_codec == "int4":
                for pages in k:
                    pages.attach_fill(fill_slots, dtype)
            return cls(k, v, num_blocks, block_size, kv_cache_dtype)
        k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        return cls(k, v, num_blocks, block_size)

    @property
    def nbytes(self) -> int:
        """Bytes the pools hold (codes and scales for a quantized format; not the fill rows)."""
        return sum(c.nbytes for c in (*self.k_caches, *self.v_caches))

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole blocks `src -> dst` in every layer (copy-on-write of a shared block)."""
        if not pairs:
            return
        device = self.k_caches[0].device
        src = torch.tensor([p[0] for p in pairs], dtype=torch.long, device=device)
        dst = torch.tensor([p[1] for p in pairs], dtype=torch.long, device=device)
        if self.kv_cache_dtype != "auto":
            for k, v in zip(self.k_caches, self.v_caches):
                k.copy_blocks(src, dst)
                v.copy_blocks(src, dst)
            return
        for k, v in zip(self.k_caches, self.v_caches):
            k.index_copy_(0, dst, k.index_select(0, src))
            v.index_copy_(0, dst, v.index_select(0, src))


def _formats(kv_cache_dtype: str) -> tuple[str, str]:
    if kv_cache_dtype not in FORMATS:
        raise ValueError(f"unknown kv cache dtype {kv_cache_dtype!r} "
                         f"(supported: {', '.join(KV_CACHE_DTYPES)})")
    return FORMATS[kv_cache_dtype]


def block_bytes(config: ModelConfig, block_size: int, dtype: str, kv_cache_dtype: str = "auto") -> int:
    """Bytes one block takes across all layers, K and V (`dtype`: the model dtype, which is the
    KV dtype under `auto`; a quantized format counts its codes and scales)."""
    if kv_cache_dtype == "auto":
        return block_size * config.kv_bytes_per_token(dtype)
    _formats(kv_cache_dtype)
    return block_size * kv_bytes_per_token(kv_cache_dtype, config.num_hidden_layers,
                                           config.num_key_value_heads, config.head_dim)


def num_blocks_for_memory(config: ModelConfig, block_size: int, dtype: str, kv_bytes: int,
                          kv_cache_dtype: str = "auto") -> int:
    return max(0, kv_bytes // block_bytes(config, block_size, dtype, kv_cache_dtype))


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]

