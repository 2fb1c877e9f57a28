"""`--backend http://...`: an OpenAI-compatible server behind the gateway's queues and placement.
A fake server (aiohttp) streams `/v1/completions` with token ids, as vLLM does with
`return_token_ids`; the gateway detokenizes them, closes the stream to abort, maps HTTP errors."""
from __future__ import annotations

import asyncio
import json

from aiohttp import web
from test_gateway_fakes import DEFAULT_TEXT, EOS

from gateway.app import create_app
from gateway.app_keys import GATEWAY_KEY
from gateway.backend_pool import PoolConfig
from gateway.core import GatewayConfig
from gateway.http_backend import completion_body, parse_vllm_gauges
from proto import tidegate_pb2 as pb
from tokenizer.byte_level import byte_level_bundle


class FakeOpenAIServer:
    """Streams DEFAULT_TEXT's bytes as token ids (one per chunk), then finish 'stop'."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.closed_early = 0
        self.step_s = 0.005

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/completions", self.completions)
        return app

    async def health(self, request):
        return web.Response(text="ok")

    async def metrics(self, request):
        return web.Response(text='vllm:num_requests_running{engine="0"} 2.0\n'
                                 'vllm:kv_cache_usage_perc{engine="0"} 0.25\n')

    async def models(self, request):
        return web.json_response({"object": "list",
                                  "data": [{"id": "fake-model", "max_model_len": 2048}]})

    async def completions(self, request):
        body = await request.json()
        self.bodies.append(body)
        if body["max_tokens"] > 1000:
            return web.json_response({"error": {"message": "max_tokens too large"}}, status=400)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        ids = list(DEFAULT_TEXT.encode())[:body["max_tokens"]]
        try:
            for k, t in enumerate(ids):
                last = k == len(ids) - 1
                finish = ("length" if len(ids) == body["max_tokens"] else "stop") if last else None
                chunk = {"choices": [{"index": 0, "text": "?", "token_ids": [t],
                                      "finish_reason": finish}]}
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
                await asyncio.sleep(self.step_s)
            await resp.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            self.closed_early += 1
            raise
        return resp


async def _gateway(aiohttp_client, aiohttp_server, server: FakeOpenAIServer):
    srv = await aiohttp_server(server.app())
    pool = PoolConfig(heartbeat_timeout_s=2.0, hello_interval_s=0.1,
                      http_tokenizer=byte_level_bundle("fake"))
    app = create_app(GatewayConfig(backends=(str(srv.make_url("")).rstrip("/"),), pool=pool),
                     startup_wait_s=5.0)
    client = await aiohttp_client(app)
    for _ in range(100):
        if app[GATEWAY_KEY].pool.healthy_backends():
            break
        await asyncio.sleep(0.05)
    return client, app


async def test_completion_through_an_http_backend(aiohttp_client, aiohttp_server):
    server = FakeOpenAIServer()
    client, app = await _gateway(aiohttp_client, aiohttp_server, server)
    resp = await client.post("/v1/completions", json={"model": "fake-model", "prompt": "hi",
                                                      "max_tokens": 64, "temperature": 0})
    body = await resp.json()
    assert resp.status == 200, body
    assert body["choices"][0]["text"] == DEFAULT_TEXT
    assert body["choices"][0]["finish_reason"] == "stop"
    sent = server.bodies[0]
    assert sent["return_token_ids"] is True and sent["stream"] is True
    assert isinstance(sent["prompt"], list) and all(isinstance(t, int) for t in sent["prompt"])
    # max_tokens reached on the server: 'length'
    resp = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 5})
    body = await resp.json()
    assert body["choices"][0]["text"] == DEFAULT_TEXT.encode()[:5].decode()
    assert body["choices"][0]["finish_reason"] == "length"
    # the server's gauges arrive as LoadReports
    await asyncio.sleep(1.3)
    b = app[GATEWAY_KEY].pool.backends[0]
    assert b.load.num_running == 2 and abs(b.kv_cache_usage - 0.25) < 1e-3


async def test_http_backend_errors_and_disconnects(aiohttp_client, aiohttp_server):
    server = FakeOpenAIServer()
    server.step_s = 0.05
    client, app = await _gateway(aiohttp_client, aiohttp_server, server)
    resp = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1500})
    body = await resp.json()
    assert resp.status == 400 and "max_tokens too large" in body["error"]["message"]
    # a client that leaves: the gateway aborts, and the stream to the server is closed
    resp = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 100,
                                                      "stream": True})
    await resp.content.readany()
    resp.close()
    for _ in range(100):
        if server.closed_early:
            break
        await asyncio.sleep(0.05)
    assert server.closed_early == 1
    assert not app[GATEWAY_KEY].pool.backends[0].inflight


def test_body_and_gauges():
    s = pb.SamplingParams(max_tokens=7, temperature=0.5, top_k=3, ignore_eos=True, seed=11)
    s.stop_token_ids.append(EOS)
    b = completion_body("m", [1, 2], s)
    assert b == {"model": "m", "prompt": [1, 2], "max_tokens": 7, "temperature": 0.5,
                 "stream": True, "return_token_ids": True, "skip_special_tokens": False,
                 "top_k": 3, "seed": 11, "stop_token_ids": [EOS], "ignore_eos": True}
    g = parse_vllm_gauges('# HELP x\nvllm:num_requests_waiting{a="b"} 3\n'
                          'vllm:num_requests_running 1\nother 5\n')
    assert g == {"num_waiting": 3.0, "num_running": 1.0}
    # vLLM 0.32's KV size, as its /metrics gives it (the placement's slack scales with it)
    g = parse_vllm_gauges('vllm:cache_config_info{block_size="128",engine="0",'
                          'kv_cache_size_tokens="149760",num_gpu_blocks="1170"} 1.0\n')
    assert g == {"kv_tokens": 149760.0}
