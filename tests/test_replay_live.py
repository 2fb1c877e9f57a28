"""bench.engine.replay_live (issue 35, session 27): live steps' compositions run through the model
runner, pipelined as the serving loop launches and paused as the profile times its points. On the
CPU the timings are wall times (no CUDA events): these tests check the steps it builds and that it
runs end to end, not a timing."""
import json
from itertools import pairwise

from bench.engine import replay_live


def test_a_composition_becomes_its_decodes_and_chunks():
    step = replay_live.build_step([20, 33], [(8, 16), (5, 0)], block_size=16, num_blocks=64, vocab=100)
    dec, pre = step[:2], step[2:]
    # a decode at context c holds its new token at position c - 1, its table c's blocks
    assert [c.start_pos for c in dec] == [19, 32] and [len(c.block_table) for c in dec] == [2, 3]
    assert not any(c.is_prefill for c in dec) and all(len(c.token_ids) == 1 for c in dec)
    # each chunk its tokens from its start, a table covering start + tokens, no block shared
    assert [(len(c.token_ids), c.start_pos) for c in pre] == [(8, 16), (5, 0)]
    assert [len(c.block_table) for c in pre] == [2, 1]
    blocks = [b for c in step for b in c.block_table]
    assert len(blocks) == len(set(blocks))


def test_it_replays_a_list_pipelined_and_paused_on_the_cpu(tmp_path):
    comps = {"source": "test", "steps": [
        {"i": 7, "ctxs": [20, 30], "chunks": []},
        {"i": 8, "ctxs": [21], "chunks": [[16, 0]]},
        {"i": 9, "ctxs": [22, 31], "chunks": [[8, 16], [8, 0]]}]}
    src, out = tmp_path / "c.json", tmp_path / "r.json"
    src.write_text(json.dumps(comps))
    rc = replay_live.main(["--model", "tiny", "--device", "cpu", "--steps", str(src), "--out", str(out),
                           "--passes", "2", "--pause-ms", "0"])
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["timed_on_device"] is False and res["passes"] == 2 and res["source"] == "test"
    assert [r["i"] for r in res["steps"]] == [7, 8, 9]
    assert all(r["pipelined_ms"] > 0 and r["paused_ms"] > 0 for r in res["steps"])


def test_the_decodes_tables_can_lie_as_a_live_pool_s_do():
    # scattered: the same block counts, no block shared, but not one run after another
    step = replay_live.build_step([40, 40, 40], [(8, 0)], block_size=16, num_blocks=64, vocab=100,
                                  block_order="scattered")
    tables = [c.block_table for c in step[:3]]
    assert [len(t) for t in tables] == [3, 3, 3]
    blocks = [b for c in step for b in c.block_table]
    assert len(blocks) == len(set(blocks))
    assert any(b - a != 1 for t in tables for a, b in pairwise(t))


def test_fill_kv_gives_the_decodes_non_zero_pages_to_read(tmp_path):
    from backend.engine.args import backend_config
    from backend.engine.assemble import ServingOptions, create_engine

    a = replay_live.parser().parse_args(["--model", "tiny", "--device", "cpu", "--steps", "x", "--out", "y"])
    engine, _ = create_engine(backend_config(a), ServingOptions())
    kv = engine.runner.kv
    assert all(float(c.abs().sum()) == 0.0 for c in kv.k_caches)  # a fresh pool is zeroed
    assert replay_live.fill_kv_pool(engine.runner) == "random"
    for c in (*kv.k_caches, *kv.v_caches):
        x = c.float()
        assert float((x != 0).float().mean()) > 0.99 and 0.8 < float(x.std()) < 1.2

    comps = {"steps": [{"i": 1, "ctxs": [20, 30], "chunks": []}]}
    src, out = tmp_path / "c.json", tmp_path / "r.json"
    src.write_text(json.dumps(comps))
    assert replay_live.main(["--model", "tiny", "--device", "cpu", "--steps", str(src), "--out", str(out),
                             "--passes", "1", "--pause-ms", "0", "--block-order", "interleaved", "--fill-kv"]) == 0
    res = json.loads(out.read_text())
    assert res["block_order"] == "interleaved" and res["fill_kv"] is True
