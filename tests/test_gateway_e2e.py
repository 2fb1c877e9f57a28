"""End to end: `tidegate serve` with its embedded tiny backend, driven by the openai SDK,
raw HTTP and the ZMQ client library."""
from __future__ import annotations

import asyncio
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import openai
import pytest
from test_gateway_http import ipc_address

from gateway.client import AsyncClient, Client

ROOT = Path(__file__).parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server():
    door = ipc_address()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.tidegate_cli", "serve", "--port", "0", "--model", "tiny",
         "--zmq-listen", door, "--log-level", "warning"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    line = ""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if "serving model" in line or not line:
            break
    m = re.search(r"serving model (\S+) on (http://\S+)", line)
    assert m, f"gateway did not start: {line!r}"
    yield {"url": m.group(2), "model": m.group(1), "door": door}
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0


@pytest.fixture
def sdk(server):
    return openai.OpenAI(base_url=server["url"] + "/v1", api_key="unused", max_retries=0)


def test_models_and_greedy_completion(sdk, server):
    assert [m.id for m in sdk.models.list().data] == [server["model"]]
    a = sdk.completions.create(model="tiny", prompt="def fib(n):", max_tokens=12, temperature=0)
    b = sdk.completions.create(model="tiny", prompt="def fib(n):", max_tokens=12, temperature=0)
    assert a.choices[0].text == b.choices[0].text
    assert a.choices[0].finish_reason == "length"
    assert a.usage.completion_tokens == 12 and a.usage.prompt_tokens == 12


def test_streaming_equals_non_streaming(sdk):
    full = sdk.completions.create(model="tiny", prompt="hello", max_tokens=16, temperature=0)
    chunks = list(sdk.completions.create(model="tiny", prompt="hello", max_tokens=16,
                                         temperature=0, stream=True,
                                         stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    assert chunks[-1].usage.completion_tokens == 16


def test_stop_string_truncates(sdk):
    prompt = "import numpy as np\n"
    full = sdk.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=0,
                                  extra_body={"ignore_eos": True}).choices[0].text
    candidates = [i for i in range(1, len(full)) if full[i] != "\ufffd"]
    assert candidates, f"no character to stop on in {full!r}"
    stop = full[candidates[len(candidates) // 2]]
    got = sdk.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=0,
                                 stop=[stop], extra_body={"ignore_eos": True})
    assert got.choices[0].text == full[:full.find(stop)]
    assert got.choices[0].finish_reason == "stop"


def test_chat_and_chat_streaming(sdk):
    msgs = [{"role": "system", "content": "You write code."}, {"role": "user", "content": "hi"}]
    full = sdk.chat.completions.create(model="tiny", messages=msgs, max_tokens=10, temperature=0)
    assert full.choices[0].message.role == "assistant"
    chunks = list(sdk.chat.completions.create(model="tiny", messages=msgs, max_tokens=10,
                                              temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == full.choices[0].message.content


def test_sdk_sees_typed_errors(sdk):
    with pytest.raises(openai.BadRequestError) as info:
        sdk.completions.create(model="tiny", prompt="a", n=2)
    assert info.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError, match="2048"):
        sdk.completions.create(model="tiny", prompt="a", max_tokens=5000)
    with pytest.raises(openai.NotFoundError):
        sdk.completions.create(model="nope", prompt="a")
    with pytest.raises(openai.BadRequestError):
        sdk.completions.create(model="tiny", prompt="a", temperature=3)


def test_zmq_client_matches_http(sdk, server):
    http = sdk.completions.create(model="tiny", prompt="hello", max_tokens=10, temperature=0)
    with Client(server["door"]) as client:
        got = client.generate("hello", max_tokens=10, temperature=0)
    assert got.text == http.choices[0].text and got.finish_reason == "length"


async def settled_usage(session, url) -> float:
    """KV usage once the backend runs nothing (after a fresh LoadReport)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        await asyncio.sleep(1.2)
        if await metric(session, url, "vllm:num_requests_running") == 0:
            return await metric(session, url, "tidegate_backend_kv_cache_usage_perc")
    raise AssertionError("the backend never became idle")


async def metric(session, url, name) -> float:
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


async def test_disconnects_free_every_kv_block(server):
    url = server["url"]
    rng = random.Random(7)
    async with aiohttp.ClientSession() as session:
        start_usage = await settled_usage(session, url)

        async def one(i):
            body = {"prompt": f"request {i}", "max_tokens": 64, "ignore_eos": True,
                    "stream": rng.random() < 0.5}
            try:
                async with asyncio.timeout(rng.uniform(0.0, 1.0)):
                    async with session.post(url + "/v1/completions", json=body) as resp:
                        await resp.read()
            except TimeoutError:
                pass

        await asyncio.gather(*(one(i) for i in range(200)))
        assert await settled_usage(session, url) == start_usage


async def test_2000_requests_at_concurrency_64_lose_none(server):
    url = server["url"]
    sem = asyncio.Semaphore(64)
    async with aiohttp.ClientSession() as session:
        start_usage = await settled_usage(session, url)
        batches_before = await metric(session, url, "tidegate_batch_size_count")

        async def one(i):
            async with sem, session.post(url + "/v1/completions", json={
                    "prompt": f"q{i}", "max_tokens": 2, "ignore_eos": True}) as resp:
                body = await resp.json()
                assert resp.status == 200, body
                return resp.status, body["usage"]["completion_tokens"]

        results = await asyncio.gather(*(one(i) for i in range(2000)))
        assert results == [(200, 2)] * 2000
        batches = await metric(session, url, "tidegate_batch_size_count") - batches_before
        assert batches < 2000  # the live batcher really batched
        assert await settled_usage(session, url) == start_usage


async def test_async_zmq_client_concurrent(server):
    async with AsyncClient(server["door"]) as client:
        results = await asyncio.gather(*(client.generate(f"x{i}", max_tokens=4, ignore_eos=True)
                                         for i in range(16)))
    assert all(r.num_completion_tokens == 4 for r in results)


def test_logprobs_through_the_sdk(sdk):
    got = sdk.completions.create(model="tiny", prompt="x = ", max_tokens=4, temperature=0,
                                 logprobs=2, extra_body={"ignore_eos": True})
    lp = got.choices[0].logprobs
    assert len(lp.token_logprobs) == 4 and all(v <= 0 for v in lp.token_logprobs)
    assert all(1 <= len(top) <= 2 for top in lp.top_logprobs)
    # greedy: the sampled token is the best candidate
    assert all(abs(max(top.values()) - v) < 1e-4 for top, v in zip(lp.top_logprobs,
                                                                    lp.token_logprobs))
    chat = sdk.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                       max_tokens=3, temperature=0, logprobs=True,
                                       top_logprobs=2)
    assert len(chat.choices[0].logprobs.content) == 3
