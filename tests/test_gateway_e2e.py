"""End to end: `tidegate serve` with its embedded tiny backend, driven by the openai SDK,
raw HTTP and the ZMQ client library."""
from __future__ import annotations

import asyncio
import random
import time

import aiohttp
import openai
import pytest
from serve_helpers import serving
from test_gateway_http import ipc_address

from gateway.client import AsyncClient, Client

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server():
    door = ipc_address()
    with serving("--model", "tiny", "--zmq-listen", door) as s:
        yield {**s, "door": door}


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
        sdk.completions.create(model="tiny", prompt="a", best_of=3)
    assert info.value.body["param"] == "best_of"
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


# --- every parameter of vLLM's completions / chat request, through the SDK -----------------------
# (the README's table of supported parameters names these tests)
EOS_ID, BOS_ID = 257, 256


def _ids(sdk, prompt="def f(x):", **kw):
    extra = {"return_token_ids": True, **kw.pop("extra_body", {})}
    out = sdk.completions.create(model="tiny", prompt=prompt, extra_body=extra, **kw)
    return out, out.choices[0].token_ids


def test_sdk_logit_bias_min_tokens_stop_token_ids(sdk):
    _, ids = _ids(sdk, max_tokens=6, temperature=0, logit_bias={"65": 100},
                  extra_body={"ignore_eos": True})
    assert ids == [65] * 6
    _, plain = _ids(sdk, max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    out, ids = _ids(sdk, max_tokens=6, temperature=0, extra_body={"stop_token_ids": [plain[0]]})
    assert ids == [plain[0]] and out.choices[0].finish_reason == "stop"
    assert out.choices[0].text == ""  # the stop token is not part of the text
    out, ids = _ids(sdk, max_tokens=12, temperature=0, logit_bias={str(EOS_ID): 100},
                    extra_body={"min_tokens": 5})
    assert len(ids) == 6 and ids[-1] == EOS_ID and EOS_ID not in ids[:5]


def test_sdk_penalties_shift_the_greedy_choice_as_defined(sdk):
    # presence/frequency subtract from the logits: the chosen token must be the best of the
    # returned top-20 candidates after the same subtraction (logprobs are the model's own)
    out, ids = _ids(sdk, max_tokens=12, temperature=0, logprobs=20, presence_penalty=1.0,
                    frequency_penalty=1.5, extra_body={"ignore_eos": True})
    lp = out.choices[0].logprobs
    _, plain = _ids(sdk, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    for k, (tok, top) in enumerate(zip(ids, lp.top_logprobs)):
        seen = ids[:k]

        def adjusted(text, value, seen=seen):
            tid = list(text.encode("utf-8", "surrogateescape"))
            n = seen.count(tid[0]) if len(tid) == 1 else 0
            return value - 1.5 * n - (1.0 if n else 0.0)
        chosen = lp.token_logprobs[k] - 1.5 * seen.count(tok) - (1.0 if tok in seen else 0.0)
        assert all(chosen >= adjusted(t, v) - 1e-4 for t, v in top.items()), k
    _, rep = _ids(sdk, max_tokens=12, temperature=0, extra_body={"ignore_eos": True,
                                                                 "repetition_penalty": 3.0})
    assert rep != plain and ids != plain


def test_sdk_min_p_top_k_top_p_seed(sdk):
    _, greedy = _ids(sdk, max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    for extra in ({"min_p": 1.0}, {"top_k": 1}):
        _, ids = _ids(sdk, max_tokens=8, temperature=1.0, seed=3,
                      extra_body={"ignore_eos": True, **extra})
        assert ids == greedy, extra
    _, ids = _ids(sdk, max_tokens=8, temperature=1.0, top_p=1e-6, seed=3,
                  extra_body={"ignore_eos": True})
    assert ids == greedy
    _, a = _ids(sdk, max_tokens=8, temperature=1.0, seed=11, extra_body={"ignore_eos": True})
    _, b = _ids(sdk, max_tokens=8, temperature=1.0, seed=11, extra_body={"ignore_eos": True})
    assert a == b


def test_sdk_n_best_of_echo_suffix_request_id(sdk):
    out = sdk.completions.create(model="tiny", prompt="abc", n=3, max_tokens=4, temperature=1.0,
                                 seed=5, extra_body={"ignore_eos": True})
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert out.usage.prompt_tokens == 4 and out.usage.completion_tokens == 12
    assert len({c.text for c in out.choices}) > 1  # seeds 5, 6, 7
    out = sdk.completions.create(model="tiny", prompt="abc", n=2, best_of=2, max_tokens=2)
    assert len(out.choices) == 2
    out = sdk.completions.create(model="tiny", prompt="abc", echo=True, logprobs=1, max_tokens=3,
                                 temperature=0, extra_body={"ignore_eos": True,
                                                            "request_id": "mine"})
    assert out.choices[0].text.startswith("abc") and out.id == "cmpl-mine"
    assert out.choices[0].logprobs.text_offset[0] == 3
    with pytest.raises(openai.BadRequestError) as info:  # the tiny preset has no FIM tokens
        sdk.completions.create(model="tiny", prompt="def f(", suffix="\n", max_tokens=3)
    assert info.value.body["param"] == "suffix"


def test_sdk_special_tokens_and_stop_options(sdk):
    bos = {str(BOS_ID): 100}
    kept = sdk.completions.create(model="tiny", prompt="x", max_tokens=2, temperature=0,
                                  logit_bias=bos, extra_body={"skip_special_tokens": False})
    assert kept.choices[0].text == "<|bos|><|bos|>"
    skipped = sdk.completions.create(model="tiny", prompt="x", max_tokens=2, temperature=0,
                                     logit_bias=bos)
    assert skipped.choices[0].text == ""
    out = sdk.completions.create(model="tiny", prompt="x", max_tokens=2,
                                 extra_body={"add_special_tokens": False})
    assert out.usage.prompt_tokens == 1  # no BOS
    full = sdk.completions.create(model="tiny", prompt="x", max_tokens=20, temperature=0,
                                  logit_bias={"97": 5, "98": 5},
                                  extra_body={"ignore_eos": True}).choices[0].text
    stop = next(ch for ch in full[2:] if ch != "\ufffd")
    got = sdk.completions.create(model="tiny", prompt="x", max_tokens=20, temperature=0,
                                 logit_bias={"97": 5, "98": 5}, stop=[stop],
                                 extra_body={"ignore_eos": True,
                                             "include_stop_str_in_output": True})
    assert got.choices[0].text == full[:full.find(stop) + 1]
    stops = [f"zz{i}" for i in range(15)] + [stop]
    got = sdk.completions.create(model="tiny", prompt="x", max_tokens=20, temperature=0,
                                 logit_bias={"97": 5, "98": 5}, stop=stops,
                                 extra_body={"ignore_eos": True})
    assert got.choices[0].text == full[:full.find(stop)]


REJECTED_COMPLETION = {
    "use_beam_search": True, "length_penalty": 0.5, "allowed_token_ids": [1],
    "bad_words": ["x"], "prompt_logprobs": 1, "truncate_prompt_tokens": 4,
    "guided_grammar": "g", "guided_whitespace_pattern": " ", "logits_processors": ["x"],
    "return_tokens_as_token_ids": True, "prompt_embeds": "AAAA", "cache_salt": "s",
    "kv_transfer_params": {}, "vllm_xargs": {"a": 1}, "spaces_between_special_tokens": False,
}
# served since issue 29 (structured output, tools): tests/test_structured_gateway.py
REJECTED_CHAT = {
    "tool_choice": "required",  # without tools
    "continue_final_message": True, "chat_template": "{{ messages }}",
    "chat_template_kwargs": {"enable_thinking": True}, "documents": [{"text": "d"}],
    "reasoning_effort": "high", "mm_processor_kwargs": {}, "functions": [{"name": "f"}],
}


@pytest.mark.parametrize("name", sorted(REJECTED_COMPLETION))
def test_sdk_rejects_unimplemented_completion_params_by_name(sdk, name):
    with pytest.raises(openai.BadRequestError) as info:
        sdk.completions.create(model="tiny", prompt="a", max_tokens=1,
                               extra_body={name: REJECTED_COMPLETION[name]})
    assert info.value.body["param"] == name


@pytest.mark.parametrize("name", sorted(REJECTED_CHAT))
def test_sdk_rejects_unimplemented_chat_params_by_name(sdk, name):
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "a"}],
                                    max_tokens=1, extra_body={name: REJECTED_CHAT[name]})
    assert info.value.body["param"] == name


def test_sdk_chat_params(sdk):
    msgs = [{"role": "user", "content": "hi"}]
    out = sdk.chat.completions.create(model="tiny", messages=msgs, max_completion_tokens=3,
                                      n=2, temperature=0, seed=1, user="u", logprobs=True,
                                      top_logprobs=2, presence_penalty=0.5,
                                      frequency_penalty=0.5, logit_bias={"65": 100},
                                      parallel_tool_calls=False, tool_choice="none",
                                      response_format={"type": "text"},
                                      extra_body={"ignore_eos": True, "min_p": 0.1,
                                                  "repetition_penalty": 1.1, "top_k": 5,
                                                  "min_tokens": 1, "priority": 0})
    assert len(out.choices) == 2 and all(c.message.content == "AAA" for c in out.choices)
    assert len(out.choices[0].logprobs.content) == 3
    echo = sdk.chat.completions.create(
        model="tiny", messages=msgs + [{"role": "assistant", "content": "So "}], max_tokens=2,
        extra_body={"echo": True, "add_generation_prompt": False})
    assert echo.choices[0].message.content.startswith("So ")


async def test_n_choices_reuse_the_prompt_blocks_of_the_first(server):
    """Choices 1..n-1 are sent after choice 0's prefill: the backend finds the prompt's full
    blocks in its prefix cache (counted in vllm:prefix_cache_hits) instead of computing them."""
    url = server["url"]
    prompt = "".join(f"line_{i} = {i * 7}\n" for i in range(12))  # 12 x ~12 bytes, unseen before
    async with aiohttp.ClientSession() as session:
        await settled_usage(session, url)
        hits_before = await metric(session, url, "vllm:prefix_cache_hits_total")
        async with session.post(url + "/v1/completions", json={
                "prompt": prompt, "n": 4, "max_tokens": 3, "ignore_eos": True,
                "return_token_ids": True}) as resp:
            body = await resp.json()
        assert resp.status == 200, body
        prompt_len = len(body["choices"][0]["prompt_token_ids"])
        assert body["usage"]["prompt_tokens"] == prompt_len
        await settled_usage(session, url)  # a LoadReport after the request carries the counters
        hits = await metric(session, url, "vllm:prefix_cache_hits_total") - hits_before
    full_blocks = (prompt_len // 16) * 16
    assert hits >= 3 * full_blocks, (hits, full_blocks)
