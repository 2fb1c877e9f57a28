"""Paged KV storage: one preallocated pool per layer for K and one for V.

    k_caches[layer]: [num_blocks, block_size, num_kv_heads, head_dim]   (model dtype)
    v_caches[layer]: same

Slot `s` of the pool is block `s // block_size`, offset `s % block_size`. Which blocks a
sequence owns is decided by `scheduler.BlockManager`; this object only holds the memory and
copies blocks when told (copy-on-write).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from backend.config import ModelConfig


@dataclass
class KVCache:
    k_caches: list[torch.Tensor]
    v_caches: list[torch.Tensor]
    num_blocks: int
    block_size: int

    @classmethod
    def allocate(cls, config: ModelConfig, num_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device | str) -> KVCache:
        shape = (num_blocks, block_size, config.num_key_value_heads, config.head_dim)
        k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        return cls(k, v, num_blocks, block_size)

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
        for k, v in zip(self.k_caches, self.v_caches):
            k.index_copy_(0, dst, k.index_select(0, src))
            v.index_copy_(0, dst, v.index_select(0, src))


def block_bytes(config: ModelConfig, block_size: int, dtype: str) -> int:
    """Bytes one block takes across all layers, K and V."""
    return block_size * config.kv_bytes_per_token(dtype)


def num_blocks_for_memory(config: ModelConfig, block_size: int, dtype: str, kv_bytes: int) -> int:
    return max(0, kv_bytes // block_bytes(config, block_size, dtype))


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]

