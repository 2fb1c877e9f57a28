"""Issue 35, session 19 (H37P): decode points of unequal contexts, and the decode kernel's plan.

On the H100's mixed-lengths run the cost model charged decode-only steps 0.92 of live, falling from
0.98 at max/mean context 1 to 0.88 at max/mean 3+: the profile's decode points give all d sequences
one context, and the paged-attention decode launch (one program per sequence, kv head and split)
waits on the longest sequence's programs. `backend profile` now measures one "spread" point per
grid decode batch d >= 2 (d - 1 sequences at the first context, the last at 4x it) and writes the
kernel's launch plan per decode bucket (`decode_attention`), from the kernel's own sizing."""
from __future__ import annotations

import json
import statistics
import types

import pytest

from backend.kernels import paged_attention as pa
from bench.engine import profile
from gateway.tidegate_cli import main as tidegate

GRID = ["--model", "tiny", "--num-blocks", "64", "--max-num-seqs", "8",
        "--max-num-batched-tokens", "64", "--max-model-len", "256",
        "--decode-batch-sizes", "0,1,2,4,16", "--prefill-tokens", "0,32", "--context-lens", "16,100",
        "--packed-prefill-seqs", "", "--repeats", "1", "--warmup", "0"]


def _profile(tmp_path, *extra) -> dict:
    out = tmp_path / "profile.json"
    assert tidegate(["backend", "profile", *GRID, *extra, "--out", str(out)]) == 0
    return json.loads(out.read_text())


# ---- shapes ---------------------------------------------------------------------------------------

def test_spread_shapes_one_long_per_grid_decode_batch():
    got = profile.spread_shapes([0, 1, 2, 4, 8, 16], [128, 1024], max_num_seqs=8,
                                max_num_batched_tokens=2048, max_model_len=4096)
    assert got == [(2, [[1, 128], [1, 512]]), (4, [[3, 128], [1, 512]]), (8, [[7, 128], [1, 512]])]
    # c_long capped at max_model_len; none where the cap leaves it no longer than c_short
    assert profile.spread_shapes([4], [128], max_num_seqs=8, max_num_batched_tokens=2048,
                                 max_model_len=300) == [(4, [[3, 128], [1, 300]])]
    assert profile.spread_shapes([4], [128], max_num_seqs=8, max_num_batched_tokens=2048,
                                 max_model_len=128) == []
    # the token budget bounds d as it bounds a decode-only step
    assert [d for d, _ in profile.spread_shapes([2, 4, 8], [16], max_num_seqs=8,
                                                max_num_batched_tokens=4, max_model_len=256)] == [2, 4]
    assert profile.spread_shapes([2, 4], [], max_num_seqs=8, max_num_batched_tokens=64,
                                 max_model_len=256) == []


def test_make_step_builds_each_decode_at_its_own_context():
    ctxs = [5, 17, 40, 16]
    chunks = profile.make_step(4, 0, 0, 16, 100, 1000, decode_contexts=ctxs)
    assert [ch.start_pos for ch in chunks] == [c - 1 for c in ctxs]     # position of the new token
    assert [len(ch.block_table) for ch in chunks] == [1, 2, 3, 1]       # ceil(c / block_size) blocks
    assert [b for ch in chunks for b in ch.block_table] == list(range(7))  # distinct, in launch order
    assert all(len(ch.token_ids) == 1 and not ch.is_prefill for ch in chunks)
    # each sequence's blocks cover its context exactly
    for ch, c in zip(chunks, ctxs, strict=True):
        assert (len(ch.block_table) - 1) * 16 < c <= len(ch.block_table) * 16
    # a uniform list is today's step; prefill chunks after the decodes keep their place
    same = profile.make_step(3, 32, 40, 16, 100, 1000, k=2, decode_contexts=[40, 40, 40])
    assert same == profile.make_step(3, 32, 40, 16, 100, 1000, k=2)
    # pool wrap-around as for uniform steps
    wrapped = profile.make_step(2, 0, 0, 16, 4, 1000, decode_contexts=[48, 48])
    assert [ch.block_table for ch in wrapped] == [[0, 1, 2], [3, 0, 1]]
    with pytest.raises(ValueError):
        profile.make_step(3, 0, 0, 16, 100, 1000, decode_contexts=[5, 6])
    with pytest.raises(ValueError):
        profile.make_step(2, 0, 0, 16, 100, 1000, decode_contexts=[5, 0])


def test_point_counts_the_exact_sum_and_the_rounded_mean():
    pt = profile.point(4, 0, 0, 1, 0, [2.0, 3.0], decode_runs=[[3, 16], [1, 63]])
    assert pt["num_context_tokens"] == 3 * 16 + 63 and pt["context_len"] == round(111 / 4)
    assert pt["decode_context_lens"] == [[3, 16], [1, 63]] and pt["decode_spread"] == "one_long"
    uniform = profile.point(4, 0, 16, 1, 0, [2.0, 3.0])
    assert "decode_context_lens" not in uniform and "decode_spread" not in uniform
    with pytest.raises(ValueError):
        profile.point(4, 0, 0, 1, 0, [2.0], decode_runs=[[2, 16], [1, 64]])


# ---- the kernel's plan ------------------------------------------------------------------------------

def test_decode_attention_plan_is_the_kernels_own_sizing():
    buckets = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
    plan = profile.decode_attention_plan(buckets, 8, 132, 16384)
    assert plan["block_n"] == pa.BLOCK_N and plan["split_context_len"] == 16384
    assert set(plan["buckets"]) == {str(b) for b in buckets}
    for b in buckets:
        e = plan["buckets"][str(b)]
        assert e["splits"] == pa.choose_num_splits(b * 8, 16384, 132, pa.DECODE_RESIDENT_PER_SM, pa.BLOCK_N)
        assert e["resident_programs"] == pa.DECODE_RESIDENT_PER_SM * 132
    # one wave of 528 resident programs: 66 splits capped at 64 for 1 x 8 programs, 8 x 8 -> 8,
    # 128 x 8 -> 1 (the figures the simulator reads)
    assert [plan["buckets"][k]["splits"] for k in ("1", "8", "128")] == [64, 8, 1]
    # quantized pages: 128-token tiles, 2 resident per SM; int4 keys capped at 168 registers where
    # that buys splits (8 x 8 programs: 3 resident -> 6 splits instead of 4)
    fp8 = profile.decode_attention_plan([8], 8, 132, 16384, "fp8")
    assert fp8["block_n"] == pa.QUANT_BLOCK_N
    assert fp8["buckets"]["8"] == {"splits": pa.quant_decode_plan(64, 16384, 132, pa.QUANT_BLOCK_N, False)[0],
                                   "resident_programs": pa.QUANT_DECODE_RESIDENT_PER_SM * 132}
    int4 = profile.decode_attention_plan([1, 8], 8, 132, 16384, "int4-fp8")
    splits, cap = pa.quant_decode_plan(64, 16384, 132, pa.QUANT_BLOCK_N, True)
    if pa.QUANT_DECODE_MAXNREG is None:  # (the A/B variable forces the cap either way)
        assert (splits, cap) == (6, 168)
    assert int4["buckets"]["8"]["splits"] == splits
    want_r = (pa.QUANT_DECODE_RESIDENT_PER_SM if cap is None else 65536 // (cap * 128)) * 132
    assert int4["buckets"]["8"]["resident_programs"] == want_r


def test_runner_plan_takes_the_graph_buckets_and_the_split_context():
    # a runner with decode graphs: its buckets and max_model_len (what a decode graph passes)
    runner = types.SimpleNamespace(graphs=types.SimpleNamespace(buckets=(1, 2, 4, 8, 16)),
                                   device=types.SimpleNamespace(type="cpu"),
                                   model=types.SimpleNamespace(attn=None),
                                   kv=types.SimpleNamespace(kv_cache_dtype="auto"))
    cfg = types.SimpleNamespace(max_num_seqs=16, max_model_len=4096)
    doc = profile.runner_decode_attention(runner, cfg, 4, [0, 1, 32])
    assert doc["cuda_graphs"] and doc["kernel"] == "cpu" and doc["split_context_len"] == 4096
    assert list(doc["buckets"]) == ["1", "2", "4", "8", "16"]
    assert doc["buckets"]["16"]["splits"] == pa.choose_num_splits(64, 4096, 132, pa.DECODE_RESIDENT_PER_SM)
    # eager: the grid's decode batches that fit max_num_seqs
    runner.graphs = None
    assert list(profile.runner_decode_attention(runner, cfg, 4, [0, 1, 8, 32])["buckets"]) == ["1", "8"]


# ---- the profile -------------------------------------------------------------------------------------

def test_profile_measures_spread_points_and_writes_the_plan(tmp_path):
    doc = _profile(tmp_path)
    spread = [p for p in doc["points"] if p.get("decode_spread") == "one_long" and not p["num_prefill_tokens"]]
    # d >= 2 of the grid that fit max_num_seqs 8 (not 0, 1 or 16); c_short 16, c_long 64
    assert [p["num_decode_seqs"] for p in spread] == [2, 4]
    # ... and each beside one chunk of the mixed step (256 tokens within the 64-token budget: 64 - d),
    # measured paused as every point with prefill (session 20)
    mixed = [p for p in doc["points"] if p.get("decode_spread") == "one_long" and p["num_prefill_tokens"]]
    assert [(p["num_decode_seqs"], p["num_prefill_tokens"]) for p in mixed] == [(2, 62), (4, 60)]
    for p in mixed:
        d = p["num_decode_seqs"]
        assert p["decode_context_lens"] == [[d - 1, 16], [1, 64]] and p["num_prefill_seqs"] == 1
        assert p["num_context_tokens"] == (d - 1) * 16 + 64 + p["num_prefill_tokens"]
        assert p["prefill_context_len"] == 0 and p["step_ms"] > 0
    # the cost model keeps them out of its fit and of the spread term's kappa
    from sims.profile_cost import ProfileCost
    cost = ProfileCost.from_json(tmp_path / "profile.json")
    assert [p["num_decode_seqs"] for p in cost.mixed_spread_points] == [2, 4]
    assert len(cost.points) == len([p for p in doc["points"] if "decode_spread" not in p])
    for p in spread:
        d = p["num_decode_seqs"]
        assert p["decode_spread"] == "one_long"
        assert p["decode_context_lens"] == [[d - 1, 16], [1, 64]]
        assert p["num_prefill_tokens"] == 0 and p["num_prefill_seqs"] == 0
        assert p["num_context_tokens"] == (d - 1) * 16 + 64
        assert p["context_len"] == round(((d - 1) * 16 + 64) / d)
        assert p["step_ms"] > 0 and p["repeats"] == 1 and "launch_ms_median" in p
    # the uniform points are unchanged: no new field, d x c context tokens
    uniform = [p for p in doc["points"] if "decode_spread" not in p]
    assert not any("decode_context_lens" in p for p in uniform)
    assert {(p["num_decode_seqs"], p["context_len"]) for p in uniform if not p["num_prefill_tokens"]} == {
        (1, 16), (2, 16), (4, 16), (1, 100), (2, 100), (4, 100)}
    for p in uniform:
        assert p["num_context_tokens"] == p["num_decode_seqs"] * p["context_len"] + p["num_prefill_tokens"]

    att = doc["decode_attention"]
    assert att["kernel"] == "cpu" and att["cuda_graphs"] is False
    assert att["num_kv_heads"] == 2 and att["sm_count"] == 132 and att["kv_cache_dtype"] == "auto"
    assert att["block_n"] == pa.BLOCK_N and att["split_context_len"] == 256
    assert list(att["buckets"]) == ["1", "2", "4"]      # eager: the grid's decode batches that fit
    for b, e in att["buckets"].items():
        assert e == {"splits": pa.choose_num_splits(int(b) * 2, 256, 132, pa.DECODE_RESIDENT_PER_SM),
                     "resident_programs": pa.DECODE_RESIDENT_PER_SM * 132}
    assert {e["splits"] for e in att["buckets"].values()} == {2}   # 256 tokens: 2 splits of >= 128


def test_spread_points_off(tmp_path, capsys):
    doc = _profile(tmp_path, "--decode-spread-points", "off")
    assert not any("decode_spread" in p or "decode_context_lens" in p for p in doc["points"])
    assert " spread " not in capsys.readouterr().out
    assert "decode_attention" in doc       # the plan is written either way
    on = _profile(tmp_path, "--tile-edge-points", "off")
    assert len(on["points"]) == len(doc["points"]) + 4   # 2 decode-only, 2 beside a chunk
    assert "spread 3x16 + 1x64" in capsys.readouterr().out   # the progress line names them
    decode_only = _profile(tmp_path, "--mixed-spread-points", "off", "--tile-edge-points", "off")
    assert len(decode_only["points"]) == len(doc["points"]) + 2
    assert not any("decode_spread" in p and p["num_prefill_tokens"] for p in decode_only["points"])


# ---- off-edge points (issue 35, session 34) ---------------------------------------------------------

def test_tile_edge_shapes_put_every_decode_one_token_past_a_tile():
    got = profile.tile_edge_shapes([0, 1, 2, 16, 64], [512, 640], max_num_seqs=32,
                                   max_num_batched_tokens=2048, max_model_len=4096)
    assert got == [(2, [[2, 513]]), (16, [[16, 513]])]          # d >= 2 that fit max_num_seqs
    # the first context rounded up to a whole tile; none where the tile past it does not fit
    assert profile.tile_edge_shapes([4], [100], max_num_seqs=8, max_num_batched_tokens=64,
                                    max_model_len=4096) == [(4, [[4, 129]])]
    assert profile.tile_edge_shapes([4], [100], max_num_seqs=8, max_num_batched_tokens=64,
                                    max_model_len=192) == []


def test_tile_pair_shapes_time_the_grids_larger_batches_on_a_128_token_edge():
    got = profile.tile_pair_shapes([0, 1, 2, 4, 8, 16, 64], [705, 184], max_num_seqs=32,
                                   max_num_batched_tokens=2048, max_model_len=4096)
    assert got == [(8, 768), (16, 768)]          # d >= 8 that fit max_num_seqs; 705 up to 128 tokens
    # where no d reaches 8, the largest that fits; none where the next twin (edge + 128) does not fit
    assert profile.tile_pair_shapes([2, 4], [100], max_num_seqs=8, max_num_batched_tokens=64,
                                    max_model_len=512) == [(4, 128)]
    assert profile.tile_pair_shapes([4], [100], max_num_seqs=8, max_num_batched_tokens=64,
                                    max_model_len=256) == []


def test_profile_times_tile_edge_pairs_and_the_model_reads_them(tmp_path, capsys):
    doc = _profile(tmp_path, "--max-model-len", "512")
    from sims.profile_cost import ProfileCost
    pairs = doc["tile_edge_pairs"]
    assert [(r["num_decode_seqs"], r["num_prefill_tokens"]) for r in pairs] == [(4, 0), (4, 60)]
    for r in pairs:
        assert (r["on_context"], r["off_context"], r["next_context"], r["rounds"]) == (128, 129, 256, 4)
        assert len(r["on_ms"]) == len(r["off_ms"]) == len(r["next_ms"]) == 4
        assert min(r["on_ms"] + r["off_ms"] + r["next_ms"]) > 0
        assert r["diff_ms_median"] == pytest.approx(
            statistics.median(b - a for a, b in zip(r["on_ms"], r["off_ms"], strict=True)), abs=1e-4)
        assert r["whole_ms_median"] == pytest.approx(
            statistics.median(b - a for a, b in zip(r["on_ms"], r["next_ms"], strict=True)), abs=1e-4)
    assert "tile pair d=   4 p=   60 c=128/129/256" in capsys.readouterr().out
    assert not any(p.get("decode_spread") == "off_edge" for p in doc["points"])  # the points: off by default
    cost = ProfileCost.from_json(tmp_path / "profile.json", mixed_tiles="measured", decode_tiles="measured")
    # the whole tile measured by the next twin: read though the grid's contexts (16, 100) end before it,
    # wherever the CPU's timing gives the tile a cost (next - on > 0)
    rows = [(e["kind"], e["num_decode_seqs"], e["whole_tile"]) for e in cost.tile_edge_points]
    assert set(rows) == {(("mixed" if r["num_prefill_tokens"] else "decode"), 4, "measured")
                         for r in pairs if r["whole_ms_median"] > 0}
    assert set(cost.tile_fractions) == {k for k, _d, _s in rows}
    # a CPU profile: recorded, not charged (its attention runs no tiles; the pairs time its noise)
    assert (cost.mixed_tiles_mode, cost.mixed_tiles, cost.decode_tiles) == ("measured", 0.0, 0.0)
    off = _profile(tmp_path, "--max-model-len", "512", "--tile-edge-pairs", "off")
    assert "tile_edge_pairs" not in off


def test_profile_measures_off_edge_points_and_the_model_reads_them_apart(tmp_path, capsys):
    short = _profile(tmp_path, "--tile-edge-points", "on", "--tile-edge-pairs", "off")
    # the grid's contexts 16 and 100: the tile past 65 ends beyond them
    from sims.profile_cost import ProfileCost
    unread = ProfileCost.from_json(tmp_path / "profile.json", mixed_tiles="measured")
    assert sum(p.get("decode_spread") == "off_edge" for p in short["points"]) == 4
    assert unread.tile_edge_points == [] and unread.mixed_tiles == 0.0  # no measured neighbour: not read
    doc = _profile(tmp_path, "--context-lens", "16,160", "--tile-edge-points", "on", "--tile-edge-pairs", "off")
    edge = [p for p in doc["points"] if p.get("decode_spread") == "off_edge"]
    # the spread points' d (2, 4), the first context 16 rounded up to a tile (64) + 1, alone and
    # beside the mixed spread points' chunk
    assert [(p["num_decode_seqs"], p["num_prefill_tokens"]) for p in edge] == [(2, 0), (4, 0), (2, 62), (4, 60)]
    for p in edge:
        d = p["num_decode_seqs"]
        assert p["decode_context_lens"] == [[d, 65]] and p["context_len"] == 65
        assert p["num_context_tokens"] == d * 65 + p["num_prefill_tokens"] and p["step_ms"] > 0
    from sims.profile_cost import ProfileCost
    cost = ProfileCost.from_json(tmp_path / "profile.json", mixed_tiles="measured")
    # out of the fit (the uniform points only) and of both spread terms, into the tiles term's points
    assert len(cost.points) == len([p for p in doc["points"] if "decode_spread" not in p])
    assert [p["num_decode_seqs"] for p in cost.mixed_spread_points] == [2, 4]
    assert [(e["kind"], e["num_decode_seqs"]) for e in cost.tile_edge_points] == [
        ("decode", 2), ("decode", 4), ("mixed", 2), ("mixed", 4)]
    assert set(cost.tile_fractions) == {"decode", "mixed"}
    assert cost.mixed_tiles == 0.0  # recorded, not charged: read against the fit (session 35)
    assert cost.describe()["tile_edges"]["fractions"] == cost.tile_fractions
    off = _profile(tmp_path, "--tile-edge-points", "off")
    assert not any(p.get("decode_spread") == "off_edge" for p in off["points"])
