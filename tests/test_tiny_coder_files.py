"""The shipped tiny-coder model directory (models/tiny-coder, made by training/train.py)."""

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
    "corpus_manifest.json",
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
    added = {t["content"]: t["id"] for t in tok["added_tokens"]}
    assert vocab + len(set(added) - set(tok["model"]["vocab"])) == cfg["vocab_size"]
    tcfg = _json("tokenizer_config.json")
    stm = _json("special_tokens_map.json")
    gen = _json("generation_config.json")
    for role in ("bos", "eos", "pad"):
        name = tcfg[f"{role}_token"]
        assert stm[f"{role}_token"] == name
        assert added[name] == cfg[f"{role}_token_id"] == gen[f"{role}_token_id"]
    for t in ("<|system|>", "<|user|>", "<|assistant|>"):
        assert t in added
    # DeepSeek-Coder's fill-in-the-middle tokens, special, so the gateway's `suffix` finds them
    for t in ("<\uff5cfim\u2581begin\uff5c>", "<\uff5cfim\u2581hole\uff5c>",
              "<\uff5cfim\u2581end\uff5c>"):
        assert t in added and t in tcfg["additional_special_tokens"], t
        assert next(a for a in tok["added_tokens"] if a["content"] == t)["special"]
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


def _int8() -> bool:
    """Shipped as an int8 checkpoint (backend.model.int8: 2-D weights I8 + float32 row scales)."""
    q = _json("config.json").get("quantization_config") or {}
    return q.get("quant_method") == "tidegate-int8"


def test_safetensors_shapes_and_params():
    from safetensors import safe_open

    cfg = _json("config.json")
    h, kv, d = cfg["hidden_size"], cfg["num_key_value_heads"], cfg["head_dim"]
    total = 0
    with safe_open(str(MODEL_DIR / "model.safetensors"), framework="pt") as f:
        keys = {k for k in f.keys() if not k.endswith(".weight_scale")}  # noqa: SIM118
        for k in keys:
            sl = f.get_slice(k)
            two_d = len(sl.get_shape()) == 2
            want = "I8" if _int8() and two_d else "BF16"
            assert sl.get_dtype() == want, (k, sl.get_dtype())
            if want == "I8":
                assert f.get_slice(k + "_scale").get_shape() == [sl.get_shape()[0], 1]
            n = 1
            for s in sl.get_shape():
                n *= s
            total += n
        assert f.get_slice("model.layers.0.self_attn.k_proj.weight").get_shape() == [kv * d, h]
        assert f.get_slice("model.embed_tokens.weight").get_shape() == [cfg["vocab_size"], h]
    assert sum(k.startswith("model.layers.") for k in keys) == 9 * cfg["num_hidden_layers"]
    assert ("lm_head.weight" in keys) != cfg["tie_word_embeddings"]
    assert total == _json("metrics.json")["params"]["total"]
    # at most 30 MB: bf16 2 bytes a parameter, int8 1 byte (+ 4 per row for the scales)
    assert 10_000_000 <= total <= (29_000_000 if _int8() else 15_000_000)


def test_metrics_recorded():
    m = _json("metrics.json")
    ho = m["heldout"]
    assert math.isfinite(ho["bits_per_byte"]) and 0 < ho["bits_per_byte"] < 8
    # the goal: at most 0.6 x gzip -9 on the same held-out files
    assert ho["bits_per_byte"] <= 0.6 * ho["gzip9_bits_per_byte"]
    assert ho["xz9_bits_per_byte"] < ho["gzip9_bits_per_byte"]
    assert ho["tokens"] > 500_000
    assert m["tokens_seen"] > 0 and m["train_time_s"] > 0
    assert m["train_time_s"] <= 600  # the 10-minute budget of one H200
    assert isinstance(m["seed"], int) and m["device_name"]
    heldout = (MODEL_DIR / "heldout_files.txt").read_text().split()
    assert len(heldout) == ho["files"] > 0
    assert all(p.endswith(".py") and p.startswith("site-packages/") for p in heldout)
    log = [json.loads(line) for line in (MODEL_DIR / "train_log.jsonl").read_text().splitlines()]
    assert any(r["type"] == "train" for r in log) and any(r["type"] == "eval" for r in log)


def test_heldout_packages_whole_and_unseen():
    """Held-out files are exactly the held-out packages' files, and no training source is one."""
    man = _json("corpus_manifest.json")
    packages = set(man["heldout_packages"])
    roles = {s["name"].lower(): s["role"] for s in man["sources"]}
    assert packages and all(roles[p] == "heldout" for p in packages)
    assert not packages & set(man["validation_packages"])
    top = {p.split("/")[1] for p in (MODEL_DIR / "heldout_files.txt").read_text().split()}
    assert packages <= top  # their import names equal the distribution names
    for s in man["sources"]:
        if s["role"] == "train":
            assert s["name"].lower() not in packages
            assert s["spdx"] and all(i in man["permissive_spdx"] for i in s["spdx"]), s


def test_loads_with_transformers_and_generates(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    tok = transformers.AutoTokenizer.from_pretrained(str(MODEL_DIR))
    weights = MODEL_DIR
    if _int8():  # transformers reads its dequantization (python -m backend.model.int8 dequantize)
        from backend.model.int8 import dequantize_checkpoint

        dequantize_checkpoint(MODEL_DIR, tmp_path / "bf16")
        weights = tmp_path / "bf16"
    model = transformers.LlamaForCausalLM.from_pretrained(
        str(weights), dtype=torch.float32
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
