"""The engine's split step (begin_step / finish_step) and the worker's use of it: what may
happen while a step is in flight (new requests, aborts), and the worker's overlapped loop
(Engine.advance: the next step launched before the previous one's outputs go out; with async
scheduling also before its read-back) delivering the same tokens as the plain loop."""
from __future__ import annotations

import threading

import pytest

from backend.engine.assemble import BackendConfig, create_engine
from backend.engine.continuous import Engine
from backend.runner.sampler import SamplingParams
from proto import tidegate_pb2 as pb
from tests.backend_helpers import DealerClient

GREEDY = SamplingParams(max_tokens=6, ignore_eos=True)


def small_engine():
    engine, loaded = create_engine(BackendConfig(model="tiny", num_blocks=64, max_num_seqs=4,
                                                 max_num_batched_tokens=64))
    return engine, loaded


def test_abort_during_a_step_lands_after_it_and_frees_every_block():
    engine, _ = small_engine()
    free = engine.scheduler.block_manager.num_free_blocks
    for rid, prompt in (("a", [5, 6, 7]), ("b", [8, 9])):
        assert engine.add_request(rid, prompt, GREEDY) is None
    engine.step()  # both prefilled: the next step decodes both
    step = engine.begin_step()
    assert engine.abort("a") is None  # in flight: deferred
    assert engine.add_request("c", [10, 11, 12], GREEDY) is None  # joins the waiting queue
    outs = {o.request_id: o for o in engine.finish_step(step)}
    assert outs["a"].finish_reason == "abort" and outs["a"].new_token_ids == []
    assert outs["b"].finish_reason is None and len(outs["b"].new_token_ids) == 1
    assert "c" not in outs and "a" not in engine.states
    engine.check_integrity()
    while engine.has_unfinished():
        engine.step()
    engine.check_integrity()
    assert engine.scheduler.block_manager.num_free_blocks == free


def test_begin_step_twice_is_refused():
    engine, _ = small_engine()
    engine.add_request("a", [1, 2, 3], GREEDY)
    step = engine.begin_step()
    with pytest.raises(RuntimeError):
        engine.begin_step()
    engine.finish_step(step)


def serve_and_collect(tmp_path, overlap: bool, monkeypatch, async_scheduling: bool = False) -> dict:
    from backend.server.worker import Worker

    if overlap:  # the CUDA loop, on the CPU: Engine.advance turns
        monkeypatch.setattr(Engine, "overlaps_device", property(lambda self: True))
    engine, loaded = small_engine()
    engine.async_scheduling = async_scheduling  # plan step k+1 before step k is read back
    worker = Worker(engine, loaded, f"ipc://{tmp_path}/overlap-{overlap}-{async_scheduling}.sock")
    thread = threading.Thread(target=worker.serve_forever, daemon=True)
    thread.start()
    c = DealerClient(worker.endpoint)
    try:
        c.hello()
        c.batch({"a": [256, 1, 2], "b": [256, 3], "c": [7, 8, 9, 10]}, max_tokens=7,
                ignore_eos=True, temperature=0.0)
        tokens, finals, _ = c.collect(["a", "b", "c"])
        assert {r: f.finish_reason for r, f in finals.items()} == dict.fromkeys("abc", pb.RequestOutput.LENGTH)
        # an Abort right behind its Batch: 1,000 tokens outlast it on any machine, so only
        # ABORT is right (a LENGTH finish would be an ignored Abort; issue 27)
        c.batch({"d": [3, 4]}, max_tokens=1000, ignore_eos=True)
        c.send(pb.Envelope(abort=pb.Abort(request_ids=["d"])))
        d_tokens, f2, _ = c.collect(["d"])
        assert f2["d"].finish_reason == pb.RequestOutput.ABORT and len(d_tokens["d"]) < 1000
        return tokens
    finally:
        worker._stopping = True
        thread.join(10)
        c.close()
        worker.close()
        engine.check_integrity()


def test_overlapped_worker_loop_sends_the_same_tokens(tmp_path, monkeypatch):
    plain = serve_and_collect(tmp_path, False, monkeypatch)
    overlapped = serve_and_collect(tmp_path, True, monkeypatch)
    assert overlapped == plain and all(len(t) == 7 for t in plain.values())
    pipelined = serve_and_collect(tmp_path, True, monkeypatch, async_scheduling=True)
    assert pipelined == plain
