"""Model configuration: a frozen view of an HF LLaMA `config.json`, and the named presets.

Presets live as HF-format JSON in `backend/presets/<name>.json` (data, not code), so that
torch-free readers (the simulator's roofline cost model) can load them by path with `json`.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PRESETS_DIR = Path(__file__).resolve().parent / "presets"
PRESETS: tuple[str, ...] = tuple(sorted(p.stem for p in PRESETS_DIR.glob("*.json")))
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM",)
DTYPE_NAMES = ("float32", "bfloat16", "float16")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class ConfigError(ValueError):
    """A config.json that does not describe a model we can run (one-line message)."""


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling_factor: float  # linear position interpolation: position / factor
    max_position_embeddings: int
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    torch_dtype: str  # one of DTYPE_NAMES: the checkpoint's dtype
    name: str = ""

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                      "num_attention_heads", "num_key_value_heads", "head_dim",
                      "max_position_embeddings"):
            if getattr(self, field) <= 0:
                raise ConfigError(f"config field {field} must be positive, got {getattr(self, field)}")

    # ---- derived values ------------------------------------------------------------------
    @property
    def num_queries_per_kv(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def num_params(self) -> int:
        """Parameter count (embeddings, layers, final norm, LM head unless tied)."""
        h, i = self.hidden_size, self.intermediate_size
        per_layer = h * (self.q_size + 2 * self.kv_size) + self.q_size * h + 3 * h * i + 2 * h
        embed = self.vocab_size * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return embed + self.num_hidden_layers * per_layer + h + head

    def weight_bytes(self, dtype: str) -> int:
        return self.num_params() * DTYPE_BYTES[dtype]

    def kv_bytes_per_token(self, dtype: str) -> int:
        """Bytes of K and V for one token across all layers."""
        return 2 * self.num_hidden_layers * self.kv_size * DTYPE_BYTES[dtype]

    # ---- constructors --------------------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], name: str = "") -> ModelConfig:
        archs = d.get("architectures") or []
        if not archs and d.get("model_type") == "llama":
            archs = ["LlamaForCausalLM"]
        if not any(a in SUPPORTED_ARCHITECTURES for a in archs):
            archs = archs or [d.get("model_type") or "<none>"]
            raise ConfigError(
                f"unsupported architecture {archs[0]!r} (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )
        if d.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"unsupported hidden_act {d['hidden_act']!r} (only silu)")
        if d.get("attention_bias") or d.get("mlp_bias"):
            raise ConfigError("attention_bias / mlp_bias checkpoints are not supported")
        try:
            heads = int(d["num_attention_heads"])
            hidden = int(d["hidden_size"])
            rope = d.get("rope_scaling") or d.get("rope_parameters")  # transformers 4 / 5
            theta = d.get("rope_theta")
            if theta is None:  # transformers >= 5 moves it under rope_parameters
                theta = (d.get("rope_parameters") or {}).get("rope_theta", 10000.0)
            factor = _linear_rope_factor(rope)
            eos = d.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
            dtype = str(d.get("torch_dtype") or d.get("dtype") or "float32")
            if dtype not in DTYPE_NAMES:
                raise ConfigError(f"unsupported torch_dtype {dtype!r}")
            return cls(
                vocab_size=int(d["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(d["intermediate_size"]),
                num_hidden_layers=int(d["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(d.get("num_key_value_heads") or heads),
                head_dim=int(d.get("head_dim") or hidden // heads),
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                rope_theta=float(theta),
                rope_scaling_factor=factor,
                max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                bos_token_id=None if d.get("bos_token_id") is None else int(d["bos_token_id"]),
                eos_token_ids=eos_ids,
                torch_dtype=dtype,
                name=name,
            )
        except KeyError as exc:
            raise ConfigError(f"config.json lacks required field {exc.args[0]!r}") from None

    @classmethod
    def from_json_file(cls, path: str | os.PathLike, name: str = "") -> ModelConfig:
        try:
            with open(path, encoding="utf-8") as f:
                d = json.load(f)
        except FileNotFoundError:
            raise ConfigError(f"missing file {path}") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
        return cls.from_hf_dict(d, name=name or Path(path).parent.name)

    @classmethod
    def from_preset(cls, name: str) -> ModelConfig:
        if name not in PRESETS:
            raise ConfigError(f"unknown preset {name!r} (presets: {', '.join(PRESETS)})")
        return cls.from_json_file(preset_path(name), name=name)


def preset_path(name: str) -> Path:
    return PRESETS_DIR / f"{name}.json"


def _linear_rope_factor(rope_scaling: Any) -> float:
    if not rope_scaling:
        return 1.0
    kind = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if kind == "default":
        return 1.0
    if kind != "linear":
        raise ConfigError(f"unsupported rope_scaling type {kind!r} (only linear)")
    return float(rope_scaling["factor"])
