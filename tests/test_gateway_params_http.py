"""Sampling controls, n, echo offsets, stop-string options and unknown fields through the HTTP
layer, against the fake backend (which records what reached the wire)."""
from __future__ import annotations

import logging

import pytest
from test_gateway_fakes import DEFAULT_TEXT, EOS, FakeBackend
from test_gateway_http import ipc_address, make_config, post, read_sse

from gateway.app import create_app
from gateway.validation import RequestLimits


@pytest.fixture
async def backend():
    seen = []

    def script(prompt_ids, sampling):
        seen.append((prompt_ids, sampling))
        return list(DEFAULT_TEXT.encode()) + [EOS]

    b = await FakeBackend(ipc_address(), script=script).start()
    b.seen = seen
    yield b
    await b.stop()


@pytest.fixture
def client_of(aiohttp_client, backend):
    async def make(**kw):
        return await aiohttp_client(create_app(make_config(backend.address, **kw),
                                               startup_wait_s=5.0))
    return make


async def test_sampling_controls_reach_the_wire(client_of, backend):
    client = await client_of()
    status, body = await post(client, "/v1/completions", {
        "prompt": "x", "max_tokens": 40, "min_p": 0.05, "repetition_penalty": 1.2,
        "presence_penalty": 0.5, "frequency_penalty": -0.25, "logit_bias": {"65": 3, "66": -100},
        "min_tokens": 4, "stop_token_ids": [10, 11]})
    assert status == 200, body
    _, s = backend.seen[-1]
    assert s.min_p == pytest.approx(0.05) and s.repetition_penalty == pytest.approx(1.2)
    assert s.presence_penalty == 0.5 and s.frequency_penalty == -0.25
    assert dict(s.logit_bias) == {65: 3.0, 66: -100.0}
    assert s.min_tokens == 4 and list(s.stop_token_ids) == [10, 11]


async def test_n_choices_share_the_prompt_and_usage_counts_it_once(client_of, backend):
    client = await client_of()
    status, body = await post(client, "/v1/completions",
                              {"prompt": ["ab", "cde"], "n": 3, "max_tokens": 5, "seed": 11})
    assert status == 200, body
    assert [c["index"] for c in body["choices"]] == list(range(6))
    assert all(c["text"] == DEFAULT_TEXT[:5] for c in body["choices"])
    # prompts "ab" and "cde" with BOS: 3 + 4 tokens, counted once each; 6 choices x 5 tokens
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": 30, "total_tokens": 37}
    seeds = sorted(s.seed for _, s in backend.seen[-6:])
    assert seeds == [11, 11, 12, 12, 13, 13]
    status, body = await post(client, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "n": 2, "max_tokens": 3})
    assert status == 200 and [c["index"] for c in body["choices"]] == [0, 1]
    assert body["usage"]["completion_tokens"] == 6
    resp = await client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "n": 2, "max_tokens": 3,
        "stream": True, "stream_options": {"include_usage": True}})
    events = await read_sse(resp)
    texts = {0: "", 1: ""}
    for e in events[:-1]:
        for c in e["choices"]:
            texts[c["index"]] += c["delta"].get("content", "")
    assert texts == {0: DEFAULT_TEXT[:3], 1: DEFAULT_TEXT[:3]}
    assert events[-2]["usage"]["completion_tokens"] == 6


async def test_best_of_as_vllm_v1(client_of):
    client = await client_of()
    status, body = await post(client, "/v1/completions", {"prompt": "x", "best_of": 2})
    assert status == 400 and body["error"]["param"] == "best_of"
    status, body = await post(client, "/v1/completions",
                              {"prompt": "x", "best_of": 2, "n": 2, "max_tokens": 2})
    assert status == 200 and len(body["choices"]) == 2


async def test_echo_text_offsets_start_after_the_prompt(client_of):
    client = await client_of()
    for stream in (False, True):
        req = {"prompt": "Say", "max_tokens": 6, "echo": True, "logprobs": 1, "stream": stream}
        if stream:
            events = await read_sse(await client.post("/v1/completions", json=req))
            lps = [e["choices"][0]["logprobs"] for e in events[:-1] if e["choices"]]
            offsets = [o for lp in lps if lp for o in lp["text_offset"]]
            text = "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"])
        else:
            _status, body = await post(client, "/v1/completions", req)
            offsets = body["choices"][0]["logprobs"]["text_offset"]
            text = body["choices"][0]["text"]
        assert text.startswith("Say") and offsets[0] == 3, (stream, offsets)
        tokens = DEFAULT_TEXT[:6]
        assert offsets == [3 + i for i in range(6)] and text == "Say" + tokens


async def test_include_stop_str_and_min_tokens_for_stop_strings(client_of):
    client = await client_of()
    _, body = await post(client, "/v1/completions", {"prompt": "x", "max_tokens": 30,
                                                          "stop": ["wö"]})
    assert body["choices"][0]["text"] == "Hello, "
    _, body = await post(client, "/v1/completions", {
        "prompt": "x", "max_tokens": 30, "stop": ["wö"], "include_stop_str_in_output": True})
    assert body["choices"][0]["text"] == "Hello, wö"
    # "l" is tokens 3, 4 and 11: no stop string ends the output before min_tokens tokens
    for min_tokens, want in [(0, "He"), (4, "Hel"), (5, "Hello, wör")]:
        _status, body = await post(client, "/v1/completions", {
            "prompt": "x", "max_tokens": 30, "stop": ["l"], "min_tokens": min_tokens})
        assert body["choices"][0]["text"] == want, min_tokens
        assert body["choices"][0]["finish_reason"] == "stop"


async def test_skip_special_tokens(client_of, backend):
    backend.script = lambda p, s: [ord("a"), 256, ord("b"), EOS]  # 256 = <|bos|>, a special
    client = await client_of()
    _, body = await post(client, "/v1/completions", {"prompt": "x", "max_tokens": 8})
    assert body["choices"][0]["text"] == "ab"
    _, body = await post(client, "/v1/completions",
                         {"prompt": "x", "max_tokens": 8, "skip_special_tokens": False})
    assert body["choices"][0]["text"] == "a<|bos|>b"


async def test_unknown_fields_logged_once_or_rejected_when_strict(client_of, caplog):
    client = await client_of()
    with caplog.at_level(logging.WARNING, logger="tidegate.gateway.validation"):
        for _ in range(3):
            status, _ = await post(client, "/v1/completions",
                                   {"prompt": "x", "max_tokens": 1, "frobnicate_xyz": 1})
            assert status == 200
    assert sum("frobnicate_xyz" in r.getMessage() for r in caplog.records) == 1
    strict = await client_of(limits=RequestLimits(strict_api=True))
    status, body = await post(strict, "/v1/completions",
                              {"prompt": "x", "max_tokens": 1, "frobnicate_xyz": 1})
    assert status == 400 and body["error"]["param"] == "frobnicate_xyz"
    status, body = await post(strict, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
        "response_format": {"type": "json_schema"}})
    assert status == 400 and body["error"]["param"] == "response_format.json_schema"


async def test_stop_strings_limit_is_configurable(client_of):
    client = await client_of(limits=RequestLimits(max_stop_strings=2))
    status, body = await post(client, "/v1/completions", {"prompt": "x", "stop": ["a", "b", "c"]})
    assert status == 400 and body["error"]["param"] == "stop"
    client = await client_of()
    stops = [f"zz{i}" for i in range(15)] + ["wö"]
    status, body = await post(client, "/v1/completions",
                              {"prompt": "x", "max_tokens": 30, "stop": stops})
    assert status == 200 and body["choices"][0]["text"] == "Hello, "


async def test_chat_echo_and_request_id(client_of):
    client = await client_of()
    status, body = await post(client, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "So: "}],
        "max_tokens": 5, "echo": True, "add_generation_prompt": False, "request_id": "abc"})
    assert status == 200, body
    assert body["choices"][0]["message"]["content"] == "So: " + DEFAULT_TEXT[:5]
    assert body["id"] == "chatcmpl-abc"


async def test_fim_suffix_refused_for_a_model_without_fim_tokens(client_of):
    client = await client_of()
    status, body = await post(client, "/v1/completions", {"prompt": "def f(", "suffix": "\n"})
    assert status == 400 and body["error"]["param"] == "suffix"
    assert body["error"]["code"] == "fim_not_supported"
