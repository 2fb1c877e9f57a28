"""`tidegate serve --backend http://…` without `--tokenizer`, as a user points tidegate at vLLM:
one `tidegate serve` (embedded tiny backend) stands for the OpenAI-compatible server, a second
one in front of it has no tokenizer. Prompts are tokenized by the server's /tokenize and the
text comes back with the tokens (gateway.remote_tokenizer, gateway.http_backend), so through
the openai SDK the second answers what the first answers — never a 500."""
from __future__ import annotations

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

from gateway.client import Client, InvalidRequestError

ROOT = Path(__file__).parents[1]
pytestmark = pytest.mark.slow


def _serve(*args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.tidegate_cli", "serve", "--port", "0",
         "--log-level", "warning", *args],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    line = ""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if "serving model" in line or not line:
            break
    m = re.search(r"serving model \S+ on (http://\S+)", line)
    if not m:
        proc.kill()
        raise AssertionError(f"tidegate serve {' '.join(args)} did not start: {line!r}")
    return proc, m.group(1)


@pytest.fixture(scope="module")
def servers():
    upstream, up_url = _serve("--model", "tiny")
    front = None
    try:
        door = ipc_address()
        front, front_url = _serve("--backend", up_url, "--zmq-listen", door)
        sdk_up = openai.OpenAI(base_url=up_url + "/v1", api_key="unused", max_retries=0)
        sdk = openai.OpenAI(base_url=front_url + "/v1", api_key="unused", max_retries=0)
        # the front gateway answers 503 until the server has introduced itself
        deadline = time.monotonic() + 30
        while True:
            try:
                sdk.models.list()
                break
            except openai.APIStatusError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield {"up": sdk_up, "front": sdk, "up_url": up_url, "front_url": front_url,
               "door": door}
    finally:
        for proc in (front, upstream):
            if proc is not None:
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(60) == 0


def test_text_completion_is_the_servers(servers):
    up, front = servers["up"], servers["front"]
    kwargs = {"model": "tiny", "prompt": "def fib(n):", "max_tokens": 12, "temperature": 0}
    want = up.completions.create(**kwargs)
    got = front.completions.create(**kwargs)
    assert got.choices[0].text == want.choices[0].text
    assert got.choices[0].finish_reason == "length"
    assert got.usage.prompt_tokens == want.usage.prompt_tokens == 12  # the server's BOS included
    assert got.usage.completion_tokens == 12


def test_streaming_chat_echo_and_stop(servers):
    up, front = servers["up"], servers["front"]
    kwargs = {"model": "tiny", "prompt": "hello", "max_tokens": 16, "temperature": 0}
    full = front.completions.create(**kwargs).choices[0].text
    chunks = list(front.completions.create(**kwargs, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full
    msgs = [{"role": "system", "content": "You write code."}, {"role": "user", "content": "hi"}]
    want = up.chat.completions.create(model="tiny", messages=msgs, max_tokens=10, temperature=0)
    got = front.chat.completions.create(model="tiny", messages=msgs, max_tokens=10,
                                        temperature=0)
    assert got.choices[0].message.content == want.choices[0].message.content
    assert got.usage.prompt_tokens == want.usage.prompt_tokens
    # a token-id prompt's echo goes through the server's /detokenize
    echoed = front.completions.create(model="tiny", prompt=[104, 105], max_tokens=1,
                                      temperature=0, echo=True).choices[0].text
    assert echoed.startswith("hi")
    # stop strings are matched in the passed-through text
    long = front.completions.create(model="tiny", prompt="import os\n", max_tokens=24,
                                    temperature=0, extra_body={"ignore_eos": True})
    text = long.choices[0].text
    candidates = [i for i in range(1, len(text)) if text[i] != "\ufffd"]
    assert candidates, f"no character to stop on in {text!r}"
    cut = candidates[len(candidates) // 2]
    got = front.completions.create(model="tiny", prompt="import os\n", max_tokens=24,
                                   temperature=0, stop=[text[cut]],
                                   extra_body={"ignore_eos": True})
    assert got.choices[0].text == text[:text.find(text[cut])]
    assert got.choices[0].finish_reason == "stop"


def test_what_needs_a_local_tokenizer_is_a_clear_400(servers):
    front = servers["front"]
    with pytest.raises(openai.BadRequestError) as info:  # FIM templates are applied to text here
        front.completions.create(model="tiny", prompt="def f(", suffix="\n", max_tokens=4)
    assert info.value.body["code"] == "tokenizer_unavailable"
    assert "--tokenizer" in info.value.body["message"]
    # the ZMQ client library detokenizes itself: it is told so at connect, not left to fail
    with pytest.raises(InvalidRequestError, match="--tokenizer"):
        Client(servers["door"])


async def test_tokenize_routes_are_the_servers(servers):
    async with aiohttp.ClientSession() as session:
        for body in ({"prompt": "def f(x):"},
                     {"messages": [{"role": "user", "content": "hi"}]}):
            answers = []
            for url in (servers["up_url"], servers["front_url"]):
                async with session.post(url + "/tokenize", json=body) as resp:
                    assert resp.status == 200
                    answers.append(await resp.json())
            assert answers[0]["tokens"] == answers[1]["tokens"] and answers[1]["count"] > 2
        async with session.post(servers["front_url"] + "/detokenize",
                                json={"tokens": [104, 105]}) as resp:
            assert resp.status == 200 and (await resp.json())["prompt"] == "hi"
