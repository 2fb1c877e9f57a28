"""The shipped tiny-coder model directory (models/tiny-coder, made by scripts/train_tiny_coder.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

MODEL_DIR = Path(__file__).resolve().parents[1] / "models" / "tiny-coder"
REQUIRED = [
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "README.md",
    "loss.png",
    "train_log.jsonl",
    "heldout_files.txt",
    "metrics.json",
]
MAX_BYTES = 30 * 1000 * 1000


def _json(name: str) -> dict:
    return json.loads((MODEL_DIR / name).read_text())


def test_files_present():
    missing = [f for f in REQUIRED if not (MODEL_DIR / f).is_file()]
    assert not missing, missing
    # the weights must be real, not a Git LFS pointer
    assert (MODEL_DIR / "model.safetensors").stat().st_size > 10_000_000


def test_total_size_within_limit():
    total = sum(p.stat().st_size for p in MODEL_DIR.rglob("*") if p.is_file())
    assert total <= MAX_BYTES, total


def test_config_consistent():
    cfg = _json("config.json")
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["model_type"] == "llama"
    assert cfg["hidden_size"] % cfg["num_attention_heads"] == 0
    assert cfg["head_dim"] == cfg["hidden_size"] // cfg["num_attention_heads"]
    # GQA: fewer KV heads than query heads, and a whole number of query heads per KV head
    assert cfg["num_key_value_heads"] < cfg["num_attention_heads"]
    assert cfg["num_attention_heads"] % cfg["num_key_value_heads"] == 0
    assert cfg["hidden_act"] == "silu"
    assert cfg["rope_theta"] == cfg["rope_parameters"]["rope_theta"] == 10000.0
    assert cfg["max_position_embeddings"] in (1024, 2048)

    tok = json.loads((MODEL_DIR / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = len(tok["model"]["vocab"])
    assert vocab == cfg["vocab_size"] == 4096
    added = {t["content"]: t["id"] for t in tok["added_tokens"]}
    tcfg = _json("tokenizer_config.json")
    stm = _json("special_tokens_map.json")
    gen = _json("generation_config.json")
    for role in ("bos", "eos", "pad"):
        name = tcfg[f"{role}_token"]
        assert stm[f"{role}_token"] == name
        assert added[name] == cfg[f"{role}_token_id"] == gen[f"{role}_token_id"]
    for t in ("<|system|>", "<|user|>", "<|assistant|>"):
        assert t in added
    assert "<|assistant|>" in tcfg["chat_template"]

    m = _json("metrics.json")
    for k in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
        "tie_word_embeddings",
    ):
        assert m["model_config"][k] == cfg[k], k


def test_safetensors_shapes_and_params():
    from safetensors import safe_open

    cfg = _json("config.json")
    h, kv, d = cfg["hidden_size"], cfg["num_key_value_heads"], cfg["head_dim"]
    total = 0
    with safe_open(str(MODEL_DIR / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
        for k in keys:
            sl = f.get_slice(k)
            assert sl.get_dtype() in ("BF16", "bfloat16"), (k, sl.get_dtype())
            n = 1
            for s in sl.get_shape():
                n *= s
            total += n
        assert f.get_slice("model.layers.0.self_attn.k_proj.weight").get_shape() == [kv * d, h]
        assert f.get_slice("model.embed_tokens.weight").get_shape() == [cfg["vocab_size"], h]
    assert sum(k.startswith("model.layers.") for k in keys) == 9 * cfg["num_hidden_layers"]
    assert ("lm_head.weight" in keys) != cfg["tie_word_embeddings"]
    assert total == _json("metrics.json")["params"]["total"]
    assert 10_000_000 <= total <= 15_000_000


def test_metrics_recorded():
    m = _json("metrics.json")
    ppl = m["heldout_ppl"]
    assert math.isfinite(ppl) and 1.0 < ppl < m["model_config"]["vocab_size"] / 100
    assert m["heldout_tokens"] > 100_000
    assert m["tokens_seen"] > 0 and m["train_time_s"] > 0
    assert m["train_time_s"] <= m["time_budget_s"] + 1
    assert isinstance(m["seed"], int) and m["device_name"]
    heldout = (MODEL_DIR / "heldout_files.txt").read_text().split()
    assert len(heldout) == m["corpus"]["files"]["heldout"] > 0
    assert all(p.endswith(".py") and not p.startswith("/") for p in heldout)
    log = [json.loads(line) for line in (MODEL_DIR / "train_log.jsonl").read_text().splitlines()]
    assert any(r["type"] == "train" for r in log) and any(r["type"] == "eval" for r in log)


def test_heldout_split_rule():
    """heldout_files.txt is exactly the documented hash bucket (sha1 of the relative path, mod 20 == 0)."""
    import hashlib

    for rel in (MODEL_DIR / "heldout_files.txt").read_text().split():
        assert int(hashlib.sha1(rel.encode("utf-8")).hexdigest(), 16) % 20 == 0, rel


def test_loads_with_transformers_and_generates():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    tok = transformers.AutoTokenizer.from_pretrained(str(MODEL_DIR))
    model = transformers.LlamaForCausalLM.from_pretrained(
        str(MODEL_DIR), dtype=torch.float32
    ).eval()
    ids = tok("def fibonacci(n):", return_tensors="pt").input_ids
    assert ids[0, 0].item() == tok.bos_token_id
    with torch.no_grad():
        logits = model(ids).logits
        assert torch.isfinite(logits).all()
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=16,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
        )
    text = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert len(text.strip()) > 0
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat.endswith("<|assistant|>\n")
