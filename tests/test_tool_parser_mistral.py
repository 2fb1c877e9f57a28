"""`--tool-call-parser mistral` (issue 29) against Mistral's published formats: the assistant turns
of Mistral's tokenization guide (mistralai/cookbook, concept-deep-dive/tokenization/
tool_calling.md: tokenizers V2, V3, V3-Tekken) and the v11 / v13 forms mistral-common writes
(`name[ARGS]{...}`, `name[CALL_ID]id[ARGS]{...}`), whole and streamed, and through the gateway."""
from __future__ import annotations

import json
import re

import pytest
from test_gateway_fakes import FakeBackend
from test_gateway_http import ipc_address, make_config
from test_structured_gateway import Recorder, sdk

from gateway.app import create_app
from gateway.tool_parser import make_parser, parse_all, sampling_for_parser
from gateway.tools import parse_tools, with_parser

CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Performs mathematical calculations",
    "parameters": {"type": "object", "properties": {"operation": {
        "type": "string", "description": "The operation to be done in python format."}},
        "required": ["operation"]}}}
WEATHER = {"type": "function", "function": {"name": "get_current_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "state": {"type": "string"},
                                     "unit": {"type": "string"}}}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
MULTIPLY = {"type": "function", "function": {"name": "multiply", "parameters": {"type": "object"}}}
CALC_ARGS = {"operation": "2+2", "format": "celsius"}
SF = {"city": "San Francisco", "state": "CA", "unit": "celsius"}
ID = re.compile(r"[A-Za-z0-9]{9}\Z")

# (assistant output as the model writes it, [(name, arguments, id or None)], content)
EXAMPLES = [
    # the guide's tokenizer V2 turn (after [/INST], without the </s> that ends it)
    (('[TOOL_CALLS] [{"name": "calculator", "arguments": {"operation": "2+2", "format": '
     '"celsius"}}]'), [("calculator", CALC_ARGS, None)], None),
    # V3: the call carries its id
    (('[TOOL_CALLS] [{"name": "calculator", "arguments": {"operation": "2+2", "format": '
     '"celsius"}, "id": "VvvODy9mT"}]'), [("calculator", CALC_ARGS, "VvvODy9mT")], None),
    # V3-Tekken: no space after the control token
    (('[TOOL_CALLS][{"name": "calculator", "arguments": {"operation": "2+2", "format": '
     '"celsius"}, "id": "VvvODy9mT"}]'), [("calculator", CALC_ARGS, "VvvODy9mT")], None),
    # v11 (Mistral Small 3.1 and later): name[ARGS]{...} per call
    (('[TOOL_CALLS]get_current_weather[ARGS]{"city": "San Francisco", "state": "CA", "unit": '
     '"celsius"}'), [("get_current_weather", SF, None)], None),
    ('[TOOL_CALLS]add[ARGS]{"a": 3.5, "b": 4}[TOOL_CALLS]multiply[ARGS]{"a": 3, "b": 6}',
     [("add", {"a": 3.5, "b": 4}, None), ("multiply", {"a": 3, "b": 6}, None)], None),
    # v11 with [ARGS] dropped by a detokenizer that skips it
    ('[TOOL_CALLS]add{"a": 3.5, "b": 4}', [("add", {"a": 3.5, "b": 4}, None)], None),
    # v13: the call id between the name and the arguments
    ('[TOOL_CALLS]add[CALL_ID]a1B2c3D4e[ARGS]{"a": 1, "b": 2}',
     [("add", {"a": 1, "b": 2}, "a1B2c3D4e")], None),
    # content before the calls, and several calls in one V3 array
    (('Let me check.[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": '
     '"get_current_weather", "arguments": {"city": "San Francisco", "state": "CA", "unit": '
     '"celsius"}}]'), [("add", {"a": 1, "b": 2}, None), ("get_current_weather", SF, None)],
     "Let me check."),
]


def cfg(*tools):
    return with_parser(parse_tools({"tools": list(tools or (CALCULATOR, WEATHER, ADD,
                                                            MULTIPLY))}), "mistral")


def _check(calls, want):
    assert [(c.name, c.arguments) for c in calls] == [(n, a) for n, a, _ in want]
    for c, (_, _, call_id) in zip(calls, want):
        assert ID.match(c.id)  # Mistral's templates accept only 9 letters and digits
        if call_id is not None:
            assert c.id == call_id
    assert len({c.id for c in calls}) == len(calls)


@pytest.mark.parametrize("text,want,content", EXAMPLES)
def test_published_formats_whole(text, want, content):
    got_content, calls = parse_all(text, cfg())
    assert got_content == content
    _check(calls, want)
    openai = calls[0].openai(0)
    assert json.loads(openai["function"]["arguments"]) == want[0][1]


@pytest.mark.parametrize("text,want,content", EXAMPLES)
def test_published_formats_streamed_one_character_at_a_time(text, want, content):
    p = make_parser(cfg())
    shown, calls = [], []
    for ch in text:
        c, new = p.feed(ch)
        shown.append(c)
        calls += new
    c, new = p.finish()
    shown.append(c)
    calls += new
    assert "".join(shown) == (content or "")
    _check(calls, want)


def test_content_streams_until_the_control_token_and_calls_come_out_when_complete():
    p = make_parser(cfg())
    assert p.feed("Sure, [TOOL") == ("Sure, ", [])  # only a possible marker is held back
    assert p.feed("_CALLS]add[ARGS]{\"a\": 1") == ("", [])
    content, calls = p.feed(', "b": 2}')  # complete JSON: out before the reply ends
    assert content == "" and calls[0].name == "add" and calls[0].arguments == {"a": 1, "b": 2}
    assert p.finish() == ("", [])


@pytest.mark.parametrize("text", [
    "The weather is fine.",
    '[TOOL_CALLS] [{"name": "rm_rf", "arguments": {}}]',        # not a listed tool
    '[TOOL_CALLS]rm_rf[ARGS]{"path": "/"}',
    '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}',     # cut before its end
    "[TOOL_CALLS] not json at all",
    '[TOOL_CALLS]add[ARGS]["not", "an", "object"]',
    "Brackets [TOOL] and [ARGS] in prose.",
])
def test_what_is_not_a_call_stays_content_as_written(text):
    assert parse_all(text, cfg()) == (text, [])
    p = make_parser(cfg())
    shown = "".join(p.feed(ch)[0] for ch in text) + p.finish()[0]
    assert shown == text and p.calls == []


def test_a_known_call_after_an_unknown_one_is_still_a_call():
    content, calls = parse_all('[TOOL_CALLS]rm[ARGS]{}[TOOL_CALLS]add[ARGS]{"a": 1}', cfg())
    assert content == "[TOOL_CALLS]rm[ARGS]{}" and [c.name for c in calls] == ["add"]


def test_the_parser_keeps_special_tokens_in_the_text_only_when_it_reads_them():
    from gateway.openai_schema import SamplingParams

    s = SamplingParams()
    assert sampling_for_parser(cfg(), s).skip_special_tokens is False
    for other in (with_parser(parse_tools({"tools": [ADD]}), "hermes"),
                  with_parser(parse_tools({"tools": [ADD], "tool_choice": "none"}), "mistral"),
                  None):
        assert sampling_for_parser(other, s) is s


async def test_through_the_gateway_with_the_openai_sdk(aiohttp_client):
    rec = Recorder('Checking.[TOOL_CALLS][{"name": "get_current_weather", "arguments": '
                   '{"city": "San Francisco", "state": "CA", "unit": "celsius"}}]')
    b = await FakeBackend(ipc_address(), script=rec).start()
    try:
        client = await aiohttp_client(create_app(make_config(b.address,
                                                             tool_call_parser="mistral"),
                                                 startup_wait_s=5.0))
        oa = sdk(client)
        msgs = [{"role": "user", "content": "Weather in SF?"}]
        resp = await oa.chat.completions.create(model="tiny", messages=msgs, tools=[WEATHER])
        call = resp.choices[0].message.tool_calls[0]
        assert call.function.name == "get_current_weather" and ID.match(call.id)
        assert json.loads(call.function.arguments) == SF
        assert resp.choices[0].message.content == "Checking."
        assert resp.choices[0].finish_reason == "tool_calls"
        assert rec.samplings[-1].skip_special_tokens is False  # [TOOL_CALLS] stays in the text
        stream = await oa.chat.completions.create(model="tiny", messages=msgs, tools=[WEATHER],
                                                  stream=True)
        deltas = [c.choices[0].delta async for c in stream if c.choices]
        calls = [tc for d in deltas for tc in (d.tool_calls or [])]
        assert len(calls) == 1 and calls[0].function.name == "get_current_weather"
        assert "".join(d.content or "" for d in deltas) == "Checking."
        await oa.chat.completions.create(model="tiny", messages=msgs)  # no tools: specials
        assert not rec.samplings[-1].HasField("skip_special_tokens") or \
            rec.samplings[-1].skip_special_tokens
    finally:
        await b.stop()
