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


# --- --tool-call-parser auto: the parser the model's chat template asks for ------------------
@pytest.mark.parametrize("template,parser", [
    # what each family's template writes when the model is given tools (excerpts)
    (("{{- '[AVAILABLE_TOOLS]' + tools|tojson + '[/AVAILABLE_TOOLS]' }}{%- if message.tool_calls %}"
     "{{- '[TOOL_CALLS]' }}"), "mistral"),
    (('For each function call, return a json object with function name and arguments within '
     '<tool_call></tool_call> XML tags'), "hermes"),
    (("If you decide to invoke any of the function(s), you MUST put it in the format of "
     "[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]"),
     "pythonic"),
    ("{{- '<|python_start|>' }}", "pythonic"),
    (('Respond in the format {"name": function name, "parameters": dictionary of argument name '
     'and its value}.'), "json"),
    ("{% for message in messages %}{{ message['content'] }}{% endfor %}", "hermes"),
    (None, "hermes"),
])
def test_auto_picks_the_parser_the_template_asks_for(template, parser):
    from gateway.tools import parser_for_template

    assert parser_for_template(template) == parser
    # (the family's parser when the template renders the tools itself, as these families' do)
    native = None if template is None else "{% if tools %}{{ tools|tojson }}{% endif %}" + template
    cfg = with_parser(parse_tools({"tools": TOOLS}), "auto", native)
    assert cfg.parser == parser and make_parser(cfg) is not None


async def test_auto_through_the_gateway_on_a_mistral_template(aiohttp_client):
    rec = Recorder('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}]')
    template = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                "{% if tools %}[AVAILABLE_TOOLS]{{ tools|tojson }}[/AVAILABLE_TOOLS]{% endif %}"
                "{# calls: [TOOL_CALLS] #}")

    class MistralTemplated(FakeBackend):
        def info(self):
            info = super().info()
            info.chat_template = template
            return info

    b = await MistralTemplated(ipc_address(), script=rec).start()
    try:
        client = await aiohttp_client(create_app(make_config(b.address, tool_call_parser="auto"),
                                                 startup_wait_s=5.0))
        resp = await sdk(client).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], tools=TOOLS)
        assert resp.choices[0].message.tool_calls[0].function.arguments == '{"city": "Rome"}'
    finally:
        await b.stop()
