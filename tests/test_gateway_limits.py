"""Limits and failures of the HTTP gateway (issue 4 section 4), each one a test."""
from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_gateway_fakes import FakeBackend
from test_gateway_http import ipc_address, make_config, post, read_sse

from gateway.app import create_app
from gateway.app_keys import GATEWAY_KEY
from gateway.backend_pool import PoolConfig
from scheduler.batcher import BatcherConfig
from scheduler.queues import QueueConfig

ERROR_KEYS = {"message", "type", "param", "code"}


def assert_error(status, body, want_status, param="__any__"):
    assert status == want_status, body
    assert set(body["error"]) == ERROR_KEYS, body
    if param != "__any__":
        assert body["error"]["param"] == param, body


@pytest.fixture
async def backend():
    b = await FakeBackend(ipc_address()).start()
    yield b
    await b.stop()


@pytest.fixture
def gateway_client(aiohttp_client, backend):
    async def make(*addresses, wait=5.0, **kw):
        app = create_app(make_config(*(addresses or (backend.address,)), **kw),
                         startup_wait_s=wait)
        return await aiohttp_client(app)
    return make


BAD_BODIES = [
    (b"{not json", "body"),
    (b"\xff\xfe", "body"),
    (b"[1]", "body"),
    (b'{"prompt": 3}', "prompt"),
    (b'{"max_tokens": 4}', "prompt"),
    (b'{"prompt": ""}', "prompt"),
    (b'{"prompt": "a", "max_tokens": 0}', "max_tokens"),
    (b'{"prompt": "a", "temperature": -1}', "temperature"),
    (b'{"prompt": "a", "temperature": 2.5}', "temperature"),
    (b'{"prompt": "a", "temperature": NaN}', "temperature"),
    (b'{"prompt": "a", "top_p": 0}', "top_p"),
    (b'{"prompt": "a", "top_k": -5}', "top_k"),
    (b'{"prompt": "a", "n": 99}', "n"),
    (b'{"prompt": "a", "stop": ["1","2","3","4","5","6","7","8","9","a","b","c","d","e","f","g","h"]}',
     "stop"),
    (b'{"prompt": "a", "logit_bias": {"99999": 1}}', "logit_bias"),
    (b'{"prompt": "a", "stop_token_ids": [99999]}', "stop_token_ids"),
    (b'{"prompt": "a", "suffix": "b"}', "suffix"),
    (b'{"prompt": "a", "use_beam_search": true}', "use_beam_search"),
    (b'{"prompt": [99999]}', "prompt"),
]


@pytest.mark.parametrize("raw,param", BAD_BODIES)
async def test_bad_input_is_400_with_param(gateway_client, raw, param):
    client = await gateway_client()
    resp = await client.post("/v1/completions", data=raw,
                             headers={"Content-Type": "application/json"})
    assert_error(resp.status, await resp.json(), 400, param)


async def test_context_overflow_names_the_numbers(gateway_client):
    client = await gateway_client()
    status, body = await post(client, "/v1/completions", {"prompt": "abc", "max_tokens": 2046})
    assert_error(status, body, 400, "max_tokens")
    assert "2048" in body["error"]["message"] and "2050" in body["error"]["message"]
    status, body = await post(client, "/v1/chat/completions",
                              {"messages": [{"role": "user", "content": "x" * 3000}]})
    assert_error(status, body, 400, "prompt")


async def test_chat_bad_messages(gateway_client):
    client = await gateway_client()
    status, body = await post(client, "/v1/chat/completions", {"messages": [{"role": "x"}]})
    assert_error(status, body, 400, "messages[0].role")


async def test_unknown_model_and_route(gateway_client):
    client = await gateway_client()
    status, body = await post(client, "/v1/completions", {"model": "gpt-9", "prompt": "a"})
    assert_error(status, body, 404, "model")
    assert body["error"]["code"] == "model_not_found"
    resp = await client.get("/v1/nothing")
    assert_error(resp.status, await resp.json(), 404)
    resp = await client.get("/v1/completions")
    assert_error(resp.status, await resp.json(), 405)


async def test_body_too_large_is_413_in_openai_shape(gateway_client):
    client = await gateway_client(max_body_bytes=1024)
    status, body = await post(client, "/v1/completions", {"prompt": "x" * 2000})
    assert_error(status, body, 413)
    assert "1024" in body["error"]["message"]


async def test_api_key_on_every_route_but_health_and_metrics(gateway_client):
    client = await gateway_client(api_key="sekrit")
    for method, path in [("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                         ("GET", "/v1/models"), ("POST", "/tokenize"), ("POST", "/detokenize")]:
        for headers in [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekrit"}]:
            resp = await client.request(method, path, json={"prompt": "a"}, headers=headers)
            assert_error(resp.status, await resp.json(), 401)
    assert (await client.get("/health")).status == 200
    assert (await client.get("/metrics")).status == 200  # open unless --protect-metrics
    status, body = await post(client, "/v1/completions", {"prompt": "a", "max_tokens": 2},
                              headers={"Authorization": "Bearer sekrit"})
    assert status == 200, body


async def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


async def test_queue_full_refuses_exactly_k_with_retry_after(gateway_client, backend):
    capacity, extra = 6, 4
    client = await gateway_client(
        pool=PoolConfig(max_inflight_per_backend=1, heartbeat_timeout_s=5),
        queues=QueueConfig(max_requests=(capacity, capacity, capacity)))
    backend.go.clear()  # the backend holds what it gets: the first request fills its slot
    body = {"prompt": "a", "max_tokens": 4}
    first = asyncio.create_task(post(client, "/v1/completions", body))
    await wait_for(lambda: len(backend.received) == 1)
    tasks = [asyncio.create_task(client.post("/v1/completions", json=body))
             for _ in range(capacity + extra)]
    gw = client.app[GATEWAY_KEY]
    await wait_for(lambda: sum(1 for t in tasks if t.done()) == extra)
    refused = [t.result() for t in tasks if t.done()]
    assert len(refused) == extra and gw.dispatcher.queues.size == capacity
    for resp in refused:
        assert resp.status == 429 and resp.headers["Retry-After"] == "1"
        assert_error(resp.status, await resp.json(), 429)
    backend.go.set()
    done = await asyncio.gather(*tasks)
    assert sorted(r.status for r in done) == [200] * capacity + [429] * extra
    assert (await first)[0] == 200


async def test_no_healthy_backend_is_503(aiohttp_client):
    app = create_app(make_config(ipc_address()), startup_wait_s=0.2)
    client = await aiohttp_client(app)
    assert (await client.get("/health")).status == 503
    status, body = await post(client, "/v1/completions", {"prompt": "a"})
    assert_error(status, body, 503)


async def test_queued_request_past_deadline_never_reaches_backend(gateway_client, backend):
    client = await gateway_client(pool=PoolConfig(max_inflight_per_backend=1))
    backend.go.clear()
    first = asyncio.create_task(post(client, "/v1/completions", {"prompt": "a", "max_tokens": 2}))
    await wait_for(lambda: len(backend.received) == 1)
    t0 = time.monotonic()
    status, body = await post(client, "/v1/completions",
                              {"prompt": "b", "max_tokens": 2, "deadline_ms": 50})
    assert_error(status, body, 504)
    assert 0.04 < time.monotonic() - t0 < 1.0
    backend.go.set()
    assert (await first)[0] == 200
    assert len(backend.received) == 1


async def test_request_timeout_is_504_and_aborts_on_backend(gateway_client, backend):
    client = await gateway_client(request_timeout_s=0.2)
    backend.go.clear()
    status, body = await post(client, "/v1/completions", {"prompt": "a", "max_tokens": 5})
    assert_error(status, body, 504)
    await wait_for(lambda: len(backend.aborted) == 1)
    assert backend.aborted == backend.received
    backend.go.set()


async def test_random_disconnects_abort_and_free_every_block(gateway_client, backend):
    client = await gateway_client()
    backend.step_s = 0.001
    start_blocks = backend.num_free_blocks
    rng = random.Random(1)

    async def one(i):
        stream = rng.random() < 0.5
        timeout = rng.uniform(0.0, 1.0)
        if i % 20 == 0:
            # every 20th client stays 2 s, so that some requests reach the backend even on a CPU
            # so starved that the others' clients are all gone before their requests are queued;
            # not streamed, so that these few add no SSE writes to the starved loop (thousands
            # of events each starved the fake backend's heartbeats in one CI run)
            stream, timeout = False, 2.0
        body = {"prompt": f"p{i}", "max_tokens": 2000, "ignore_eos": True, "stream": stream}
        try:
            await asyncio.wait_for(_consume(client, body), timeout)
        except asyncio.TimeoutError:
            pass

    await asyncio.gather(*(one(i) for i in range(200)))
    gw = client.app[GATEWAY_KEY]
    stats = gw.dispatcher.batcher.stats
    # every queued request either left in a batch or was cancelled in the queue (its client gone
    # before its window flushed: on a starved CPU, where the loop sees the disconnect before the
    # window's timer, that can be all of them); every one that left reached the backend and, its
    # client gone, was aborted there (2000 tokens at 1 ms a step outlast every client's timeout)
    await wait_for(lambda: gw.dispatcher.queues.size == 0)
    assert 0 < stats.num_requests + stats.num_cancelled <= 200
    await wait_for(lambda: len(backend.received) == stats.num_requests)
    await wait_for(lambda: sorted(backend.aborted) == sorted(backend.received))
    await wait_for(lambda: not backend.running and backend.num_free_blocks == start_blocks)
    await wait_for(lambda: all(not b.inflight for b in gw.pool.backends))
    assert gw.dispatcher.queues.size == 0
    # ... and some did reach it and were aborted there: the patient clients (every 20th stays
    # 2 s) are dispatched on any machine, so a gateway that dispatched nothing (every request
    # cancelled in its queue) fails here instead of passing with empty lists (issue 27)
    assert stats.num_requests > 0 and backend.aborted


async def _consume(client, body):
    async with client.post("/v1/completions", json=body) as resp:
        await resp.read()


async def test_garbage_from_a_backend_is_dropped_and_counted(gateway_client, backend):
    client = await gateway_client()
    for peer in list(backend._peers):
        backend.sock.send_multipart([peer, b"\x00garbage\xff"])
        backend.sock.send_multipart([peer, b"\x1a\x00", b"abc"])  # a frame not a multiple of 4
    await asyncio.sleep(0.1)
    status, _ = await post(client, "/v1/completions", {"prompt": "a", "max_tokens": 2})
    assert status == 200
    text = await (await client.get("/metrics")).text()
    assert 'tidegate_dropped_frames_total{socket="backend"} 2.0' in text


async def test_live_batcher_batches_concurrent_requests(gateway_client, backend):
    # A target rate that 64 concurrent requests beat, so each window waits its 5 ms. At the
    # default (8,000 req/s: a window of one is due 0.16 ms after it opens) the test client's
    # requests, a few hundred microseconds apart, are each a window of their own: since the
    # dispatcher lets an overdue window leave before the next push (issue 18) instead of letting
    # the late arrival join it, that is what the batching rule says, and the test failed 2 in 5.
    client = await gateway_client(batcher=BatcherConfig(target_throughput=100.0))
    backend.step_s = 0.02
    await asyncio.gather(*(post(client, "/v1/completions", {"prompt": "a", "max_tokens": 2})
                           for _ in range(64)))
    assert max(backend.batch_sizes) > 1 and sum(backend.batch_sizes) == 64
    text = await (await client.get("/metrics")).text()
    count = float(next(line.split()[-1] for line in text.splitlines()
                       if line.startswith("tidegate_batch_size_count")))
    assert count == len(backend.batch_sizes) < 64


FAKES = Path(__file__).with_name("test_gateway_fakes.py")


def start_fake_process(address: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(FAKES), address], stdout=subprocess.PIPE,
                            cwd=Path(__file__).parents[1])
    assert proc.stdout.readline().startswith(b"fake backend")
    return proc


async def test_backend_sigkill_under_load(aiohttp_client):
    a, b = ipc_address(), ipc_address()
    procs = [start_fake_process(a), start_fake_process(b)]
    try:
        # A long heartbeat window: a killed process is noticed from its dropped connection.
        app = create_app(make_config(a, b, pool=PoolConfig(heartbeat_timeout_s=30.0,
                                                           hello_interval_s=0.1)),
                         startup_wait_s=5.0)
        client = await aiohttp_client(app)
        gw = client.app[GATEWAY_KEY]
        await wait_for(lambda: len(gw.pool.healthy_backends()) == 2)

        async def one(i):
            body = {"prompt": "a", "max_tokens": 1500, "ignore_eos": True, "stream": i % 2 == 0}
            resp = await client.post("/v1/completions", json=body)
            if not body["stream"]:
                return resp.status
            events = await read_sse(resp)
            # an errored stream ends with its error event, then [DONE] (as vLLM's does)
            err = next((e["error"] for e in events if isinstance(e, dict) and "error" in e), None)
            return 200 if err is None and events[-1] == "[DONE]" else err

        tasks = [asyncio.create_task(one(i)) for i in range(20)]
        await wait_for(lambda: sum(len(x.inflight) for x in gw.pool.backends) == 20)
        assert all(x.inflight for x in gw.pool.backends)  # both got work
        # every request has streamed a token: none is re-dispatched (a request with no token
        # yet would be sent once to the other backend, issue 13), so all on the dead one fail
        await wait_for(lambda: all(n > 0 for x in gw.pool.backends
                                   for _, n in x.inflight.values()))
        num_on_dead = len(gw.pool.backends[0].inflight)
        procs[0].kill()
        t0 = time.monotonic()
        await wait_for(lambda: sum(t.done() for t in tasks) >= num_on_dead, timeout=5.0)
        assert time.monotonic() - t0 < 5.0  # never a hang (1500 tokens take ~3 s on the other)
        results = [t.result() for t in tasks if t.done()]
        failed = [r for r in results if r != 200]
        assert len(failed) == num_on_dead
        assert all((isinstance(r, int) and r >= 500) or r["code"] == "backend_down"
                   for r in failed)
        assert time.monotonic() - t0 < 2.0  # no heartbeat wait
        resp = await client.get("/health")
        assert resp.status == 200  # one backend is still healthy
        assert [x.healthy for x in gw.pool.backends] == [False, True]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        status, body = await post(client, "/v1/completions", {"prompt": "a", "max_tokens": 3})
        assert status == 200, body
        procs[1].kill()
        await wait_for(lambda: not gw.healthy, timeout=5)
        assert (await client.get("/health")).status == 503
    finally:
        for p in procs:
            p.kill()
            p.wait()


async def test_queued_requests_fail_fast_when_the_last_backend_dies(gateway_client, backend):
    client = await gateway_client(pool=PoolConfig(max_inflight_per_backend=1,
                                                  heartbeat_timeout_s=30))
    backend.go.clear()
    tasks = [asyncio.create_task(post(client, "/v1/completions", {"prompt": "a",
                                                                  "max_tokens": 2}))
             for _ in range(4)]
    gw = client.app[GATEWAY_KEY]
    await wait_for(lambda: len(backend.received) == 1 and gw.dispatcher.queues.size == 3)
    t0 = time.monotonic()
    await backend.stop()  # its connection drops
    results = await asyncio.wait_for(asyncio.gather(*tasks), 5.0)
    assert time.monotonic() - t0 < 2.0
    assert sorted(s for s, _ in results) == [502, 503, 503, 503]
    assert gw.dispatcher.queues.size == 0
    backend.stop = lambda: asyncio.sleep(0)  # already stopped for the fixture
