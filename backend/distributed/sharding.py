"""Which slice of each weight one tensor-parallel rank holds (Megatron-style), as arithmetic.

Rank r of N holds (H heads, K KV heads, I MLP columns, V vocabulary rows, D head_dim):

    qkv_proj      column-parallel: q rows of heads [r·H/N, (r+1)·H/N), k and v rows of its KV heads
    o_proj        row-parallel: the input columns of those query heads (the partial sums are
                  all-reduced by the model, `backend.model.llama`)
    gate_up_proj  column-parallel: gate and up rows [r·I/N, (r+1)·I/N)
    down_proj     row-parallel: the same I/N input columns (all-reduced)
    embed_tokens  vocabulary-parallel: rows [r·Vp, (r+1)·Vp), Vp = ceil(V / N); the last rank's
    lm_head       rows past V are zeros (padding), and the gathered logits are cut back to V
    norms         replicated

KV heads: with K divisible by N each rank holds K/N of them; with fewer KV heads than ranks (N a
multiple of K) each rank holds the one KV head its query heads read (query head h reads KV head
h // (H/K)), so a KV head is replicated on N/K ranks. Anything else is refused.

A rank's model is the ordinary `LlamaModel` built from `Shard.local_config()` (its head, KV-head
and MLP counts; vocabulary and everything else as in the checkpoint) with the embedding and LM
head resized to Vp rows. `take` cuts a rank's piece out of a full (unsharded) parameter: random
weights and the tests use it, so a TP=N model with the same seed is the TP=1 model, split.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from backend.config import ConfigError, ModelConfig


def check_tp_size(config: ModelConfig, size: int) -> None:
    """Raise `ConfigError` (one line) unless `config` can be split over `size` ranks."""
    if size < 1:
        raise ConfigError(f"--tensor-parallel-size must be >= 1, got {size}")
    h, k, i = config.num_attention_heads, config.num_key_value_heads, config.intermediate_size
    if h % size:
        raise ConfigError(f"--tensor-parallel-size {size} does not divide the {h} attention heads")
    if k % size and size % k:
        raise ConfigError(f"--tensor-parallel-size {size} neither divides the {k} KV heads nor is "
                          "a multiple of them")
    if i % size:
        raise ConfigError(f"--tensor-parallel-size {size} does not divide intermediate_size {i}")


@dataclass(frozen=True)
class Shard:
    config: ModelConfig  # the full model's
    rank: int
    size: int

    def __post_init__(self) -> None:
        check_tp_size(self.config, self.size)
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank {self.rank} outside [0, {self.size})")

    # ---- counts -------------------------------------------------------------------------
    @property
    def num_heads(self) -> int:
        return self.config.num_attention_heads // self.size

    @property
    def num_kv_heads(self) -> int:
        return max(1, self.config.num_key_value_heads // self.size)

    @property
    def first_kv_head(self) -> int:
        c = self.config
        if c.num_key_value_heads >= self.size:
            return self.rank * self.num_kv_heads
        return self.rank * self.num_heads // c.num_queries_per_kv  # the one KV head it reads

    @property
    def intermediate(self) -> int:
        return self.config.intermediate_size // self.size

    @property
    def vocab_rows(self) -> int:
        """Embedding / LM-head rows per rank (padded: the same on every rank)."""
        return -(-self.config.vocab_size // self.size)

    @property
    def vocab_start(self) -> int:
        return self.rank * self.vocab_rows

    @property
    def vocab_stop(self) -> int:
        """End of this rank's real (unpadded) vocabulary rows."""
        return min(self.config.vocab_size, self.vocab_start + self.vocab_rows)

    def local_config(self) -> ModelConfig:
        """The config of this rank's model: its heads, KV heads and MLP columns."""
        return replace(self.config, num_attention_heads=self.num_heads,
                       num_key_value_heads=self.num_kv_heads, intermediate_size=self.intermediate)

    # ---- pieces of the checkpoint's tensors ------------------------------------------------
    def hf_piece(self, name: str) -> tuple[int, int, int] | None:
        """(dim, start, stop) of this rank's piece of an HF tensor (`model.` prefix optional),
        None for a replicated one."""
        d = self.config.head_dim
        if name.endswith("self_attn.q_proj.weight"):
            return 0, self.rank * self.num_heads * d, (self.rank + 1) * self.num_heads * d
        if name.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight")):
            return 0, self.first_kv_head * d, (self.first_kv_head + self.num_kv_heads) * d
        if name.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight")):
            return 0, self.rank * self.intermediate, (self.rank + 1) * self.intermediate
        if name.endswith("self_attn.o_proj.weight"):
            return 1, self.rank * self.num_heads * d, (self.rank + 1) * self.num_heads * d
        if name.endswith("mlp.down_proj.weight"):
            return 1, self.rank * self.intermediate, (self.rank + 1) * self.intermediate
        if name.removeprefix("model.") in ("embed_tokens.weight", "lm_head.weight"):
            start = min(self.vocab_start, self.config.vocab_size)  # a rank may hold padding only
            return 0, start, self.vocab_stop
        return None

    def hf_full_shape(self, name: str, local_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape an HF tensor must have in the checkpoint (from the full config)."""
        c = self.config
        if name.endswith("self_attn.q_proj.weight"):
            return c.q_size, c.hidden_size
        if name.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight")):
            return c.kv_size, c.hidden_size
        if name.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight")):
            return c.intermediate_size, c.hidden_size
        if name.endswith("self_attn.o_proj.weight"):
            return c.hidden_size, c.q_size
        if name.endswith("mlp.down_proj.weight"):
            return c.hidden_size, c.intermediate_size
        if name.removeprefix("model.") in ("embed_tokens.weight", "lm_head.weight"):
            return c.vocab_size, c.hidden_size
        return local_shape

    # ---- pieces of our (fused) parameters --------------------------------------------------
    def full_shape(self, param: str, local_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The unsharded shape of one of our parameters (names as in `LlamaModel`)."""
        c = self.config
        if param.endswith("qkv_proj.weight"):
            return c.q_size + 2 * c.kv_size, c.hidden_size
        if param.endswith("gate_up_proj.weight"):
            return 2 * c.intermediate_size, c.hidden_size
        if param.endswith("o_proj.weight"):
            return c.hidden_size, c.q_size
        if param.endswith("down_proj.weight"):
            return c.hidden_size, c.intermediate_size
        if param in ("embed_tokens.weight", "lm_head.weight"):
            return c.vocab_size, c.hidden_size
        return local_shape

    def take(self, param: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's piece of a full parameter of ours (fused layouts; vocabulary padded)."""
        c, d = self.config, self.config.head_dim
        if param.endswith("qkv_proj.weight"):
            q0, k0 = self.rank * self.num_heads * d, self.first_kv_head * d
            q_rows, kv_rows = self.num_heads * d, self.num_kv_heads * d
            return torch.cat([full[q0:q0 + q_rows],
                              full[c.q_size + k0:c.q_size + k0 + kv_rows],
                              full[c.q_size + c.kv_size + k0:c.q_size + c.kv_size + k0 + kv_rows]])
        if param.endswith("gate_up_proj.weight"):
            i0, n = self.rank * self.intermediate, self.intermediate
            i = c.intermediate_size
            return torch.cat([full[i0:i0 + n], full[i + i0:i + i0 + n]])
        if param.endswith(("o_proj.weight", "down_proj.weight")):
            _, start, stop = self.hf_piece("self_attn.o_proj.weight" if "o_proj" in param
                                           else "mlp.down_proj.weight")
            return full[:, start:stop]
        if param in ("embed_tokens.weight", "lm_head.weight"):
            out = full.new_zeros(self.vocab_rows, full.shape[1])
            _, start, stop = self.hf_piece("embed_tokens.weight")
            out[:stop - start] = full[start:stop]
            return out
        return full
