"""The simulator's tensor-parallel terms match what backend.server.ranks runs (closed form):
per step 2 all-reduces per layer + 1 for the vocabulary-parallel embedding + the logits'
all-gather; with fewer KV heads than GPUs each GPU holds a copy of one KV head."""
from __future__ import annotations

from dataclasses import replace

import pytest

from sims.cost import RooflineConfig, RooflineCost
from sims.hardware import allreduce_time, get_gpu, link
from sims.model_shape import dtype_bytes, load_model_shape
from sims.plan import PlanConfig, evaluate


def test_plan_tp2_batch1_decode_is_the_roofline_plus_the_collectives_the_backend_runs():
    s, gpu = load_model_shape("deepseek-coder-33b"), get_gpu("h200")
    cfg = PlanConfig(batch=1, context_len=512)
    bw, lat = link(gpu, "nvlink")
    wb, kvb = dtype_bytes("bf16"), dtype_bytes("bf16")
    L, h = s.num_layers, s.hidden_size
    weights = L * s.layer_params * wb / 2 + s.vocab_size * h * wb / 2   # 8 KV heads: all split
    kv = L * 2 * s.kv_size * kvb / 2 * (512 + 1)
    ar = allreduce_time(h * 2.0, 2, bw, lat)
    gather = lat + 0.5 * s.vocab_size * 2.0 / bw
    expected = (weights + kv) / gpu.bandwidth + cfg.overhead_s + (2 * L + 1) * ar + gather
    assert evaluate(s, gpu, 2, 2, 1, cfg).tpot_ms == pytest.approx(expected * 1e3, rel=1e-9)


def test_fewer_kv_heads_than_gpus_replicates_them():
    s = replace(load_model_shape("deepseek-coder-33b"), num_kv_heads=2)
    gpu = get_gpu("h200")
    c2 = RooflineCost(s, gpu, RooflineConfig(tp=2))
    c4 = RooflineCost(s, gpu, RooflineConfig(tp=4))
    c8 = RooflineCost(s, gpu, RooflineConfig(tp=8))
    assert (c2.kv_shards, c4.kv_shards, c8.kv_shards) == (2, 2, 2)
    # the same KV bytes per GPU per token at tp 2, 4, 8: a step reads as much KV on each GPU
    assert c2._t_kv_per_ctx == c4._t_kv_per_ctx == c8._t_kv_per_ctx
    # capacity: more room for KV at tp=4 (fewer weights per GPU), not twice as many tokens
    b2, b4 = c2.num_kv_blocks(16), c4.num_kv_blocks(16)
    assert b2 < b4 < 1.5 * b2
    p2 = evaluate(s, gpu, 2, 2, 1, PlanConfig(batch=1))
    p4 = evaluate(s, gpu, 4, 4, 1, PlanConfig(batch=1))
    assert p2.fits and p4.fits and p2.max_tokens_kv < p4.max_tokens_kv < 1.5 * p2.max_tokens_kv


def test_a_tp_that_does_not_divide_the_mlp_is_refused():
    s = replace(load_model_shape("deepseek-coder-33b"), intermediate_size=19201)
    p = evaluate(s, get_gpu("h200"), 2, 2, 1, PlanConfig(batch=1))
    assert not p.fits and "intermediate_size" in p.reason
