"""`--tool-call-parser pythonic` (issue 29): Llama 3.2's / Llama 4's Python-list tool calls, with
the examples of Meta's Llama 3.2 prompt-format page and vLLM's tool-calling docs, whole and
streamed; what is no call stays content; deep input is refused before `ast` sees it."""
from __future__ import annotations

import pytest
from test_gateway_fakes import FakeBackend
from test_gateway_http import ipc_address, make_config
from test_structured_gateway import Recorder, sdk

from gateway.app import create_app
from gateway.tool_parser import make_parser, parse_all
from gateway.tools import parse_tools, with_parser


def _tool(name, **props):
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": {k: {"type": v} for k, v in props.items()}}}}


TOOLS = [_tool("get_user_info", user_id="integer", special="string"),
         _tool("get_weather", city="string", metric="string")]


def cfg():
    return with_parser(parse_tools({"tools": TOOLS}), "pythonic")


@pytest.mark.parametrize("text,want", [
    # Meta's Llama 3.2 prompt-format page
    ("[get_user_info(user_id=7890, special='black')]",
     [("get_user_info", {"user_id": 7890, "special": "black"})]),
    # vLLM's tool-calling docs (pythonic)
    (("[get_weather(city='San Francisco', metric='celsius'), get_weather(city='Seattle', "
     "metric='celsius')]"), [("get_weather", {"city": "San Francisco", "metric": "celsius"}),
                            ("get_weather", {"city": "Seattle", "metric": "celsius"})]),
    # Llama 4's wrapper, literals of every kind
    ('<|python_start|>[get_weather(city="Oslo", metric=None)]<|python_end|>',
     [("get_weather", {"city": "Oslo", "metric": None})]),
    ("  [get_user_info(user_id=-1, special={'a': [1, 2.5, True]})]\n",
     [("get_user_info", {"user_id": -1, "special": {"a": [1, 2.5, True]}})]),
])
def test_calls_whole_and_streamed(text, want):
    content, calls = parse_all(text, cfg())
    assert content is None and [(c.name, c.arguments) for c in calls] == want
    p = make_parser(cfg())
    shown = [p.feed(ch)[0] for ch in text]
    tail, got = p.finish()
    assert "".join(shown) + tail == "" and [(c.name, c.arguments) for c in got] == want


@pytest.mark.parametrize("text", [
    "The weather is fine.",
    "[rm_rf(path='/')]",                       # not a listed tool
    "[get_weather('Paris')]",                  # positional arguments
    "[get_weather(city=open('/etc/passwd'))]",  # not a literal: never evaluated
    "[get_weather(**{'city': 'x'})]",
    "[get_weather(city='x')",                  # cut
    "[]",
    "[" * 200 + "]" * 200,                     # deeper than ast is given
])
def test_what_is_not_a_call_stays_content(text):
    assert parse_all(text, cfg()) == (text, [])


def test_text_streams_at_once_and_a_list_is_held():
    p = make_parser(cfg())
    assert p.feed("Sure") == ("Sure", []) and p.feed(", [x]") == (", [x]", [])
    p = make_parser(cfg())
    assert p.feed("<|py") == ("", []) and p.feed("thon_start|>[get_w") == ("", [])


async def test_through_the_gateway(aiohttp_client):
    rec = Recorder("[get_weather(city='Rome', metric='celsius')]")
    b = await FakeBackend(ipc_address(), script=rec).start()
    try:
        client = await aiohttp_client(create_app(make_config(b.address,
                                                             tool_call_parser="pythonic"),
                                                 startup_wait_s=5.0))
        resp = await sdk(client).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], tools=TOOLS)
        call = resp.choices[0].message.tool_calls[0]
        assert call.function.name == "get_weather" and resp.choices[0].finish_reason == \
            "tool_calls"
        assert call.function.arguments == '{"city": "Rome", "metric": "celsius"}'
    finally:
        await b.stop()
