"""The echo engine (`tidegate backend --model echo`): the Engine interface, and the real worker loop
behind the real gateway (HTTP and the ZMQ front door), unchanged."""
from __future__ import annotations

import asyncio
import threading

import pytest
from test_gateway_http import ipc_address, make_config

from backend.engine.assemble import BackendConfig, create_engine
from backend.engine.continuous import EngineConfig
from backend.engine.echo import EchoEngine, EchoLoaded
from backend.runner.sampler import SamplingParams
from backend.server.worker import Worker
from gateway.app import create_app
from gateway.client import AsyncClient, InvalidRequestError
from gateway.frontdoor import frontdoor_ctx


def make_engine(**kw) -> EchoEngine:
    cfg = {"max_model_len": 64, "num_blocks": 8, "block_size": 4, "max_num_seqs": 2,
           "max_num_batched_tokens": 8}
    cfg.update(kw)
    return EchoEngine(EngineConfig(**cfg), vocab_size=259, eos_token_ids=(257,))


def run_to_end(engine: EchoEngine) -> dict[str, list]:
    outs: dict[str, list] = {}
    while engine.has_unfinished():
        step = engine.step()
        assert len({o.request_id for o in step}) == len(step)  # one token per request per step
        for o in step:
            assert len(o.new_token_ids) == 1
            outs.setdefault(o.request_id, []).append(o)
        engine.check_integrity()
    return outs


def test_create_engine_routes_echo():
    engine, loaded = create_engine(BackendConfig(model="echo"))
    assert isinstance(engine, EchoEngine) and isinstance(loaded, EchoLoaded)
    assert loaded.config.name == "echo" and loaded.config.vocab_size == 259
    assert engine.config.max_model_len == 2048
    assert loaded.tokenizer.encode("hi") == [256, 104, 105]


def test_exactly_max_tokens_echoing_the_prompt():
    engine = make_engine()
    assert engine.add_request("a", [1, 2, 3], SamplingParams(max_tokens=7)) is None
    assert engine.add_request("b", [257, 9], SamplingParams(max_tokens=1)) is None  # EOS ignored
    outs = run_to_end(engine)
    assert [o.new_token_ids[0] for o in outs["a"]] == [1, 2, 3, 1, 2, 3, 1]
    assert [o.finish_reason for o in outs["a"]] == [None] * 6 + ["length"]
    assert [o.num_completion_tokens for o in outs["a"]] == list(range(1, 8))
    assert outs["b"][-1].new_token_ids == [257] and outs["b"][-1].finish_reason == "length"
    assert engine.scheduler.block_manager.num_free_blocks == 8 and not engine.states


def test_refusals_and_admission_limits():
    engine = make_engine()
    sp = SamplingParams(max_tokens=4)
    assert "no prompt" in engine.add_request("x", [], sp)
    assert "outside" in engine.add_request("x", [259], sp)
    assert "max_model_len" in engine.add_request("x", [1] * 61, sp)
    assert "KV blocks" in engine.add_request("x", [1] * 40, sp)  # 11 blocks > 8
    assert "temperature" in engine.add_request("x", [1], SamplingParams(temperature=-1.0))
    for rid in "abc":  # 2 blocks each, max_num_seqs 2: c waits
        assert engine.add_request(rid, [1, 2, 3, 4], sp) is None
    assert "duplicate" in engine.add_request("a", [1], sp)
    engine.step()
    s = engine.scheduler
    assert (s.num_running, s.num_waiting, s.block_manager.num_free_blocks) == (2, 1, 4)
    engine.check_integrity()
    assert len(run_to_end(engine)) == 3


def test_abort_frees_and_reports():
    engine = make_engine(max_num_seqs=1)
    sp = SamplingParams(max_tokens=10)
    engine.add_request("a", [5], sp)
    engine.add_request("b", [6], sp)
    engine.step()
    out = engine.abort("a")
    assert out.finish_reason == "abort" and out.num_completion_tokens == 1 and not out.new_token_ids
    assert engine.abort("b").num_completion_tokens == 0  # still waiting
    assert engine.abort("a") is None and not engine.has_unfinished()
    assert engine.scheduler.block_manager.num_free_blocks == 8
    engine.check_integrity()


@pytest.fixture
def echo_worker():
    engine, loaded = create_engine(BackendConfig(model="echo"))
    worker = Worker(engine, loaded, ipc_address(), model_name="echo")
    thread = threading.Thread(target=worker.serve_forever, daemon=True)
    thread.start()
    yield worker
    worker._stopping = True
    thread.join(5)


async def test_gateway_http_and_zmq_against_the_echo_backend(aiohttp_client, echo_worker):
    door = ipc_address()
    app = create_app(make_config(echo_worker.endpoint), startup_wait_s=5.0,
                     extra_cleanup_ctx=[frontdoor_ctx(door)])
    client = await aiohttp_client(app)
    r = await client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 7})
    body = await r.json()
    assert r.status == 200, body
    # BOS h e l l o BOS: the BOS is special, so it is not in the text
    assert body["choices"][0]["text"] == "hello" and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 6, "completion_tokens": 7, "total_tokens": 13}

    async def one(i: int) -> int:
        req = {"prompt": [65 + i % 26], "max_tokens": 1 + i % 5}
        if i % 2 == 0:
            req.update(stream=True, stream_options={"include_usage": True})
        resp = await client.post("/v1/completions", json=req)
        text = await resp.text()
        assert resp.status == 200, text
        return text.count('"completion_tokens": ') and int(
            text.rsplit('"completion_tokens": ', 1)[1].split(",")[0])

    counts = await asyncio.gather(*(one(i) for i in range(40)))
    assert counts == [1 + i % 5 for i in range(40)]

    async with AsyncClient(door) as zc:
        assert zc.model == "echo"
        res = await zc.generate([104, 105], max_tokens=5)
        assert res.text == "hihih" and res.num_completion_tokens == 5
        results = await asyncio.gather(*(zc.generate([66], max_tokens=1) for _ in range(64)))
        assert all(x.token_ids == [66] and x.finish_reason == "length" for x in results)
        with pytest.raises(InvalidRequestError):
            await zc.generate([104], max_tokens=5000)
    bm = echo_worker.engine.scheduler.block_manager
    for _ in range(50):  # the last outputs may still be on their way
        if bm.num_free_blocks == bm.num_total_blocks:
            break
        await asyncio.sleep(0.02)
    assert bm.num_free_blocks == bm.num_total_blocks and not echo_worker.engine.states
