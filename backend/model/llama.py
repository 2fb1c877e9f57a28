"""LLaMA as DeepSeek-Coder uses it: GQA, RoPE (linear scaling), RMSNorm, SwiGLU, LM head.

The model knows nothing about serving. Per-step metadata arrives in a `ForwardContext`; K/V
live in a `KVCache` passed to `forward`; attention and the norm/rotary/activation ops are
injected objects (`backend.kernels.reference.attention.TorchAttention`, `backend.kernels.reference.ops.TorchOps` by default; the
Triton versions from `backend/kernels/` have the same call signatures).

Weights are fused: `qkv_proj` = [q; k; v] rows, `gate_up_proj` = [gate; up] rows (the loader
maps the separate HF tensors into them).

Tensor parallelism (`backend.server.ranks`): one rank's model is this same module built from a
shard config (its heads, KV heads and MLP columns) with `tp` set to the rank's group. The model
then makes the three calls Megatron sharding needs and nothing else: a vocabulary-parallel
embedding lookup, an all-reduce of the row-parallel o_proj and down_proj partial sums, and an
all-gather of the vocabulary-parallel logits.
"""
from __future__ import annotations

import torch
from torch import nn

from backend.config import ModelConfig
from backend.kernels.forward_context import ForwardContext
from backend.kernels.reference.attention import TorchAttention
from backend.kernels.reference.ops import TORCH_OPS, rope_cos_sin
from backend.kv.pools import KVCache


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size, self.kv_size = config.q_size, config.kv_size
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, ctx: ForwardContext,
                ops, attn) -> torch.Tensor:
        return self.attend(self.qkv_proj(x), positions, cos_sin, k_cache, v_cache, ctx, ops,
                           attn)

    def attend(self, qkv: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
               k_cache: torch.Tensor, v_cache: torch.Tensor, ctx: ForwardContext,
               ops, attn) -> torch.Tensor:
        """Everything after the qkv projection: qkv [T, q + 2 kv] -> o_proj output [T, hidden]."""
        num_tokens = qkv.shape[0]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(num_tokens, self.num_heads, self.head_dim)
        k = k.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        q, k = ops.rotary(q, k, positions, cos_sin)
        o = attn(q, k, v, k_cache, v_cache, ctx)  # [T, H, D]
        return self.o_proj(o.reshape(num_tokens, self.q_size))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, ops) -> torch.Tensor:
        return self.down(self.gate_up_proj(x), ops)

    def down(self, gate_up: torch.Tensor, ops) -> torch.Tensor:
        return ops.silu_mul_linear(gate_up, self.down_proj)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaModel(nn.Module):
    """`forward(input_ids [T], positions [T], ctx, kv) -> hidden [T, hidden]`;
    `compute_logits(hidden [N, hidden]) -> [N, vocab]` in fp32."""

    def __init__(self, config: ModelConfig, max_model_len: int | None = None,
                 ops=TORCH_OPS, attn=None) -> None:
        super().__init__()
        self.config = config
        self.max_model_len = max_model_len or config.max_position_embeddings
        self.ops = ops
        self.attn = attn or TorchAttention(config.head_dim ** -0.5)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = None if config.tie_word_embeddings else \
            nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        # fp32 [max_model_len, head_dim] cos|sin table; rebuilt on the right device by `init_rope`
        self.register_buffer("cos_sin", torch.empty(0), persistent=False)
        self.tp = None  # backend.server.ranks.TPGroup when this model is one rank's shard

    def init_rope(self) -> None:
        """(Re)compute the rotary table on the model's device; call after moving the model."""
        c = self.config
        self.cos_sin = rope_cos_sin(c.head_dim, self.max_model_len, c.rope_theta,
                                    c.rope_scaling_factor, device=self.embed_tokens.weight.device)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext,
                kv: KVCache) -> torch.Tensor:
        ops, eps, tp = self.ops, self.config.rms_norm_eps, self.tp
        # [T, hidden]; a rank holds a slice of the vocabulary: the lookup is summed over ranks
        h = self.embed_tokens(input_ids) if tp is None else tp.embed(self.embed_tokens, input_ids)
        residual = None
        for i, layer in enumerate(self.layers):
            # each norm goes with the projection after it, so a kernel ops object can run the
            # pair as one GEMV (KernelOps, TIDEGATE_FUSED_NORM_GEMV=1, one-row steps)
            qkv, residual = ops.add_rms_norm_linear(h, residual, layer.input_layernorm.weight,
                                                    eps, layer.self_attn.qkv_proj)
            h = layer.self_attn.attend(qkv, positions, self.cos_sin, kv.k_caches[i],
                                       kv.v_caches[i], ctx, ops, self.attn)
            if tp is not None:  # row-parallel o_proj: each rank holds a partial sum
                h = tp.all_reduce(h)
            gate_up, residual = ops.add_rms_norm_linear(
                h, residual, layer.post_attention_layernorm.weight, eps, layer.mlp.gate_up_proj)
            h = layer.mlp.down(gate_up, ops)
            if tp is not None:  # row-parallel down_proj
                h = tp.all_reduce(h)
        h, _ = ops.add_rms_norm(h, residual, self.norm.weight, eps)
        return h

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head is not None:  # a module call, so a linear-layer transform applies
            logits = self.lm_head(hidden)
        else:
            logits = torch.nn.functional.linear(hidden, self.embed_tokens.weight)
        if self.tp is not None:  # each rank computed its vocabulary slice's columns
            logits = self.tp.gather_vocab(logits)
        return logits.float()
