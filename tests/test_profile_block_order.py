"""Issue 35, session 21: where a profile point's decode KV blocks lie in the pool.

On the H100's 6.7B grid parts the live decode-only steps of near-equal contexts ran over the
profile's device times at their shape by ~0 at one sequence, ~1% at 9-16 and 1.4-2% at 17-64: an
excess per sequence. The profile laid every decode's blocks in one contiguous run; live,
the allocator interleaves the blocks of decodes that grow together. `backend profile` can now lay
them out as the engine does (`--kv-block-order`) and, by default, times a few decode points in each
order, and once more over contexts the model prefilled (`block_order_check`: the grid's points read
a zeroed pool), so that the next device call says whether the layout or the content matters."""
from __future__ import annotations

import json
import types

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


class _Recorder:
    """A runner that records the chunks of each launch (fill_decode_kv's packing, no model)."""
    device = types.SimpleNamespace(type="cpu")

    def __init__(self):
        self.launches = []

    def launch(self, chunks):
        self.launches.append(list(chunks))
        return len(self.launches)

    def finish(self, step):
        return step


def test_fill_writes_every_decode_position_once_within_the_limits():
    cfg = types.SimpleNamespace(block_size=16, num_blocks=4096, max_num_batched_tokens=100, max_num_seqs=3)
    r = _Recorder()
    n = profile.fill_decode_kv(r, 5, 251, cfg, 1000)  # 250 positions each: pieces of 100, 100, 50
    assert n == len(r.launches)
    tables, _ = profile.decode_tables([16] * 5, 4096)
    seen = {}
    for batch in r.launches:
        assert sum(len(ch.token_ids) for ch in batch) <= 100 and len(batch) <= 3
        ids = [ch.request_id for ch in batch]
        assert len(ids) == len(set(ids))  # one piece of a sequence a launch
        for ch in batch:
            i = int(ch.request_id[1:])
            assert ch.is_prefill and ch.block_table == tables[i]  # the decodes' own contiguous tables
            assert ch.start_pos == seen.get(i, 0)  # in order, no gap, no overlap
            seen[i] = ch.start_pos + len(ch.token_ids)
    assert seen == {i: 250 for i in range(5)}


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
    assert doc["kv_block_order"] == "contiguous" and doc["kv_fill"] == "random"
    check = doc["block_order_check"]
    # d 16 is the only check batch the grid has: one record per order over the random pool the
    # points read at the first context, the contiguous one over the pool zeroed, then over the
    # prefilled contexts
    assert [(r["num_decode_seqs"], r["context_len"], r["block_order"], r["kv_content"]) for r in check] == [
        *((16, 40, o, "random") for o in profile.BLOCK_ORDERS), (16, 40, "contiguous", "zeros"),
        (16, 40, "contiguous", "prefilled")]
    assert all(r["step_ms_median"] > 0 for r in check)
    off = _profile(tmp_path, "--block-order-check", "off", "--kv-block-order", "interleaved", "--kv-fill", "zeros")
    assert "block_order_check" not in off and off["kv_block_order"] == "interleaved" and off["kv_fill"] == "zeros"
    # an int4-fp8 pool is filled too (its codes and scales), through the engine's own pool
    quant = _profile(tmp_path, "--block-order-check", "off", "--kv-cache-dtype", "int4-fp8")
    assert quant["kv_fill"] == "random"
    # the points themselves are the same shapes whatever the order
    assert ([(p["num_decode_seqs"], p["num_prefill_tokens"], p["context_len"]) for p in off["points"]]
            == [(p["num_decode_seqs"], p["num_prefill_tokens"], p["context_len"]) for p in doc["points"]])


def test_the_check_prefills_only_up_to_its_fill_batch():
    cfg = types.SimpleNamespace(block_size=16, num_blocks=100000, max_num_batched_tokens=2048, max_num_seqs=256)
    r = _Recorder()
    recs = profile.block_order_check(r, [16, 64, 128], 40, cfg, 1000, repeats=1, warmup=0, device_time=False)
    assert [(x["num_decode_seqs"], x["block_order"], x["kv_content"]) for x in recs] == [
        *((d, o, "zeros") for d in (16, 64, 128) for o in profile.BLOCK_ORDERS),
        (16, "contiguous", "prefilled"), (64, "contiguous", "prefilled")]
    fills = [b for b in r.launches if b[0].is_prefill]
    assert {ch.request_id for b in fills for ch in b} == {f"f{i}" for i in range(profile.BLOCK_ORDER_FILL_MAX_D)}


def test_the_pool_is_filled_random_or_zeroed_and_a_quantized_one_left_alone(monkeypatch):
    import torch

    pages = [torch.zeros(4, 16, 2, 8, dtype=torch.bfloat16) for _ in range(4)]
    runner = types.SimpleNamespace(kv=types.SimpleNamespace(k_caches=pages[:2], v_caches=pages[2:]),
                                   device=torch.device("cpu"))
    assert profile.fill_kv_pool(runner, "random") == "random"
    for c in pages:  # non-zero everywhere, unit scale, and not one page repeated
        x = c.float()
        assert float((x != 0).float().mean()) > 0.99 and 0.7 < float(x.std()) < 1.3
    assert not torch.equal(pages[0], pages[1])
    again = [c.clone() for c in pages]
    profile.fill_kv_pool(runner, "random")  # seeded: the same pages every profile
    assert all(torch.equal(a, b) for a, b in zip(again, pages, strict=True))
    assert profile.fill_kv_pool(runner, "zeros") == "zeros" and all(float(c.abs().sum()) == 0 for c in pages)
    # filled in slices of blocks when a page tensor is larger than one draw: every block still filled
    monkeypatch.setattr(profile, "FILL_SLICE_BYTES", 3 * 16 * 2 * 8 * 4)  # 3 blocks a draw, of 4
    profile.fill_kv_pool(runner, "random")
    assert all(bool((c.float().abs().sum(dim=(1, 2, 3)) > 0).all()) for c in pages)
    codes = [torch.zeros(4, 16, dtype=torch.uint8)]
    other = types.SimpleNamespace(kv=types.SimpleNamespace(k_caches=codes, v_caches=codes), device=torch.device("cpu"))
    assert profile.fill_kv_pool(other, "random") == "zeros (pool of another kind)" and int(codes[0].sum()) == 0


@pytest.mark.parametrize("fmt", ["int4-fp8", "fp8"])
def test_a_quantized_pool_is_filled_with_the_codes_and_scales_of_the_draws(monkeypatch, fmt):
    """A zeroed quantized pool is the cheapest its kernel can read (all-zero scales and codes): the
    fill gives every token-head real codes and scales, which dequantize to unit-scale values, the
    int4 keys' fill rows the draws themselves; seeded; "zeros" puts the fresh pool back."""
    import torch

    from backend.kv.formats import FORMATS, QuantizedPages

    monkeypatch.setattr(profile, "FILL_SLICE_BYTES", 8 * 3 * 16 * 2 * 64 * 4)  # 3 blocks a slice, of 5
    k_codec, v_codec = FORMATS[fmt]
    kv = types.SimpleNamespace(k_caches=[QuantizedPages(k_codec, 5, 16, 2, 64, "cpu") for _ in range(2)],
                               v_caches=[QuantizedPages(v_codec, 5, 16, 2, 64, "cpu") for _ in range(2)])
    if k_codec == "int4":
        for c in kv.k_caches:
            c.attach_fill(3, torch.bfloat16)
    runner = types.SimpleNamespace(kv=kv, device=torch.device("cpu"))
    assert profile.fill_kv_pool(runner, "random") == "random"
    for c in (*kv.k_caches, *kv.v_caches):
        assert bool((c.scale > 0).all())  # every token-head of every block has its own scale
        x = c.dequantize(c.data, c.scale)
        assert 0.7 < float(x.std()) < 1.3 and float((x != 0).float().mean()) > 0.8
        if c.fill is not None:
            assert 0.7 < float(c.fill.float().std()) < 1.3
    first = [(c.data.view(torch.uint8).clone(), c.scale.clone()) for c in kv.k_caches]
    assert not torch.equal(first[0][0], first[1][0])  # not one page repeated
    profile.fill_kv_pool(runner, "random")
    assert all(torch.equal(a, c.data.view(torch.uint8)) and torch.equal(s, c.scale)
               for (a, s), c in zip(first, kv.k_caches, strict=True))
    assert profile.fill_kv_pool(runner, "zeros") == "zeros"
    for c in (*kv.k_caches, *kv.v_caches):
        assert int(c.data.view(torch.uint8).sum()) == 0 and float(c.scale.abs().sum()) == 0
        assert c.fill is None or float(c.fill.float().abs().sum()) == 0
