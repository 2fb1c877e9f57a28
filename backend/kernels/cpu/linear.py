"""bf16 projections on the CPU through oneDNN with weights packed once.

`torch.nn.functional.linear` on bf16 CPU tensors goes to oneDNN too, but re-lays the weight out
for its kernel on every call; `PackedLinear` keeps the weight in oneDNN's layout (packed at
load) and calls oneDNN's linear directly. Measured on an AMX / AVX-512 BF16 CPU, one thread
(`[M, 384] x [384, 640]`): M=1 0.049 -> 0.025 ms, M=200 0.128 -> 0.103 ms; results identical
(the same kernel, the same rounding). A transform applied from outside the model
(`pack_linears`), like the fp8 one: the model's code is unchanged.
"""
from __future__ import annotations

import logging
import os

import torch
from torch import nn

log = logging.getLogger("tidegate.backend")

PACK_HINT = 64  # the row count oneDNN picks the packed layout for; any M runs on it (measured)


def packing_supported() -> bool:
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


class PackedLinear(nn.Module):
    """y = x @ W.T (no bias), W bf16 [N, K] held packed; x bf16 [..., K] -> [..., N]."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_HINT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")


def pack_linears(model) -> int:
    """Replace every bf16 projection of `model` (a `LlamaModel` on the CPU; the LM head too, the
    embedding's weight when tied) by a `PackedLinear`. Returns how many were packed (0: not a
    bf16 model, oneDNN without bf16, or TIDEGATE_CPU_PACK=0: F.linear, for an A/B or for a
    transform that needs the `nn.Linear`s, such as `quantize_model`)."""
    if model.embed_tokens.weight.dtype != torch.bfloat16 or not packing_supported() \
            or model.tp is not None or os.environ.get("TIDEGATE_CPU_PACK", "1") == "0":
        return 0
    n = 0
    for layer in model.layers:
        for parent, name in ((layer.self_attn, "qkv_proj"), (layer.self_attn, "o_proj"),
                             (layer.mlp, "gate_up_proj"), (layer.mlp, "down_proj")):
            lin = getattr(parent, name)
            if type(lin) is nn.Linear and lin.bias is None:
                setattr(parent, name, PackedLinear(lin.weight))
                n += 1
    head = model.lm_head
    if head is None:  # tied: the head reads the embedding's weight, packed as a copy
        model.lm_head = PackedLinear(model.embed_tokens.weight)
        n += 1
    elif type(head) is nn.Linear and head.bias is None:
        model.lm_head = PackedLinear(head.weight)
        n += 1
    return n
