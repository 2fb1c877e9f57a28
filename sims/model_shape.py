"""Model shapes for cost models: read an HF `config.json` (or a backend preset) as data.

`sims/` never imports `backend`; presets are read by path from `backend/presets/<name>.json`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

PRESETS_DIR = Path(__file__).resolve().parents[1] / "backend" / "presets"

#: bytes per element of a weight or KV dtype name. `int4-fp8`: INT4 keys + FP8 values (mean 0.75).
DTYPE_BYTES = {"float32": 4.0, "fp32": 4.0, "bfloat16": 2.0, "bf16": 2.0, "float16": 2.0,
               "fp16": 2.0, "fp8": 1.0, "int4-fp8": 0.75}


def dtype_bytes(name: str) -> float:
    try:
        return DTYPE_BYTES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(DTYPE_BYTES)}") from None


@dataclass(frozen=True)
class ModelShape:
    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    max_model_len: int
    torch_dtype: str = "bfloat16"

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        """Matmul parameters of one decoder layer (q,k,v,o + gate,up,down) plus its two norms."""
        h = self.hidden_size
        attn = h * self.q_size * 2 + h * self.kv_size * 2
        mlp = 3 * h * self.intermediate_size
        return attn + mlp + 2 * h

    @property
    def num_params(self) -> int:
        emb = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else emb
        return self.num_layers * self.layer_params + emb + head + self.hidden_size

    @property
    def matmul_params_per_token(self) -> int:
        """Parameters a token multiplies through (layers + LM head; the embedding is a lookup)."""
        return self.num_layers * self.layer_params + self.vocab_size * self.hidden_size

    def kv_elems_per_token(self) -> int:
        """K and V elements one token stores across all layers."""
        return 2 * self.num_layers * self.kv_size


def load_model_shape(model: str) -> ModelShape:
    """`model` is a preset name (backend/presets/<name>.json), a config.json path or a directory."""
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    elif not path.exists():
        preset = PRESETS_DIR / f"{model}.json"
        if not preset.exists():
            known = ", ".join(sorted(p.stem for p in PRESETS_DIR.glob("*.json"))) or "none"
            raise ValueError(f"no preset or config file {model!r} (presets: {known})")
        path = preset
    cfg = json.loads(path.read_text())
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    name = model if not Path(model).exists() else (path.parent.name or path.stem)
    return ModelShape(
        name=name,
        num_layers=int(cfg["num_hidden_layers"]),
        hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        vocab_size=int(cfg["vocab_size"]),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_model_len=int(cfg.get("max_position_embeddings", 4096)),
        torch_dtype=str(cfg.get("torch_dtype") or "bfloat16"),
    )
