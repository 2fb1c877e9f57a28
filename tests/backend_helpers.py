"""Helpers for the backend tests: tiny random HF LLaMA checkpoints and a hand-driven runner."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from backend.tokenizer import byte_level_bundle

# name -> LlamaConfig kwargs. GQA ratios 1, 4, 7; linear rope x4; odd vocab; tied / untied.
CHECKPOINTS = {
    "gqa1_untied_oddvocab": dict(vocab_size=263, hidden_size=64, intermediate_size=96,
                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                 tie_word_embeddings=False),
    "gqa4_tied_rope4": dict(vocab_size=300, hidden_size=64, intermediate_size=128,
                            num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                            head_dim=16, tie_word_embeddings=True,
                            rope_scaling={"rope_type": "linear", "factor": 4.0}),
    "gqa7_sharded": dict(vocab_size=261, hidden_size=112, intermediate_size=160,
                         num_hidden_layers=3, num_attention_heads=7, num_key_value_heads=1,
                         head_dim=16, tie_word_embeddings=False, rope_theta=100000.0,
                         rope_scaling={"rope_type": "linear", "factor": 4.0}),
}


def make_checkpoint(root: Path, name: str, seed: int = 0) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    kw = dict(CHECKPOINTS[name])
    rope_scaling = kw.pop("rope_scaling", None)
    theta = kw.pop("rope_theta", 10000.0)
    cfg = LlamaConfig(max_position_embeddings=512, initializer_range=0.08, bos_token_id=256,
                      eos_token_id=257, rope_theta=theta, rope_scaling=rope_scaling, **kw)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    path = root / name
    shard = "40KB" if "sharded" in name else "1GB"
    model.save_pretrained(path, max_shard_size=shard)
    bundle = byte_level_bundle()
    (path / "tokenizer.json").write_text(bundle.tokenizer_json)
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "chat_template": bundle.chat_template}))
    return path


def hf_model(path: Path):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@dataclass
class Chunk:
    request_id: str
    token_ids: list[int]
    start_pos: int
    block_table: list[int]
    is_prefill: bool = True
    sample: bool = True


@dataclass
class BlockAllocator:
    """Trivial contiguous allocation for hand-driven runner tests."""
    block_size: int
    next_block: int = 0
    tables: dict[str, list[int]] = field(default_factory=dict)

    def table(self, rid: str, num_tokens: int) -> list[int]:
        t = self.tables.setdefault(rid, [])
        while len(t) * self.block_size < num_tokens:
            t.append(self.next_block)
            self.next_block += 1
        return list(t)
