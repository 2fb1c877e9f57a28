"""bench.serving.loadgen against a fake OpenAI SSE server (known delays), and against the real gateway app."""
from __future__ import annotations

import asyncio
import io
import json
import time
from dataclasses import dataclass, field

import numpy as np
import pytest
from aiohttp import web

from bench.serving.loadgen import HttpTarget, Progress, chunk_tokens, run_http, run_zmq
from sims.metrics import RequestRecord, summarize

MODEL = "fake-model"
# max_tokens values that trigger failures
RATE_LIMITED, STREAM_ERROR, NO_DONE, NOT_AN_OBJECT, NOT_JSON = 501, 502, 503, 504, 505


@dataclass
class FakeOpenAI:
    """Streams max_tokens tokens: the first after first_delay, then one every gap seconds, sent in
    chunks of `chunk` tokens (a k-token chunk leaves k·gap after the previous one)."""
    first_delay: float = 0.05
    gap: float = 0.01
    chunk: int = 1
    honour_token_ids: bool = True     # False: a server that ignores return_token_ids
    bodies: list = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        return app

    async def models(self, request):
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def completions(self, request):
        body = await request.json()
        self.bodies.append(body)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._stream(request, body)
        finally:
            self.in_flight -= 1

    async def _stream(self, request, body):
        n = body["max_tokens"]
        if n == RATE_LIMITED:
            return web.json_response({"error": {"message": "queue full", "type": "rate_limit",
                                                 "param": None, "code": 429}}, status=429)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if n in (NOT_AN_OBJECT, NOT_JSON):
            await resp.write(b"data: [1, 2]\n\n" if n == NOT_AN_OBJECT else b"data: {oops\n\n")
            return resp

        async def send(obj):
            await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")

        ids = self.honour_token_ids and body.get("return_token_ids")
        if ids:   # vLLM and our gateway first send the prompt ids, before any token
            await send({"choices": [{"index": 0, "text": "", "prompt_token_ids": body["prompt"]}]})
        await asyncio.sleep(self.first_delay)
        sent = 0
        while sent < n:
            k = min(self.chunk, n - sent)
            if sent:
                await asyncio.sleep(self.gap * k)
            choice = {"index": 0, "text": "a" * k,
                      "finish_reason": "length" if sent + k == n else None}
            if ids:
                choice["token_ids"] = [97] * k
            await send({"id": "x", "object": "text_completion", "choices": [choice]})
            sent += k
            if n == STREAM_ERROR and sent >= 2:
                await send({"error": {"message": "backend died", "type": "server_error"}})
                return resp
            if n == NO_DONE and sent >= 2:
                return resp          # the connection closes without [DONE]
        if body.get("stream_options", {}).get("include_usage"):
            await send({"choices": [], "usage": {"prompt_tokens": len(body["prompt"]),
                                                 "completion_tokens": n}})
        await resp.write(b"data: [DONE]\n\n")
        return resp


async def bench(server, fake, max_tokens, *, offsets=None, max_concurrency=None, prompt_len=5,
                **target_kw):
    n = len(max_tokens)
    prompts = [[1] * prompt_len for _ in range(n)]
    offsets = np.zeros(n) if offsets is None else offsets
    target = HttpTarget(url=str(server.make_url("")), **target_kw)
    return await run_http(target, offsets, prompts, max_tokens, max_concurrency)


def within(stats, lo_ms, hi_ms, keys=("mean", "p50", "p99")):
    for k in keys:
        assert lo_ms <= stats[k] <= hi_ms, (k, stats)


async def test_ttft_itl_tpot_and_request_body(aiohttp_server):
    fake = FakeOpenAI(first_delay=0.05, gap=0.01)
    server = await aiohttp_server(fake.app())
    records, t0, model = await bench(server, fake, [10] * 6)
    assert model == MODEL
    s = summarize(records, start_time=t0)
    assert s["completed"] == 6 and s["num_errors"] == 0
    assert s["total_output_tokens"] == 60 and s["num_output_mismatch"] == 0
    assert all(r.chunk_tokens == [1] * 10 for r in records)      # the prompt-ids chunk is no token
    # lower bounds are tight (a sleep never ends early); upper ones leave room for a busy machine
    within(s["ttft_ms"], 49, 120)
    within(s["itl_ms"], 9, 30, keys=("mean", "p50"))
    within(s["tpot_ms"], 9, 30)
    within(s["e2el_ms"], 49 + 90, 400)
    b = fake.bodies[0]
    assert b["prompt"] == [1] * 5 and b["max_tokens"] == 10 and b["stream"] is True
    assert b["ignore_eos"] is True and b["return_token_ids"] is True
    assert b["stream_options"] == {"include_usage": True} and b["model"] == MODEL


async def test_multi_token_chunks_one_itl_gap_each(aiohttp_server):
    fake = FakeOpenAI(first_delay=0.03, gap=0.01, chunk=3)
    server = await aiohttp_server(fake.app())
    records, t0, _ = await bench(server, fake, [10])
    r = records[0]
    assert r.chunk_tokens == [3, 3, 3, 1] and r.output_tokens == 10
    gaps = np.diff(r.chunk_times) * 1e3          # sleeps end late under load, never early
    assert np.all(gaps >= np.array([30, 30, 10]) - 1) and np.all(gaps <= np.array([30, 30, 10]) + 25)
    s = summarize(records, start_time=t0)
    assert s["itl_ms"]["mean"] == pytest.approx(gaps.mean())
    tpot = (r.finish_time - r.first_token_time) / 9 * 1e3             # (e2el − ttft) / 9 tokens
    assert s["tpot_ms"]["mean"] == pytest.approx(tpot) and 70 / 9 - 0.5 <= tpot <= 70 / 9 + 6


async def test_server_without_token_ids_counts_a_token_per_chunk(aiohttp_server):
    fake = FakeOpenAI(first_delay=0.01, gap=0.005, honour_token_ids=False)
    server = await aiohttp_server(fake.app())
    records, t0, _ = await bench(server, fake, [7, 7], return_token_ids=False)
    assert "return_token_ids" not in fake.bodies[0]
    assert [r.chunk_tokens for r in records] == [[1] * 7] * 2
    assert summarize(records, start_time=t0)["total_output_tokens"] == 14


async def test_error_accounting(aiohttp_server):
    fake = FakeOpenAI(first_delay=0.01, gap=0.002)
    server = await aiohttp_server(fake.app())
    max_tokens = [5, RATE_LIMITED, STREAM_ERROR, NO_DONE, 5, RATE_LIMITED, NOT_AN_OBJECT, NOT_JSON]
    records, t0, _ = await bench(server, fake, max_tokens)
    s = summarize(records, start_time=t0)
    assert s["num_requests"] == 8 and s["completed"] == 2 and s["num_errors"] == 6
    assert s["errors"] == {"http_429": 2, "stream_error": 1, "incomplete": 1, "bad_response": 2}
    assert records[1].error_detail == "queue full"
    assert records[2].error_detail == "backend died"
    assert s["num_good"] == 2 and s["goodput_fraction"] == 1.0
    assert s["by_class"]["slow"]["num_errors"] == 6 and s["by_class"]["fast"]["num_errors"] == 0


async def test_connection_refused_and_timeout(aiohttp_server, unused_tcp_port):
    target = HttpTarget(url=f"http://127.0.0.1:{unused_tcp_port}", model="m")
    records, _, _ = await run_http(target, np.zeros(2), [[1], [1]], [4, 4])
    assert [r.error for r in records] == ["connection", "connection"]
    fake = FakeOpenAI(first_delay=1.0)
    server = await aiohttp_server(fake.app())
    records, _, _ = await bench(server, fake, [4], timeout_s=0.2)
    assert records[0].error == "timeout"


async def test_max_concurrency_caps_in_flight_and_send_time_is_real_send(aiohttp_server):
    fake = FakeOpenAI(first_delay=0.04, gap=0.001)
    server = await aiohttp_server(fake.app())
    records, t0, _ = await bench(server, fake, [2] * 6, max_concurrency=2)
    assert fake.max_in_flight == 2
    s = summarize(records, start_time=t0)
    assert s["completed"] == 6
    within(s["ttft_ms"], 39, 120)        # the wait for a slot is not in TTFT (vLLM's convention)
    sends = sorted(r.send_time - t0 for r in records)
    assert sends[-1] > 0.08              # the last pair waited for two rounds


async def test_open_loop_sends_on_schedule(aiohttp_server):
    fake = FakeOpenAI(first_delay=0.2, gap=0.001)   # slow answers must not delay later sends
    server = await aiohttp_server(fake.app())
    offsets = np.array([0.0, 0.03, 0.06, 0.09, 0.12])
    records, t0, _ = await bench(server, fake, [2] * 5, offsets=offsets)
    sent = np.array([r.send_time - t0 for r in records])
    assert np.all(sent >= offsets - 0.002) and np.all(sent <= offsets + 0.05)
    assert fake.max_in_flight == 5


def test_progress_bar():
    out = io.StringIO()
    bar = Progress(4, True, out)
    for ok in (True, False, True, True):
        bar.update(RequestRecord(0, 1, 1, 0.0, [1.0] if ok else [], [1] if ok else [], 1))
    assert out.getvalue().endswith("] 4/4 1 failed    0.0 s\n")
    quiet = io.StringIO()
    Progress(1, False, quiet).update(RequestRecord(0, 1, 1))
    assert quiet.getvalue() == ""


def test_chunk_token_rules():
    assert chunk_tokens({"text": "ab", "token_ids": [1, 2]}) == 2
    assert chunk_tokens({"text": "", "token_ids": []}) == 0
    assert chunk_tokens({"text": "", "prompt_token_ids": [1, 2, 3]}) == 0
    assert chunk_tokens({"text": "x"}) == 1


# --- against the real gateway app (fake ZMQ backend), HTTP and the ZMQ client ---------------------
async def test_against_the_gateway_app(aiohttp_server):
    from test_gateway_fakes import FakeBackend
    from test_gateway_http import ipc_address, make_config

    from gateway.app import create_app

    backend = await FakeBackend(ipc_address(), step_s=0.005).start()
    try:
        app = create_app(make_config(backend.address), startup_wait_s=5.0)
        server = await aiohttp_server(app)
        target = HttpTarget(url=str(server.make_url("")))
        prompts = [[65 + i] * (3 + i) for i in range(8)]
        max_tokens = [3, 9, 20, 70, 5, 12, 40, 2]
        records, t0, model = await run_http(target, np.linspace(0, 0.05, 8), prompts, max_tokens)
    finally:
        await backend.stop()
    assert model == "tiny"
    s = summarize(records, start_time=t0)
    assert s["num_errors"] == 0, [r.error_detail for r in records if not r.ok]
    assert [r.output_tokens for r in records] == max_tokens
    assert [sum(r.chunk_tokens) for r in records] == max_tokens     # stream-interval 1
    assert s["total_input_tokens"] == sum(len(p) for p in prompts)
    assert set(s["by_class"]) == {"fast", "normal", "slow"}
    assert s["itl_ms"]["p50"] > 0


async def test_zmq_mode_against_a_fake_front_door():
    pytest.importorskip("gateway.client")
    from test_gateway_fakes import FakeBackend
    from test_gateway_http import ipc_address

    # The gateway's front door speaks the backend protocol to clients; the fake backend does too.
    backend = await FakeBackend(ipc_address(), step_s=0.01).start()
    try:
        t = time.perf_counter()
        records, t0, model = await run_zmq(backend.address, np.zeros(4), [[1, 2, 3]] * 4,
                                           [5, 5, 30, 1], timeout_s=10)
    finally:
        await backend.stop()
    assert model == "tiny" and t0 >= t
    s = summarize(records, start_time=t0)
    assert s["num_errors"] == 0
    assert [r.output_tokens for r in records] == [5, 5, 30, 1]
    within(s["itl_ms"], 5, 80, keys=("p50",))
