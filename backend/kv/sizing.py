"""How many sequences of a given context fit in the KV pool, per KV format, by the engine's own
arithmetic (`backend.engine.assemble.size_kv_pool`: a share of the memory left after the weights, divided
into blocks of `backend.kv.pools.block_bytes`).

    python -m backend.kv.sizing --model deepseek-coder-33b --gpu-memory-gib 139 --context-len 16384

`--gpu-memory-gib` is the device's free memory before the weights load (the H200 we are lent
reports about 139 GiB); the weights take `served_weight_bytes` (the model dtype, bf16 on CUDA, or
with `--quantization fp8` one byte a weight of every linear layer and an fp32 scale per output
channel: the engine quantizes before it sizes the pool), and the pool `--kv-memory-fraction` of
what is left (0.85, the CUDA default).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from backend.config import DTYPE_BYTES, ModelConfig
from backend.kv.pools import (
    KV_CACHE_DTYPES,
    block_bytes,
    fill_bytes,
    num_blocks_for_memory,
    uses_fill_block,
)
from scheduler.capacity import DEFAULT_CAPACITY

# The share of the memory left after the weights that the KV pool takes, by device type: the
# CUDA default leaves room for activations and graphs; a CPU backend shares RAM with the host.
DEFAULT_KV_FRACTION = {"cpu": 0.1, "cuda": 0.85}


@dataclass(frozen=True)
class KVCapacity:
    kv_cache_dtype: str
    kv_bytes: int  # the pool's share of memory
    fill_bytes: int  # of it, the int4 keys' fill rows (the block being filled, per sequence)
    block_bytes: int
    num_blocks: int
    blocks_per_seq: int
    num_seqs: int  # sequences of the full context that fit at once


def served_weight_bytes(config: ModelConfig, dtype: str = "bfloat16",
                        quantization: str = "none") -> int:
    """Bytes of the weights as served: all in `dtype`, or with fp8 weights
    (`backend.model.quantization`) every linear layer (the projections and an untied LM head)
    at one byte a weight plus one fp32 scale per output channel, the embedding and norms in
    `dtype`."""
    if quantization in (None, "", "none"):
        return config.weight_bytes(dtype)
    if quantization != "fp8":
        raise ValueError(f"unknown quantization {quantization!r}")
    h, i, q, kv = config.hidden_size, config.intermediate_size, config.q_size, config.kv_size
    linears = [(q + 2 * kv, h), (h, q), (2 * i, h), (h, i)]  # (out, in): qkv, o, gate_up, down
    per_layer = sum(n * k + 4 * n for n, k in linears)
    head = 0 if config.tie_word_embeddings else config.vocab_size * (h + 4)
    rest = config.num_params() - config.num_hidden_layers * sum(n * k for n, k in linears) \
        - (0 if config.tie_word_embeddings else config.vocab_size * h)
    return config.num_hidden_layers * per_layer + head + rest * DTYPE_BYTES[dtype]


def kv_capacity(config: ModelConfig, gpu_memory_bytes: int, context_len: int,
                kv_cache_dtype: str = "auto", dtype: str = "bfloat16",
                block_size: int = DEFAULT_CAPACITY.block_size,
                kv_memory_fraction: float = DEFAULT_KV_FRACTION["cuda"],
                max_num_seqs: int = DEFAULT_CAPACITY.max_num_seqs,
                quantization: str = "none") -> KVCapacity:
    weights = served_weight_bytes(config, dtype, quantization)
    free = gpu_memory_bytes - weights
    if free <= 0:
        kind = dtype if quantization in (None, "", "none") else quantization
        raise ValueError(f"the {kind} weights ({weights / 2**30:.1f} GiB) do "
                         f"not fit in {gpu_memory_bytes / 2**30:.1f} GiB")
    kv_bytes = int(kv_memory_fraction * free)
    # as `backend.engine.assemble.fill_slots_for`: a slot per sequence of a step, and one more
    fill = fill_bytes(config, block_size, dtype, max_num_seqs + 1) \
        if uses_fill_block(kv_cache_dtype) else 0
    num_blocks = num_blocks_for_memory(config, block_size, dtype, kv_bytes - fill, kv_cache_dtype)
    per_seq = -(-context_len // block_size)
    return KVCapacity(kv_cache_dtype, kv_bytes, fill,
                      block_bytes(config, block_size, dtype, kv_cache_dtype),
                      num_blocks, per_seq, num_blocks // per_seq)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="deepseek-coder-33b", help="preset name")
    p.add_argument("--gpu-memory-gib", type=float, default=139.0)
    p.add_argument("--context-len", type=int, default=16384)
    p.add_argument("--block-size", type=int, default=DEFAULT_CAPACITY.block_size)
    p.add_argument("--kv-memory-fraction", type=float, default=DEFAULT_KV_FRACTION["cuda"])
    p.add_argument("--max-num-seqs", type=int, default=DEFAULT_CAPACITY.max_num_seqs,
                   help="sizes the int4 keys' fill rows (one block of bf16 keys a sequence)")
    p.add_argument("--quantization", default="none", choices=["none", "fp8"],
                   help="the weights' format as served (the engine's --quantization)")
    a = p.parse_args(argv)
    config = ModelConfig.from_preset(a.model)
    mem = int(a.gpu_memory_gib * 2**30)
    rows = [kv_capacity(config, mem, a.context_len, fmt, "bfloat16", a.block_size,
                        a.kv_memory_fraction, a.max_num_seqs, a.quantization)
            for fmt in KV_CACHE_DTYPES]
    weights = served_weight_bytes(config, "bfloat16", a.quantization)
    kind = "bf16" if a.quantization == "none" else a.quantization
    print(f"{a.model}: {kind} weights {weights / 2**30:.1f} GiB of "
          f"{a.gpu_memory_gib} GiB; KV pool {rows[0].kv_bytes / 2**30:.1f} GiB "
          f"({a.kv_memory_fraction} of the rest); context {a.context_len}, block {a.block_size}")
    print("| KV format | bytes/block | fill rows GiB | blocks | tokens | sequences at full context "
          "| × bf16 |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        name = "auto (bf16)" if r.kv_cache_dtype == "auto" else r.kv_cache_dtype
        print(f"| {name} | {r.block_bytes:,} | {r.fill_bytes / 2**30:.2f} | {r.num_blocks:,} | "
              f"{r.num_blocks * a.block_size:,} | {r.num_seqs} | "
              f"{r.num_seqs / rows[0].num_seqs:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
