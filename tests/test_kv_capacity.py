"""Capacity per KV format (backend.kv.sizing) against the closed form of the pool arithmetic."""
import pytest

from backend.config import ModelConfig
from backend.kv.sizing import kv_capacity


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
