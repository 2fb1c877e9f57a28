"""Inputs a review found answered with a 500 (issue 27), and the stream that ended in an error
without `data: [DONE]`: each is a 400 in the OpenAI shape now, the server stays healthy and
frees its blocks, and an error event is followed by [DONE] as vLLM sends it."""
from __future__ import annotations

import asyncio

import pytest
from test_gateway_fakes import FakeBackend
from test_gateway_http import ipc_address, make_config, read_sse

from gateway.app import create_app

OPENAI_ERROR_FIELDS = {"message", "type", "param", "code"}


@pytest.fixture
async def backend():
    b = await FakeBackend(ipc_address()).start()
    yield b
    await b.stop()


async def _client(aiohttp_client, backend, **kw):
    return await aiohttp_client(create_app(make_config(backend.address, **kw), startup_wait_s=5.0))


def _huge(sign: int) -> int:
    return sign * 10**400  # an integer no float holds (json.dumps writes all its digits)


@pytest.mark.parametrize("bias", [_huge(1), _huge(-1), 2**1024], ids=["1e400", "-1e400", "2^1024"])
async def test_logit_bias_past_the_float_range_is_a_400(aiohttp_client, backend, bias):
    client = await _client(aiohttp_client, backend)
    for path, body in (("/v1/completions", {"prompt": "a"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}]})):
        resp = await client.post(path, json={**body, "max_tokens": 2, "logit_bias": {"5": bias}})
        err = (await resp.json())["error"]
        assert resp.status == 400 and set(err) == OPENAI_ERROR_FIELDS
        assert err["param"] == "logit_bias" and "[-100, 100]" in err["message"]
        assert len(err["message"]) < 200  # the 401 digits are not echoed back


@pytest.mark.parametrize("role", [["user"], {"role": "user"}, [], {}])
async def test_a_role_that_is_a_list_or_an_object_is_a_400(aiohttp_client, backend, role):
    client = await _client(aiohttp_client, backend)
    messages = [{"role": "system", "content": "s"}, {"role": role, "content": "hi"}]
    for path in ("/v1/chat/completions", "/tokenize"):
        resp = await client.post(path, json={"messages": messages, "max_tokens": 2})
        err = (await resp.json())["error"]
        assert resp.status == 400 and set(err) == OPENAI_ERROR_FIELDS, err
        assert err["param"] == "messages[1].role"
        assert ("an array" if isinstance(role, list) else "an object") in err["message"]
    resp = await client.post("/v1/completions", json={"prompt": "ok", "max_tokens": 2})
    assert resp.status == 200
    for _ in range(100):
        if not backend.running:
            break
        await asyncio.sleep(0.02)
    assert backend.num_free_blocks == backend.num_total_blocks


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "Say hi"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
])
async def test_a_stream_that_fails_ends_with_the_error_then_done(aiohttp_client, backend, path,
                                                                 body):
    backend.step_s = 0.05  # slow steps: the deadline passes after the first tokens were sent
    client = await _client(aiohttp_client, backend, request_timeout_s=0.3)
    resp = await client.post(path, json={**body, "max_tokens": 200, "stream": True,
                                         "ignore_eos": True})
    assert resp.status == 200
    events = await read_sse(resp)
    assert any("choices" in e for e in events[:-2] if isinstance(e, dict))  # it had begun
    assert events[-2]["error"]["code"] == "deadline_exceeded"
    assert set(events[-2]["error"]) == OPENAI_ERROR_FIELDS
    assert events[-1] == "[DONE]"


async def test_an_http_servers_error_event_fails_its_request_with_its_message(aiohttp_client,
                                                                             aiohttp_server):
    """A server stream that ends in an error event (then [DONE], as vLLM sends it) fails that
    request with the server's message, not with "the stream ended without a finish"."""
    import json

    from aiohttp import web
    from test_gateway_http_backend import FakeOpenAIServer, _gateway

    class FailingServer(FakeOpenAIServer):
        async def completions(self, request):
            await request.json()
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            chunk = {"choices": [{"index": 0, "text": "a", "token_ids": [97],
                                  "finish_reason": None}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            error = {"error": {"message": "engine step failed: CUDA out of memory",
                               "type": "server_error", "code": 500}}
            await resp.write(f"data: {json.dumps(error)}\n\ndata: [DONE]\n\n".encode())
            return resp

    client, _ = await _gateway(aiohttp_client, aiohttp_server, FailingServer())
    resp = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 8})
    err = (await resp.json())["error"]
    assert resp.status >= 500 and set(err) == OPENAI_ERROR_FIELDS
    assert "CUDA out of memory" in err["message"], err
