"""Cost models: roofline arithmetic, capacity, vectorized decode stretches, measured profiles."""
import json

import numpy as np
import pytest

from sims.cost import ConstantCost, RooflineConfig, RooflineCost
from sims.hardware import GPUS, allreduce_time, get_gpu
from sims.model_shape import load_model_shape
from sims.profile_cost import ProfileCost


def test_presets_have_their_real_sizes():
    assert load_model_shape("deepseek-coder-33b").num_params == pytest.approx(33.3e9, rel=0.01)
    assert load_model_shape("deepseek-coder-6.7b").num_params == pytest.approx(6.74e9, rel=0.01)
    assert load_model_shape("deepseek-coder-1.3b").num_params == pytest.approx(1.35e9, rel=0.01)


def test_config_json_path_and_unknown_name(tmp_path):
    cfg = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    shape = load_model_shape(str(tmp_path))
    assert (shape.head_dim, shape.kv_elems_per_token()) == (16, 2 * 2 * 32)
    with pytest.raises(ValueError, match="no preset"):
        load_model_shape("no-such-model")


def test_gpu_table_h200_uses_measured_figures():
    h200 = get_gpu("H200")
    assert h200.bandwidth == pytest.approx(4.28e12) and h200.datasheet_bandwidth == pytest.approx(4.8e12)
    assert h200.bf16_flops == pytest.approx(790e12) and not h200.estimated
    assert GPUS["a100"].peak_flops("fp8") == GPUS["a100"].bf16_flops  # no fp8 tensor cores
    with pytest.raises(ValueError):
        get_gpu("tpu")


def test_roofline_decode_is_bandwidth_bound_and_matches_hand_arithmetic():
    shape, gpu = load_model_shape("deepseek-coder-6.7b"), get_gpu("h200")
    cost = RooflineCost(shape, gpu, RooflineConfig(overhead_s=0.0))
    # batch 1, 1000 context tokens: weights + KV read + KV write, all over bandwidth
    expect = (shape.num_params * 2 + 1001 * shape.kv_elems_per_token() * 2) / gpu.bandwidth
    assert cost.step_time(1, 0, 1000) == pytest.approx(expect, rel=1e-9)
    # a 2048-token prefill is compute bound
    t = cost.step_time(0, 2048, 2048)
    assert t > 2 * 2048 * shape.matmul_params_per_token / gpu.bf16_flops * 0.999
    assert t > (shape.num_params * 2) / gpu.bandwidth


def test_fp8_kv_and_tp_shrink_kv_bytes_and_grow_capacity():
    shape, gpu = load_model_shape("deepseek-coder-33b"), get_gpu("h200")
    base = RooflineCost(shape, gpu)
    fp8 = RooflineCost(shape, gpu, RooflineConfig(kv_dtype="fp8"))
    assert fp8.kv_bytes_per_token == base.kv_bytes_per_token / 2
    tp2 = RooflineCost(shape, gpu, RooflineConfig(tp=2))
    free1 = gpu.memory_bytes * 0.9 - shape.num_params * 2 - 2 * 2**30
    assert base.num_kv_blocks(16) == int(free1 // (16 * base.kv_bytes_per_token))
    assert tp2.num_kv_blocks(16) > 2 * base.num_kv_blocks(16)  # weights halve too
    # TP adds all-reduces but halves the bytes: decode at batch 1 gets faster, not 2x
    t1, t2 = base.step_time(1, 0, 512), tp2.step_time(1, 0, 512)
    assert t1 / 2 < t2 < t1
    with pytest.raises(ValueError):
        RooflineCost(shape, gpu, RooflineConfig(tp=3))


def test_decode_times_equal_single_steps():
    cost = RooflineCost(load_model_shape("deepseek-coder-1.3b"), get_gpu("h100"))
    vec = cost.decode_times(37, 5000, 50)
    single = [cost.step_time(37, 0, 5000 + 37 * i) for i in range(50)]
    np.testing.assert_allclose(vec, single, rtol=1e-12)
    assert ConstantCost(0.01).decode_times(3, 0, 4).tolist() == [0.01] * 4


def test_allreduce_ring_formula():
    assert allreduce_time(1e6, 1, 1e9, 1e-5) == 0.0
    assert allreduce_time(1e6, 4, 1e9, 1e-5) == pytest.approx(1e-5 + 1.5e-3)


def test_profile_cost_exact_at_points_and_linear_outside(tmp_path):
    pts = [(d, p, c) for d in (1, 8, 32, 64) for p in (0, 256, 1024) for c in (0, 8192, 32768)]
    t = [1e-3 + 2e-5 * d + 4e-6 * p + 1e-8 * c + 1e-10 * p * p + (3e-4 if d == 8 else 0.0)
         for d, p, c in pts]
    doc = {"block_size": 16, "num_kv_blocks": 1000,
           "points": [{"num_decode_seqs": d, "num_prefill_tokens": p, "num_context_tokens": c,
                       "step_ms": x * 1e3} for (d, p, c), x in zip(pts, t)]}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(doc))
    cost = ProfileCost.from_json(path, ctx_quantum=1)
    for (d, p, c), x in zip(pts, t):
        assert cost.step_time(d, p, c) == pytest.approx(x, rel=1e-6)
    # far outside the measured range: the linear model extrapolates
    assert cost.step_time(128, 0, 65536) == pytest.approx(
        1e-3 + 2e-5 * 128 + 1e-8 * 65536, rel=0.05)
    assert cost.num_kv_blocks(16) == 1000 and cost.num_kv_blocks(32) == 500
    assert cost.step_time(0, 0, 0) == 0.0


@pytest.mark.parametrize("flop_scale", [1.0, 1e3, 1e5])
def test_decode_span_is_the_sum_of_decode_times_across_the_memory_compute_crossing(flop_scale):
    cost = RooflineCost(load_model_shape("deepseek-coder-1.3b"), get_gpu("h200"))
    # scale compute up so that some stretches cross from memory- to compute-bound and back
    cost._f_per_ctx *= flop_scale
    crossed = False
    for n in (1, 7, 64, 512):
        for ctx in (n, 300 * n, 4000 * n):
            for k in (1, 2, 3, 50, 2000):
                times = cost.decode_times(n, ctx, k)
                assert cost.decode_span(n, ctx, k) == pytest.approx(times.sum(), rel=1e-12)
                np.testing.assert_allclose(
                    cost.decode_step_times(np.full(k, n), ctx + n * np.arange(k)), times, rtol=1e-12)
                cx = ctx + n * np.arange(k)
                mem = cost._t_weights + cost._t_kv_per_ctx * cx + cost._t_kv_per_tok * n
                flop = cost._f_per_tok * n + cost._f_per_ctx * cx
                crossed |= bool(len(set(flop > mem)) > 1)
    assert cost.decode_span(5, 100, 0) == 0.0
    assert crossed or flop_scale == 1.0
    c = ConstantCost(0.004)
    assert c.decode_span(3, 10, 7) == pytest.approx(c.decode_times(3, 10, 7).sum())
    np.testing.assert_array_equal(c.decode_step_times(np.array([0, 2]), np.array([0, 5])), [0.0, 0.004])
