"""The HTTP layer against a fake backend (a ROUTER speaking the real protocol)."""
from __future__ import annotations

import asyncio
import json
import tempfile
import uuid

import pytest
from test_gateway_fakes import DEFAULT_TEXT, EOS, FakeBackend

from gateway.app import create_app
from gateway.backend_pool import PoolConfig
from gateway.core import GatewayConfig


def ipc_address() -> str:
    return f"ipc://{tempfile.gettempdir()}/tg-test-{uuid.uuid4().hex[:12]}.sock"


@pytest.fixture
async def backend():
    b = await FakeBackend(ipc_address()).start()
    yield b
    await b.stop()


def make_config(*addresses, **kw) -> GatewayConfig:
    pool = kw.pop("pool", PoolConfig(heartbeat_timeout_s=1.0, hello_interval_s=0.1))
    return GatewayConfig(backends=tuple(addresses), pool=pool, **kw)


@pytest.fixture
def gateway_client(aiohttp_client, backend):
    async def make(**kw):
        app = create_app(make_config(backend.address, **kw), startup_wait_s=5.0)
        return await aiohttp_client(app)
    return make


async def post(client, path, body, **kw):
    resp = await client.post(path, json=body, **kw)
    return resp.status, await resp.json()


async def read_sse(resp) -> list:
    events = []
    async for line in resp.content:
        line = line.decode().strip()
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


async def test_completion_non_streaming(gateway_client):
    client = await gateway_client()
    status, body = await post(client, "/v1/completions",
                              {"model": "tiny", "prompt": "Say hi", "max_tokens": 100,
                               "return_token_ids": True})
    assert status == 200, body
    assert body["object"] == "text_completion" and body["model"] == "tiny"
    choice = body["choices"][0]
    assert choice["text"] == DEFAULT_TEXT
    assert choice["finish_reason"] == "stop"
    assert choice["token_ids"] == list(DEFAULT_TEXT.encode()) + [EOS]
    assert choice["prompt_token_ids"] == [256] + list(b"Say hi")
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": len(choice["token_ids"]),
                             "total_tokens": 7 + len(choice["token_ids"])}


async def test_max_tokens_gives_length(gateway_client):
    client = await gateway_client()
    status, body = await post(client, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 5})
    assert status == 200
    assert body["choices"][0]["text"] == DEFAULT_TEXT.encode()[:5].decode()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 5


async def test_stop_string_excluded_and_backend_aborted(gateway_client, backend):
    client = await gateway_client()
    status, body = await post(client, "/v1/completions",
                              {"prompt": "x", "max_tokens": 100, "stop": ["wörld"]})
    assert status == 200
    assert body["choices"][0]["text"] == "Hello, "
    assert body["choices"][0]["finish_reason"] == "stop"
    await asyncio.sleep(0.05)
    assert len(backend.aborted) == 1 and not backend.running


async def test_list_of_prompts_and_echo(gateway_client):
    client = await gateway_client()
    status, body = await post(client, "/v1/completions",
                              {"prompt": ["a", "bc"], "max_tokens": 3, "echo": True})
    assert status == 200
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert [c["text"] for c in body["choices"]] == ["aHel", "bcHel"]
    assert body["usage"]["prompt_tokens"] == 2 + 3


async def test_streaming_completion_with_usage(gateway_client):
    client = await gateway_client()
    resp = await client.post("/v1/completions", json={
        "prompt": "hi", "max_tokens": 100, "stream": True,
        "stream_options": {"include_usage": True}})
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    events = await read_sse(resp)
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] > 0
    chunks = events[:-2]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert text == DEFAULT_TEXT
    assert all("\ufffd" not in c["choices"][0]["text"] for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert len(chunks) > 5  # really streamed, token by token


async def test_stream_interval_groups_tokens(gateway_client):
    client = await gateway_client(stream_interval=4)
    resp = await client.post("/v1/completions", json={
        "prompt": "hi", "max_tokens": 12, "stream": True, "return_token_ids": True})
    events = await read_sse(resp)
    sizes = [len(e["choices"][0]["token_ids"]) for e in events[:-1] if "token_ids" in
             e["choices"][0]]
    assert sum(sizes) == 12 and all(s >= 4 for s in sizes)


async def test_chat_non_streaming_and_streaming(gateway_client):
    client = await gateway_client()
    msgs = [{"role": "system", "content": "be nice"}, {"role": "user", "content": "hi"}]
    status, body = await post(client, "/v1/chat/completions", {"model": "tiny", "messages": msgs,
                                                               "return_token_ids": True})
    assert status == 200, body
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": DEFAULT_TEXT}
    prompt = bytes(body["choices"][0]["prompt_token_ids"][1:]).decode()
    assert prompt == "<|system|>\nbe nice\n<|user|>\nhi\n<|assistant|>\n"
    resp = await client.post("/v1/chat/completions", json={"messages": msgs, "stream": True})
    events = await read_sse(resp)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[-1] == "[DONE]"
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[1:-1])
    assert text == DEFAULT_TEXT
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    assert all(e["object"] == "chat.completion.chunk" for e in events[:-1])


async def test_models_health_metrics(gateway_client):
    client = await gateway_client()
    resp = await client.get("/v1/models")
    body = await resp.json()
    assert body["data"][0]["id"] == "tiny" and body["data"][0]["max_model_len"] == 2048
    assert (await client.get("/health")).status == 200
    await post(client, "/v1/completions", {"prompt": "hi", "max_tokens": 3})
    text = await (await client.get("/metrics")).text()
    for name in ['tidegate_requests_total{queue_class="fast",status="200"} 1.0',
                 "tidegate_batch_size_bucket", "tidegate_time_to_first_token_seconds_count",
                 "tidegate_inter_token_latency_seconds_count", "tidegate_e2e_request_latency",
                 'tidegate_queue_depth{queue_class="fast"}', "tidegate_queue_oldest_age_seconds",
                 "tidegate_goodput_ratio", "tidegate_backend_kv_cache_usage_perc",
                 'vllm:num_requests_running{engine="', "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:e2e_request_latency_seconds", "vllm:inter_token_latency_seconds"]:
        assert name in text, name


async def test_goodput_counts_slo(gateway_client, backend):
    backend.step_s = 0.02
    client = await gateway_client(slo=__import__("gateway.prometheus_metrics").prometheus_metrics.SLOConfig(
        ttft_ms=10_000, tpot_ms=1))
    await post(client, "/v1/completions", {"prompt": "hi", "max_tokens": 3})
    text = await (await client.get("/metrics")).text()
    assert "tidegate_goodput_ratio 0.0" in text  # 20 ms per token misses a 1 ms TPOT SLO


async def test_window_gathers_requests_when_idle_flush_is_off(aiohttp_client, backend):
    from scheduler.batcher import BatcherConfig

    # size / rate is huge at 1 req/s, so the window stays open for min_latency (80 ms).
    config = make_config(backend.address, batcher=BatcherConfig(
        min_latency_ms=80, target_throughput=1.0, idle_flush=False))
    client = await aiohttp_client(create_app(config, startup_wait_s=5.0))
    t0 = asyncio.get_running_loop().time()
    results = await asyncio.gather(*(post(client, "/v1/completions",
                                          {"prompt": "a", "max_tokens": 2}) for _ in range(5)))
    assert [s for s, _ in results] == [200] * 5
    assert backend.batch_sizes == [5]
    assert asyncio.get_running_loop().time() - t0 >= 0.08


async def test_logprobs_completions_and_chat(gateway_client):
    client = await gateway_client()
    status, body = await post(client, "/v1/completions",
                              {"prompt": "a", "max_tokens": 3, "logprobs": 2})
    lp = body["choices"][0]["logprobs"]
    assert lp["tokens"] == ["H", "e", "l"] and lp["token_logprobs"] == [-0.5] * 3
    assert lp["top_logprobs"][0] == {"H": -0.5, "I": -2.0}
    assert lp["text_offset"] == [0, 1, 2]
    _, body = await post(client, "/v1/completions",
                         {"prompt": "a", "max_tokens": 2, "logprobs": 0})
    lp = body["choices"][0]["logprobs"]
    assert lp["token_logprobs"] == [-0.5, -0.5] and lp["top_logprobs"] is None
    status, body = await post(client, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "logprobs": True,
        "top_logprobs": 1})
    content = body["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == ["H", "e"]
    assert content[0]["top_logprobs"] == [{"token": "H", "logprob": -0.5, "bytes": [72]}]
    status, body = await post(client, "/v1/completions", {"prompt": "a", "max_tokens": 2})
    assert status == 200 and body["choices"][0]["logprobs"] is None
    resp = await client.post("/v1/completions", json={"prompt": "a", "max_tokens": 3,
                                                      "logprobs": 1, "stream": True})
    events = await read_sse(resp)
    streamed = [t for e in events[:-1] for t in e["choices"][0]["logprobs"]["tokens"]]
    assert streamed == ["H", "e", "l"]
