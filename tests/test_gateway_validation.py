"""Request validation: every bad input is a 400 in the OpenAI error shape naming its param."""
from __future__ import annotations

import json

import pytest

from gateway.errors import APIError
from gateway.validation import (
    check_context_length,
    parse_chat_request,
    parse_completion_request,
    parse_json_body,
)


def completion(**fields):
    body = {"model": "tiny", "prompt": "hi"}
    body.update(fields)
    return parse_completion_request(body)


def error_of(fn, *args, **kwargs) -> APIError:
    with pytest.raises(APIError) as info:
        fn(*args, **kwargs)
    err = info.value
    assert err.status == 400
    shape = err.to_dict()["error"]
    assert set(shape) == {"message", "type", "param", "code"}
    assert shape["param"] is not None
    return err


@pytest.mark.parametrize("raw,param", [
    (b"{not json", "body"),
    (b"\xff\xfe{}", "body"),
    (b"[1, 2]", "body"),
    (b'"prompt"', "body"),
    (b"", "body"),
])
def test_body_level_errors(raw, param):
    assert error_of(parse_json_body, raw).param == param


@pytest.mark.parametrize("fields,param", [
    ({"prompt": None}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [[]]}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": [1, "a"]}, "prompt"),
    ({"prompt": [-1]}, "prompt"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": "5"}, "max_tokens"),
    ({"max_tokens": 2.5}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": 2.01}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"n": 0}, "n"),
    ({"n": 17}, "n"),
    ({"stop": [str(i) for i in range(17)]}, "stop"),
    ({"stop": ["x" * 257]}, "stop"),
    ({"stop": [1]}, "stop"),
    ({"stop": [""]}, "stop"),
    ({"stream": "yes"}, "stream"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"logprobs": 21}, "logprobs"),
    ({"seed": 1.5}, "seed"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"deadline_ms": -5}, "deadline_ms"),
    ({"priority": "high"}, "priority"),
    ({"model": 3}, "model"),
])
def test_completion_param_errors(fields, param):
    assert error_of(completion, **fields).param == param


def test_nan_from_raw_json_is_rejected():
    body = parse_json_body(b'{"prompt": "x", "temperature": NaN}')
    assert error_of(parse_completion_request, body).param == "temperature"


def test_prompt_forms():
    assert completion(prompt="abc").prompts == ("abc",)
    assert completion(prompt=["a", "b"]).prompts == ("a", "b")
    assert completion(prompt=[1, 2, 3]).prompts == ((1, 2, 3),)
    assert completion(prompt=[[1], [2, 3]]).prompts == ((1,), (2, 3))


def test_defaults_and_extras():
    req = completion()
    assert req.sampling.max_tokens == 16 and req.sampling.temperature == 1.0
    assert req.options.stream is False and req.echo is False
    req = completion(max_tokens=5, temperature=0, top_p=0.5, top_k=3, seed=7, stop="\n",
                     ignore_eos=True, priority=-1, deadline_ms=250, return_token_ids=True,
                     stream=True, stream_options={"include_usage": True}, user="u", logprobs=2,
                     echo=True, unknown_field=1)
    s, o = req.sampling, req.options
    assert (s.max_tokens, s.temperature, s.top_p, s.top_k, s.seed, s.stop) == \
        (5, 0.0, 0.5, 3, 7, ("\n",))
    assert s.ignore_eos and s.logprobs == 2 and req.echo
    assert (o.priority, o.deadline_ms, o.return_token_ids, o.stream, o.include_usage, o.user) == \
        (-1, 250.0, True, True, True, "u")


def chat(**fields):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    body.update(fields)
    return parse_chat_request(body)


@pytest.mark.parametrize("fields,param", [
    ({"messages": None}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": ["hi"]}, "messages[0]"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content[0]"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"n": -1}, "n"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "often"},
     "tool_choice"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"tool_choice": "required"}, "tool_choice"),
])
def test_chat_param_errors(fields, param):
    assert error_of(chat, **fields).param == param


def test_chat_parses_messages_and_parts():
    req = chat(messages=[
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None},
    ], logprobs=True, top_logprobs=3)
    assert [(m.role, m.content) for m in req.messages] == \
        [("system", "be brief"), ("user", "ab"), ("assistant", "")]
    assert req.sampling.max_tokens is None and req.sampling.logprobs == 3


def test_context_length_message_has_the_numbers():
    err = error_of(check_context_length, 100, 2000, 2048)
    assert err.param == "max_tokens" and "2048" in err.message and "2100" in err.message
    assert err.code == "context_length_exceeded"
    assert error_of(check_context_length, 2048, None, 2048).param == "prompt"
    check_context_length(48, 2000, 2048)


def test_error_json_shape():
    err = error_of(completion, best_of=3)
    assert json.loads(err.to_json()) == {"error": {"message": err.message,
                                                   "type": "invalid_request_error",
                                                   "param": "best_of", "code": "unsupported_value"}}
