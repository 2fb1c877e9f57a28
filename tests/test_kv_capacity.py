"""Capacity per KV format (backend.kv.sizing) against the closed form of the pool arithmetic and
against what the engine itself sizes (`backend.engine.assemble.size_kv_pool`)."""
from types import SimpleNamespace

import pytest
import torch

from backend.config import ModelConfig
from backend.engine import assemble
from backend.kv.sizing import kv_capacity


@pytest.mark.parametrize("fmt", ["auto", "fp8", "int4-fp8"])
def test_capacity_is_the_blocks_the_engine_allocates(fmt, monkeypatch):
    """kv_capacity (what BENCHMARKS' capacity table prints) is the engine's own pool size: the
    33B preset's bf16 weights loaded on a 139 GiB device, the engine's defaults (issue 27: the
    closed-form test below checked kv_capacity only against a copy of its own formula)."""
    c = ModelConfig.from_preset("deepseek-coder-33b")
    mem = 139 * 2**30
    loaded = SimpleNamespace(config=c, dtype=torch.bfloat16, device=torch.device("cuda"))
    # what the device reports free once the weights are loaded
    monkeypatch.setattr(assemble, "available_memory",
                        lambda device: mem - c.weight_bytes("bfloat16"))
    cfg = assemble.BackendConfig(model="deepseek-coder-33b", device="cuda", kv_cache_dtype=fmt)
    engine_blocks = assemble.size_kv_pool(cfg, loaded, max_model_len=16384)
    assert kv_capacity(c, mem, 16384, fmt).num_blocks == engine_blocks


def test_bf16_capacity_is_the_closed_form():
    c = ModelConfig.from_preset("deepseek-coder-33b")
    mem = 139 * 2**30
    cap = kv_capacity(c, mem, 16384, "auto")
    per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 2  # K and V, bf16
    assert cap.block_bytes == 16 * per_token
    kv = int(0.85 * (mem - c.num_params() * 2))
    assert cap.num_blocks == kv // (16 * per_token)
    assert cap.num_seqs == cap.num_blocks // 1024


def test_quantized_formats_hold_more_in_the_order_of_their_bytes():
    c = ModelConfig.from_preset("deepseek-coder-33b")
    caps = {f: kv_capacity(c, 139 * 2**30, 16384, f) for f in ("auto", "fp8", "int4-fp8")}
    assert caps["auto"].num_seqs < caps["fp8"].num_seqs < caps["int4-fp8"].num_seqs
    for f, cap in caps.items():  # the same pool bytes (less the fill rows), per block size
        assert cap.num_blocks == (caps["auto"].kv_bytes - cap.fill_bytes) // cap.block_bytes, f
    # int4 keys keep 257 sequences' block being filled in bf16: 62 layers x 8 kv heads x 128
    # channels x 2 bytes x 16 tokens each; the other formats none
    assert caps["int4-fp8"].fill_bytes == 257 * 62 * 8 * 128 * 2 * 16
    assert caps["fp8"].fill_bytes == caps["auto"].fill_bytes == 0
    # fp8: one byte per element + a 4-byte scale per (token, head) instead of two bytes
    assert caps["fp8"].block_bytes / caps["auto"].block_bytes == pytest.approx((128 + 4) / 256)


def test_weights_that_do_not_fit_are_refused():
    with pytest.raises(ValueError):
        kv_capacity(ModelConfig.from_preset("deepseek-coder-33b"), 40 * 2**30, 16384)


@pytest.mark.parametrize("tied", [True, False])
def test_fp8_served_weight_bytes_are_the_quantized_models(tied):
    """`served_weight_bytes(..., "fp8")` (what the capacity table charges fp8 weights) against
    the bytes of a model the engine's own transform quantized, tied and untied LM head."""
    import dataclasses

    from backend.kv.sizing import served_weight_bytes
    from backend.model.llama import LlamaModel
    from backend.model.quantization import quantize_model

    c = dataclasses.replace(ModelConfig.from_preset("tiny"), tie_word_embeddings=tied)
    model = LlamaModel(c, max_model_len=64).to(torch.bfloat16)
    quantize_model(model, "fp8", check_device=False)
    held = {id(t): t for name, t in [*model.named_parameters(), *model.named_buffers()]
            if not name.endswith("cos_sin")}  # the rotary table is not a weight
    real = sum(t.numel() * t.element_size() for t in held.values())
    assert served_weight_bytes(c, "bfloat16", "fp8") == real
    assert served_weight_bytes(c, "bfloat16") == c.weight_bytes("bfloat16")
    assert kv_capacity(c, 1 << 30, 2048, quantization="fp8").num_blocks > \
        kv_capacity(c, 1 << 30, 2048).num_blocks
