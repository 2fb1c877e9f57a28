"""The ZMQ clients return what HTTP returns (logprobs with text offsets, echo, usage counts,
prompt ids) and send every sampling control; AsyncClient and Client answer alike."""
from __future__ import annotations

import asyncio
import inspect

import pytest
from test_gateway_client import start_gateway
from test_gateway_fakes import DEFAULT_TEXT, EOS, FakeBackend
from test_gateway_http import ipc_address, post

from gateway.client import REQUEST_FIELDS, AsyncClient, Client, InvalidRequestError


@pytest.fixture
async def backend():
    seen = []

    def script(prompt_ids, sampling):
        seen.append(sampling)
        return list(DEFAULT_TEXT.encode()) + [EOS]

    b = await FakeBackend(ipc_address(), script=script).start()
    b.seen = seen
    yield b
    await b.stop()


@pytest.fixture
def door_address():
    return ipc_address()


async def test_logprobs_offsets_and_echo_equal_http(aiohttp_client, backend, door_address):
    http = await start_gateway(aiohttp_client, backend, door_address)
    _, body = await post(http, "/v1/completions", {"prompt": "Say", "max_tokens": 6,
                                                   "logprobs": 2, "echo": True,
                                                   "return_token_ids": True})
    want = body["choices"][0]
    async with AsyncClient(door_address) as client:
        got = await client.generate("Say", max_tokens=6, logprobs=2, echo=True)
    assert got.text == want["text"] and got.token_ids == want["token_ids"]
    assert got.prompt_token_ids == want["prompt_token_ids"]
    assert got.text_offsets == want["logprobs"]["text_offset"]
    assert [lp.token for lp in got.logprobs] == want["logprobs"]["tokens"]
    assert [lp.logprob for lp in got.logprobs] == want["logprobs"]["token_logprobs"]
    assert [{t.token: t.logprob for t in lp.top_logprobs} for lp in got.logprobs] == \
        want["logprobs"]["top_logprobs"]
    assert (got.num_prompt_tokens, got.num_completion_tokens) == \
        (body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"])

    def sync():
        with Client(door_address) as c:
            return c.generate("Say", max_tokens=6, logprobs=2, echo=True)

    same = await asyncio.to_thread(sync)
    assert (same.text, same.token_ids, same.text_offsets, same.logprobs) == \
        (got.text, got.token_ids, got.text_offsets, got.logprobs)


async def test_sampling_controls_cross_the_front_door(aiohttp_client, backend, door_address):
    await start_gateway(aiohttp_client, backend, door_address)
    async with AsyncClient(door_address) as client:
        got = await client.generate(
            "x", max_tokens=30, min_p=0.1, repetition_penalty=1.3, presence_penalty=0.5,
            frequency_penalty=0.25, logit_bias={65: 2.0}, min_tokens=5, stop_token_ids=[7],
            stop=["l"], include_stop_str_in_output=True)
        s = backend.seen[-1]
        assert s.min_p == pytest.approx(0.1) and s.repetition_penalty == pytest.approx(1.3)
        assert (s.presence_penalty, s.frequency_penalty, dict(s.logit_bias)) == \
            (0.5, 0.25, {65: 2.0})
        assert s.min_tokens == 5 and list(s.stop_token_ids) == [7]
        # min_tokens: the "l"s of tokens 3 and 4 cannot end it; include_stop keeps the stop
        assert got.text == "Hello, wörl" and got.finish_reason == "stop"
        with pytest.raises(InvalidRequestError):
            await client.generate("x", max_tokens=3, suffix="y")  # no FIM tokens here
        with pytest.raises(TypeError):
            await client.generate("x", best_of=2)


def test_both_clients_have_the_same_surface():
    for name in ("generate", "stream", "connect", "close"):
        assert hasattr(AsyncClient, name) and hasattr(Client, name)
    for name in ("generate", "stream"):
        a = inspect.signature(getattr(AsyncClient, name))
        b = inspect.signature(getattr(Client, name))
        assert list(a.parameters) == list(b.parameters)
    assert {"suffix", "echo", "logprobs", "min_p", "logit_bias"} <= set(REQUEST_FIELDS)
