"""Issue 35, session 21: where a profile point's decode KV blocks lie in the pool.

On the H100's 6.7B grid parts the live decode-only steps of near-equal contexts ran over the
profile's device times at their shape by ~0 at one sequence, ~1% at 9-16 and 1.4-2% at 17-64: an
excess per sequence. The profile laid every decode's blocks in one contiguous run; live,
the allocator interleaves the blocks of decodes that grow together. `backend profile` can now lay
them out as the engine does (`--kv-block-order`) and, by default, times a few decode points in each
order (`block_order_check`) so that the next device call says whether the layout matters."""
from __future__ import annotations

import json

import pytest

from bench.engine import profile
from gateway.tidegate_cli import main as tidegate


def test_contiguous_is_the_layout_the_points_always_had():
    tables, nxt = profile.decode_tables([2, 3, 1], 100)
    assert tables == [[0, 1], [2, 3, 4], [5]] and nxt == 6
    # make_step's default is unchanged: decodes' runs one after another, then the prefill chunk's
    chunks = profile.make_step(3, 16, 20, 16, 100, 1000)
    assert [ch.block_table for ch in chunks] == [[0, 1], [2, 3], [4, 5], [6]]


def test_interleaved_hands_out_blocks_round_robin_as_growing_decodes_get_them():
    tables, nxt = profile.decode_tables([3, 1, 2], 100, "interleaved")
    # block 0 of each, then block 1 of those still growing, then block 2
    assert tables == [[0, 3, 5], [1], [2, 4]] and nxt == 6
    chunks = profile.make_step(2, 16, 40, 16, 100, 1000, block_order="interleaved")
    assert [ch.block_table for ch in chunks] == [[0, 2, 4], [1, 3, 5], [6]]  # the chunk's after them


def test_scattered_is_a_seeded_permutation_of_the_pool():
    a, nxt = profile.decode_tables([4, 4, 4], 64, "scattered")
    flat = [b for t in a for b in t]
    assert len(set(flat)) == 12 and all(0 <= b < 64 for b in flat) and nxt == 12
    assert flat != list(range(12))
    assert profile.decode_tables([4, 4, 4], 64, "scattered") == (a, nxt)       # the same seed, the same
    assert profile.decode_tables([4, 4, 4], 64, "scattered", seed=1)[0] != a
    with pytest.raises(ValueError, match="block order"):
        profile.decode_tables([1], 8, "random")


def test_every_order_covers_each_context_and_wraps_around_the_pool():
    for order in profile.BLOCK_ORDERS:
        chunks = profile.make_step(5, 0, 40, 16, 8, 1000, block_order=order)  # 15 blocks in a pool of 8
        assert [len(ch.block_table) for ch in chunks] == [3] * 5
        assert all(0 <= b < 8 for ch in chunks for b in ch.block_table)


GRID = ["--model", "tiny", "--num-blocks", "256", "--max-num-seqs", "32",
        "--max-num-batched-tokens", "64", "--max-model-len", "256",
        "--decode-batch-sizes", "0,1,16", "--prefill-tokens", "0,32", "--context-lens", "40",
        "--packed-prefill-seqs", "", "--repeats", "1", "--warmup", "0"]


def _profile(tmp_path, *extra) -> dict:
    out = tmp_path / "profile.json"
    assert tidegate(["backend", "profile", *GRID, *extra, "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_the_tiny_profile_records_the_check_and_its_order(tmp_path):
    doc = _profile(tmp_path)
    assert doc["kv_block_order"] == "contiguous"
    check = doc["block_order_check"]
    # d 16 is the only check batch the grid has; one record per order at the first context
    assert [(r["num_decode_seqs"], r["context_len"], r["block_order"]) for r in check] == [
        (16, 40, o) for o in profile.BLOCK_ORDERS]
    assert all(r["step_ms_median"] > 0 for r in check)
    off = _profile(tmp_path, "--block-order-check", "off", "--kv-block-order", "interleaved")
    assert "block_order_check" not in off and off["kv_block_order"] == "interleaved"
    # the points themselves are the same shapes whatever the order
    assert ([(p["num_decode_seqs"], p["num_prefill_tokens"], p["context_len"]) for p in off["points"]]
            == [(p["num_decode_seqs"], p["num_prefill_tokens"], p["context_len"]) for p in doc["points"]])
