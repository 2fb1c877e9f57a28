"""Structured output and tool calling at the gateway, against the fake backend: what reaches the
wire (SamplingParams.grammar), the 400s, and tool calls parsed out of the output, whole and
streamed, through the unchanged `openai` SDK."""
from __future__ import annotations

import json

import openai
import pytest
from test_gateway_fakes import EOS, FakeBackend
from test_gateway_http import ipc_address, make_config, post, read_sse

from gateway.app import create_app
from proto import tidegate_pb2 as pb

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string"}}}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


class Recorder:
    """A script for the fake backend: answers `text`, and keeps what each request carried."""

    def __init__(self, text: str = "plain text") -> None:
        self.text = text
        self.samplings: list[pb.SamplingParams] = []
        self.prompts: list[list[int]] = []

    def __call__(self, prompt_ids, sampling):
        self.samplings.append(sampling)
        self.prompts.append(list(prompt_ids))
        return list(self.text.encode()) + [EOS]

    def prompt_text(self, i: int = -1) -> str:
        return bytes(t for t in self.prompts[i] if t < 256).decode()


@pytest.fixture
async def rec_client(aiohttp_client):
    backends = []

    async def make(text: str = "plain text"):
        rec = Recorder(text)
        b = await FakeBackend(ipc_address(), script=rec).start()
        backends.append(b)
        client = await aiohttp_client(create_app(make_config(b.address), startup_wait_s=5.0))
        return client, rec
    yield make
    for b in backends:
        await b.stop()


def sdk(client) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="x", max_retries=0)


# --- structured output fields -> the wire ------------------------------------------------------
@pytest.mark.parametrize("field,kind", [
    ({"response_format": {"type": "json_object"}}, pb.Grammar.JSON_OBJECT),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "strict": True, "schema": {"type": "object", "properties": {
            "a": {"type": "integer"}}, "required": ["a"]}}}}, pb.Grammar.JSON_SCHEMA),
    ({"guided_json": {"type": "array", "items": {"type": "string"}}}, pb.Grammar.JSON_SCHEMA),
    ({"guided_regex": "[0-9]{3}-[a-z]+"}, pb.Grammar.REGEX),
    ({"guided_choice": ["yes", "no", "it \"depends\""]}, pb.Grammar.CHOICE),
    ({"guided_grammar": 'root ::= "a" | "b"'}, pb.Grammar.GRAMMAR),
    ({"structured_outputs": {"regex": "x+"}}, pb.Grammar.REGEX),
    ({"structured_outputs": {"json": '{"type": "object"}'}}, pb.Grammar.JSON_SCHEMA),
])
async def test_structured_fields_reach_the_wire(rec_client, field, kind):
    client, rec = await rec_client()
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "q"}]}),
                       ("/v1/completions", {"prompt": "q"})):
        status, out = await post(client, path, {**body, **field, "max_tokens": 20})
        assert status == 200, out
        assert rec.samplings[-1].HasField("grammar")
        assert rec.samplings[-1].grammar.kind == kind


async def test_no_constraint_sends_no_grammar(rec_client):
    client, rec = await rec_client()
    status, _ = await post(client, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "q"}], "response_format": {"type": "text"}})
    assert status == 200 and not rec.samplings[-1].HasField("grammar")


@pytest.mark.parametrize("field,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "strin"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {
        "type": "object", "properties": {"a": {"$ref": "http://example.com/x.json"}}}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_grammar": "start: undefined_rule"}, "guided_grammar"),
    ({"guided_json": {"type": "object"}, "guided_regex": "x"}, "guided_regex"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"structured_outputs": {"structural_tag": {}}}, "structured_outputs.structural_tag"),
    ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
     "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "blob"}}}],
      "tool_choice": "required"}, "tools"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
     "response_format"),
    ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
])
async def test_bad_structured_requests_are_400s_naming_the_parameter(rec_client, field, param):
    client, rec = await rec_client()
    status, out = await post(client, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "q"}], **field})
    assert status == 400, out
    assert out["error"]["param"] == param, out
    assert rec.samplings == []  # nothing was queued


# --- tool calls --------------------------------------------------------------------------------
async def test_required_tool_choice_sends_the_call_grammar_and_returns_tool_calls(rec_client):
    client, rec = await rec_client(CALL)
    resp = await sdk(client).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER, CLOCK], tool_choice="required")
    g = rec.samplings[-1].grammar
    assert g.kind == pb.Grammar.GRAMMAR and '"get_weather"' in g.text and '"get_time"' in g.text
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    # the tools were shown to the model in the generic format
    assert "<tool_call>" in rec.prompt_text() and '"get_time"' in rec.prompt_text()


async def test_named_tool_choice_is_forced_to_that_tool(rec_client):
    client, rec = await rec_client(CALL)
    resp = await sdk(client).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER, CLOCK],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False)
    g = rec.samplings[-1].grammar.text
    assert '"get_weather"' in g and '"get_time"' not in g
    assert resp.choices[0].finish_reason == "stop"  # OpenAI's answer for a named function
    assert resp.choices[0].message.tool_calls[0].function.name == "get_weather"


async def test_auto_parses_calls_and_keeps_text(rec_client):
    client, rec = await rec_client("Let me check.\n" + CALL)
    resp = await sdk(client).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER])
    assert not rec.samplings[-1].HasField("grammar")  # auto: the model chooses
    msg = resp.choices[0].message
    assert msg.content == "Let me check.\n"
    assert msg.tool_calls[0].function.name == "get_weather"
    assert resp.choices[0].finish_reason == "tool_calls"


async def test_auto_leaves_unknown_tools_as_text(rec_client):
    text = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    client, _ = await rec_client(text)
    resp = await sdk(client).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "x"}], tools=[WEATHER])
    assert resp.choices[0].message.content == text and not resp.choices[0].message.tool_calls
    assert resp.choices[0].finish_reason == "stop"


async def test_tool_choice_none_shows_no_tools_and_parses_nothing(rec_client):
    client, rec = await rec_client(CALL)
    resp = await sdk(client).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "x"}], tools=[WEATHER],
        tool_choice="none")
    assert "get_weather" not in rec.prompt_text()
    assert resp.choices[0].message.content == CALL


async def test_streaming_tool_call_deltas_through_the_sdk(rec_client):
    two = "Checking.\n" + CALL + "\n" + CALL.replace("Paris", "Oslo")
    client, _ = await rec_client(two)
    stream = await sdk(client).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "x"}], tools=[WEATHER],
        tool_choice="auto", stream=True)
    content, calls, finish = "", {}, None
    async for chunk in stream:
        d = chunk.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or ():
            entry = calls.setdefault(tc.index, {"name": "", "arguments": "", "id": tc.id})
            entry["name"] += tc.function.name or ""
            entry["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert content == "Checking.\n"
    assert [calls[i]["name"] for i in sorted(calls)] == ["get_weather", "get_weather"]
    assert [json.loads(calls[i]["arguments"])["city"] for i in sorted(calls)] == ["Paris", "Oslo"]
    assert all(c["id"].startswith("call_") for c in calls.values())
    assert finish == "tool_calls"


async def test_streaming_raw_events_hold_back_only_a_tag_prefix(rec_client):
    client, _ = await rec_client("a < b <tool_ca")  # never becomes a call: all of it is content
    resp = await client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "x"}], "tools": [WEATHER], "stream": True})
    events = await read_sse(resp)
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]
                   if e["choices"])
    assert text == "a < b <tool_ca"


async def test_two_turn_tool_loop(rec_client):
    client, rec = await rec_client("It is sunny in Paris.")
    api = sdk(client)
    resp = await api.chat.completions.create(model="tiny", tools=[WEATHER], messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21C"}])
    prompt = rec.prompt_text()
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' \
        in prompt
    assert "<tool_response>\nsunny, 21C\n</tool_response>" in prompt
    assert resp.choices[0].message.content == "It is sunny in Paris."
    assert resp.choices[0].finish_reason == "stop"


async def test_openai_sdk_structured_output(rec_client):
    client, rec = await rec_client('{"a": 1}')
    resp = await sdk(client).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "x"}],
        response_format={"type": "json_schema", "json_schema": {
            "name": "obj", "strict": True, "schema": {
                "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                "additionalProperties": False}}})
    assert json.loads(resp.choices[0].message.content) == {"a": 1}
    assert json.loads(rec.samplings[-1].grammar.text)["required"] == ["a"]
    with pytest.raises(openai.BadRequestError) as err:
        await sdk(client).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}],
            response_format={"type": "json_schema", "json_schema": {
                "name": "o", "schema": {"type": "object", "minProperties": "two"}}})
    assert err.value.body["param"] == "response_format.json_schema.schema"


async def test_strict_closes_objects_that_do_not_say_otherwise(rec_client):
    client, rec = await rec_client('{"a": {"b": 1}}')
    schema = {"type": "object", "properties": {
        "a": {"type": "object", "properties": {"b": {"type": "integer"}}},
        "c": {"type": "object", "properties": {}, "additionalProperties": True},
        "d": {"enum": [{"properties": {}}]}}}
    for strict, closed in ((True, True), (False, False)):
        status, _ = await post(client, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "s", "strict": strict, "schema": schema}}})
        assert status == 200
        sent = json.loads(rec.samplings[-1].grammar.text)
        assert ("additionalProperties" in sent) == closed
        assert ("additionalProperties" in sent["properties"]["a"]) == closed
        assert sent["properties"]["c"]["additionalProperties"] is True
        assert sent["properties"]["d"] == {"enum": [{"properties": {}}]}  # values untouched


def test_http_backends_get_the_grammar_as_structured_outputs():
    from gateway.http_backend import completion_body

    s = pb.SamplingParams(max_tokens=5)
    assert "structured_outputs" not in completion_body("m", [1], s)
    for kind, text, want in (
            (pb.Grammar.JSON_SCHEMA, '{"type": "object"}', {"json": {"type": "object"}}),
            (pb.Grammar.JSON_OBJECT, "", {"json_object": True}),
            (pb.Grammar.REGEX, "a+", {"regex": "a+"}),
            (pb.Grammar.CHOICE, '["x", "y"]', {"choice": ["x", "y"]}),
            (pb.Grammar.GRAMMAR, 'start: "a"', {"grammar": 'start: "a"'})):
        s.grammar.kind, s.grammar.text = kind, text
        assert completion_body("m", [1], s)["structured_outputs"] == want


def test_the_zmq_front_door_checks_the_sampling_and_leaves_the_grammar_to_submit():
    """The wire grammar is not dropped by the sampling check: FrontDoor._submit reads it
    (gateway.frontdoor_structured; tests/test_frontdoor_structured.py serves it)."""
    from gateway.frontdoor import _check_wire_sampling
    from gateway.frontdoor_structured import structured_from_wire
    from gateway.validation import LIMITS

    req = pb.GenerateRequest(request_id="r", sampling=pb.SamplingParams(max_tokens=5))
    req.sampling.grammar.kind = pb.Grammar.JSON_OBJECT
    _check_wire_sampling(req.sampling, LIMITS)
    spec, param = structured_from_wire(req)
    assert spec.kind == "json_object" and param == "grammar"


# --- --tool-call-parser, and chat templates that render tools themselves ---------------------
def _weather_cfg(parser="json"):
    from gateway.tools import parse_tools, with_parser

    return with_parser(parse_tools({"tools": [WEATHER]}), parser)


def test_json_parser_whole_streamed_and_refused():
    from gateway.tool_parser import make_parser, parse_all

    cfg = _weather_cfg()
    one = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    content, calls = parse_all(one, cfg)
    assert content is None and calls[0].arguments == {"city": "Paris"}
    content, calls = parse_all(" [" + one + ", " + one.replace("Paris", "Oslo") + "]", cfg)
    assert [c.arguments["city"] for c in calls] == ["Paris", "Oslo"]
    for text in ('{"name": "rm", "arguments": {}}', "{not json", "Sunny today."):
        assert parse_all(text, cfg) == (text, [])
    p = make_parser(cfg)  # streamed: held while it could be a call, passed on once it cannot
    assert p.feed("  {\"na") == ("", [])
    assert p.feed('me": "get_weather", "arguments": {}}') == ("", [])
    assert p.finish()[1][0].name == "get_weather"
    p = make_parser(cfg)
    assert p.feed("Hel") == ("Hel", []) and p.feed("lo {") == ("lo {", [])


async def test_server_parser_setting_reaches_the_response(aiohttp_client):
    rec = Recorder('{"name": "get_weather", "arguments": {"city": "Rome"}}')
    b = await FakeBackend(ipc_address(), script=rec).start()
    try:
        client = await aiohttp_client(create_app(make_config(b.address, tool_call_parser="json"),
                                                 startup_wait_s=5.0))
        resp = await sdk(client).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], tools=[WEATHER])
        assert resp.choices[0].message.tool_calls[0].function.arguments == '{"city": "Rome"}'
        assert resp.choices[0].finish_reason == "tool_calls"
    finally:
        await b.stop()


async def test_a_template_that_renders_tools_gets_them_natively():
    from test_gateway_fakes import tokenizer_json

    from gateway.chat_render import chat_prompt_ids
    from gateway.openai_schema import ChatMessage
    from tokenizer.bundle import TokenizerBundle

    template = ("{% for t in tools %}[TOOL {{ t.function.name }}]{% endfor %}"
                "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
                "{% for c in m.tool_calls or [] %}[CALL {{ c.function.name }} "
                "{{ c.function.arguments.city }}]{% endfor %}"
                "{% if m.tool_call_id %}[FOR {{ m.tool_call_id }}]{% endif %}{% endfor %}")

    class Gw:
        passes_text = False
        bundle = TokenizerBundle.from_parts(tokenizer_json(), template, 256, (257,), "t")

    cfg = _weather_cfg("hermes")
    msgs = [ChatMessage("user", "hi"),
            ChatMessage("assistant", "", ({"id": "c1", "name": "get_weather",
                                           "arguments": '{"city": "Oslo"}'},)),
            ChatMessage("tool", "cold", (), "c1")]
    ids = await chat_prompt_ids(Gw(), msgs, cfg, True, False)
    assert Gw.bundle.decode(ids) == ("[TOOL get_weather]<user>hi<assistant>[CALL get_weather "
                                     "Oslo]<tool>cold[FOR c1]")
