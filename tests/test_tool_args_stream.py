"""Tool-call arguments streamed in pieces (issue 29). For every parser, a reply streamed in any
chunking gives, once the client has added up its deltas as the SDKs do (by index, strings
concatenated), exactly the content, calls and arguments strings of the same reply returned whole;
every parser streams arguments (pythonic's Python keyword arguments too, since issue 29's last
step): it sends a call as a first entry (index, id, type, name, arguments "" or a first piece) and
then entries of only its index and argument pieces. What is no call stays content, and a call begun
then cut off ends with the pieces sent (the documented behaviour). Through the gateway with the
unchanged `openai` and `anthropic` SDKs: a long call arrives in many deltas / input_json_delta
events, and the SDKs' accumulated result equals the non-streamed one."""
from __future__ import annotations

import json
import random
import unicodedata

import anthropic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_gateway_fakes import FakeBackend
from test_gateway_http import ipc_address, make_config
from test_structured_gateway import Recorder, sdk
from test_tool_args_json import OBJECTS, _write
from test_tool_parser_families import (
    CASES,
    DS_B,
    DS_CB,
    DS_CE,
    DS_E,
    DS_SEP,
    K_ARG,
    K_CB,
    K_CE,
    KS_B,
    KS_E,
    NOT_CALLS,
    TOOLS,
    cfg,
)
from test_tool_parser_mistral import EXAMPLES as MISTRAL_EXAMPLES

from gateway.app import create_app
from gateway.tool_parser import PARSERS, StreamShaper, shape_choice
from gateway.tools import parse_tools, with_parser

STREAMING = set(PARSERS)
NAMES = [t["function"]["name"] for t in TOOLS]
HYPOTHESIS = settings(max_examples=150, deadline=None,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def test_the_streaming_parsers_say_so():
    assert {name for name, p in PARSERS.items() if p.streams_arguments} == STREAMING


# --- the client's side: OpenAI deltas added up as the SDKs add them ---------------------------
def _streamed(config, chunks: list[str], finish: str = "stop") -> dict:
    """The reply as a client adds up StreamShaper's deltas; each call's entry count too."""
    shaper = StreamShaper(config, 1)
    content, calls, reason = "", {}, None
    for k, chunk in enumerate(chunks):
        delta, f = shaper.delta(0, chunk, finish if k == len(chunks) - 1 else None)
        content += delta.get("content", "")
        for e in delta.get("tool_calls", ()):
            if e["index"] not in calls:  # a call's first entry: all of it but later pieces
                assert e["index"] == len(calls) and e["type"] == "function"
                assert set(e) == {"index", "id", "type", "function"}
                assert set(e["function"]) == {"name", "arguments"}
                calls[e["index"]] = {"id": e["id"], "name": e["function"]["name"],
                                     "arguments": e["function"]["arguments"], "entries": 1}
            else:  # then only its index and a piece of its arguments
                assert set(e) == {"index", "function"} and set(e["function"]) == {"arguments"}
                assert e["function"]["arguments"]
                calls[e["index"]]["arguments"] += e["function"]["arguments"]
                calls[e["index"]]["entries"] += 1
        reason = f or reason
    return {"content": content, "calls": [calls[i] for i in sorted(calls)], "finish": reason}


def _whole(config, text: str, finish: str = "stop") -> dict:
    choice = shape_choice({"index": 0, "message": {"role": "assistant", "content": text},
                           "finish_reason": finish}, config)
    msg = choice["message"]
    return {"content": msg["content"] or "", "finish": choice["finish_reason"],
            "calls": [{"id": c["id"], "name": c["function"]["name"],
                       "arguments": c["function"]["arguments"]}
                      for c in msg.get("tool_calls", ())]}


def _chunks(text: str, cuts) -> list[str]:
    cuts = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def _check_same(config, text: str, cuts, finish: str = "stop") -> dict:
    whole = _whole(config, text, finish)
    got = _streamed(config, _chunks(text, cuts), finish)
    # (blanks around calls aside: the whole reply's content is None when only blanks are left,
    # and a stream drops a delta of only blanks once a call came, as it always has)
    assert "".join(got["content"].split()) == "".join(whole["content"].split())
    assert [(c["name"], c["arguments"]) for c in got["calls"]] == \
        [(c["name"], c["arguments"]) for c in whole["calls"]]
    given_ids = [c["id"] for c in whole["calls"] if c["id"].startswith("functions.")]
    assert given_ids == [c["id"] for c in got["calls"] if c["id"].startswith("functions.")]
    assert got["finish"] == whole["finish"]
    return got


# --- replies written the ways the JSON formats allow, with arguments in any JSON form -----------
def _ws(rng):
    return rng.choice(["", " ", "\n", "  "])


def _json_call(rng, name, args, key="arguments"):
    ws = _ws
    return (f'{ws(rng)}{{{ws(rng)}"name"{ws(rng)}:{ws(rng)}"{name}"{ws(rng)},{ws(rng)}"{key}"'
            f'{ws(rng)}:{ws(rng)}{args}{ws(rng)}}}{ws(rng)}')


def _reply(fmt: str, calls, rng) -> tuple[str, str]:
    """(parser, reply) with `calls` [(name, JSON text of the arguments)] in format `fmt`."""
    if fmt == "hermes":
        return "hermes", "\n".join(f"<tool_call>\n{_json_call(rng, n, a)}\n</tool_call>"
                                   for n, a in calls)
    if fmt == "internlm":
        return "internlm", "".join("<|action_start|><|plugin|>" + _json_call(rng, n, a, "parameters")
                                   + "<|action_end|>" for n, a in calls)
    if fmt == "deepseek_v3":
        return "deepseek_v3", DS_B + "\n".join(
            f"{DS_CB}function{DS_SEP}{n}\n```json\n{a}\n```{DS_CE}" for n, a in calls) + DS_E
    if fmt == "deepseek_v31":
        return "deepseek_v3", DS_B + "".join(f"{DS_CB}{n}{DS_SEP}{a}{DS_CE}" for n, a in calls) \
            + DS_E
    if fmt == "kimi_k2":
        return "kimi_k2", KS_B + "".join(f"{K_CB}functions.{n}:{i}{_ws(rng)}{K_ARG}{a}{K_CE}"
                                         for i, (n, a) in enumerate(calls)) + KS_E
    if fmt == "json":
        return "json", _json_call(rng, calls[0][0], calls[0][1], "parameters")
    if fmt == "granite":
        return "granite", "<|tool_call|>[" + ", ".join(
            _json_call(rng, n, a) for n, a in calls) + "]"
    if fmt == "mistral":
        return "mistral", "".join(f"[TOOL_CALLS]{n}[ARGS]{a}" for n, a in calls)
    if fmt == "openai":  # gpt-oss: each call a commentary message to its function
        return "openai", "<|start|>assistant".join(
            f"<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>{a}<|call|>"
            for n, a in calls)
    raise AssertionError(fmt)


FORMATS = ["hermes", "internlm", "deepseek_v3", "deepseek_v31", "kimi_k2", "json", "granite",
           "mistral", "openai"]


@HYPOTHESIS
@given(st.sampled_from(FORMATS), st.lists(st.tuples(st.sampled_from(NAMES), OBJECTS),
                                          min_size=1, max_size=3),
       st.sampled_from(["", "Let me look.\n", "I'll write it. "]), st.integers(0, 2**32),
       st.lists(st.integers(0, 10**6), max_size=40))
def test_pieces_add_up_to_the_whole_replys_arguments(fmt, calls, prose, seed, cuts):
    rng = random.Random(seed)
    calls = calls[:1] if fmt == "json" else calls
    parser, text = _reply(fmt, [(n, _write(a, rng)) for n, a in calls], rng)
    if parser not in ("json", "openai"):  # (harmony's prose is a message of its own)
        text = prose + text
    config = cfg(parser)
    whole = _whole(config, text)
    # the whole reply's arguments: json.dumps of what the model wrote, however it wrote it
    assert [(c["name"], c["arguments"]) for c in whole["calls"]] == \
        [(n, json.dumps(a, ensure_ascii=False)) for n, a in calls]
    got = _check_same(config, text, cuts)
    # and one character at a time, the most deltas a stream can have
    got = _check_same(config, text, range(len(text)))
    for call, (_, args) in zip(got["calls"], calls):
        pieces = call["entries"]
        if parser in STREAMING and len(json.dumps(args)) > 2:
            assert pieces > 1
        elif parser not in STREAMING:
            assert pieces == 1


# --- every parser: its families' replies, in random chunkings ----------------------------------
ALL_CASES = [(p, t) for p, t, _, _ in CASES] + [("mistral", t) for t, _, _ in MISTRAL_EXAMPLES] + [
    ("hermes", ('Sure.\n<tool_call>\n{"name": "write_file", "arguments": {"path": "a.py", '
                '"content": "def f():\\n    return \\"<tool_call>\\"\\n"}}\n</tool_call>\n')),
    ("json", ('[{"name": "get_time", "parameters": {}}, {"name": "read_file", "parameters": '
              '{"path": "x"}}]')),
    ("pythonic", '[get_weather(city="Paris", days=3), read_file(path="a.py")]'),
]


@pytest.mark.parametrize("parser,text", ALL_CASES)
@settings(max_examples=40, deadline=None)
@given(cuts=st.lists(st.integers(0, 10**6), max_size=30))
def test_every_parser_streams_its_replies_as_whole(parser, text, cuts):
    config = cfg(parser)
    if parser == "mistral":  # (the Mistral examples' own tools)
        from test_tool_parser_mistral import ADD, CALCULATOR, MULTIPLY, WEATHER
        config = with_parser(parse_tools({"tools": [CALCULATOR, WEATHER, ADD, MULTIPLY]}),
                             "mistral")
    _check_same(config, text, cuts)


# --- what is no call ---------------------------------------------------------------------------
@pytest.mark.parametrize("parser,text", NOT_CALLS)
@settings(max_examples=30, deadline=None)
@given(cuts=st.lists(st.integers(0, 10**6), max_size=20))
def test_no_call_is_content_and_a_call_begun_ends_with_its_pieces(parser, text, cuts):
    config = cfg(parser)
    whole = _whole(config, text)
    assert whole["calls"] == []
    got = _streamed(config, _chunks(text, cuts))
    if not got["calls"]:
        assert got["content"] == whole["content"]
        return
    # a block cut inside its arguments: the call was begun (a listed tool, its object open) and
    # a stream cannot take it back; it ends with the pieces sent, which do not parse
    # (what the stream showed as content is the model's text: in a section, the text after a
    # broken call, such as the section's end marker, still comes as content)
    assert parser in STREAMING
    assert got["content"] in whole["content"]
    for call in got["calls"]:
        assert call["name"] in NAMES and call["arguments"].startswith("{")
        with pytest.raises(ValueError):
            json.loads(call["arguments"])


def test_an_unknown_tool_or_an_early_mistake_never_starts_a_call():
    # the call starts only once the name is complete and listed and the object has begun
    for text in ('<tool_call>\n{"name": "rm_rf", "arguments": {"path": "/"}}\n</tool_call>',
                 '<tool_call>\n{"name": "get_weather", "arguments": [1]}\n</tool_call>',
                 '<tool_call>\n{"arguments": {"city": "Paris"}, "name": "get_wea',
                 '<tool_call>\n{"name": "get_weather" "arguments": {"city": "Paris"}}'):
        got = _streamed(cfg("hermes"), list(text))
        assert got["calls"] == [] and got["content"] == text


def test_a_call_cut_by_max_tokens_ends_with_its_pieces_and_finish_length():
    full = '{"path": "a.py", "content": "' + "print(1)\\n" * 50 + '"}'
    text = 'Writing.\n<tool_call>\n{"name": "write_file", "arguments": ' + full[:300]
    got = _streamed(cfg("hermes"), list(text), finish="length")
    (call,) = got["calls"]
    assert call["name"] == "write_file" and call["entries"] > 100
    assert json.dumps(json.loads(full)).startswith(call["arguments"])
    assert got["finish"] == "length" and got["content"] == "Writing.\n"
    # returned whole, the cut block is content, as the model wrote it
    whole = _whole(cfg("hermes"), text, "length")
    assert whole["calls"] == [] and whole["content"] == text and whole["finish"] == "length"


def test_keys_in_another_order_come_whole_and_equal():
    text = '<tool_call>\n{"arguments": {"city": "Paris"}, "name": "get_weather"}\n</tool_call>'
    got = _check_same(cfg("hermes"), text, range(len(text)))
    assert got["calls"][0]["entries"] == 1


def test_a_forced_choice_streams_its_grammars_calls_in_pieces():
    # tool_choice required / named: the grammar writes the generic format, read by hermes
    for choice in ("required", {"type": "function", "function": {"name": "write_file"}}):
        config = parse_tools({"tools": TOOLS, "tool_choice": choice})
        assert config.forced and with_parser(config, "deepseek_v3") is config
        args = {"path": "src/a.py", "content": "x = {'a': [1, 2]}\n" * 30}
        text = ('<tool_call>\n{"name": "write_file", "arguments": '
                + json.dumps(args, ensure_ascii=False) + "}\n</tool_call>")
        got = _check_same(config, text, range(0, len(text), 3))
        (call,) = got["calls"]
        assert call["entries"] > 50 and json.loads(call["arguments"]) == args
        assert got["finish"] == ("stop" if isinstance(choice, dict) else "tool_calls")


# --- through the gateway with the unchanged SDKs ----------------------------------------------
WRITE = {"type": "function", "function": {"name": "write_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["path", "content"]}}}
CODE = 'def hello(name):\n    """Say hi."""\n    print(f"hi, {name} \\u00e9")\n    return [1, 2]\n'
LONG = ("I'll write the file.\n<tool_call>\n"
        + json.dumps({"name": "write_file", "arguments": {"path": "src/hello.py",
                                                          "content": CODE * 6}})
        + "\n</tool_call>")


@pytest.fixture
async def long_call_client(aiohttp_client):
    rec = Recorder(LONG)
    b = await FakeBackend(ipc_address(), script=rec).start()
    try:
        yield await aiohttp_client(create_app(make_config(b.address), startup_wait_s=5.0))
    finally:
        await b.stop()


@pytest.mark.parametrize("tool_choice", ["auto", "required"])
async def test_openai_sdk_gets_a_long_call_in_pieces_that_add_up(long_call_client, tool_choice):
    api = sdk(long_call_client)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "write hello.py"}],
            "tools": [WRITE], "tool_choice": tool_choice}
    whole = await api.chat.completions.create(**body)
    entries = 0
    async with api.chat.completions.stream(**body) as stream:
        async for event in stream:
            if event.type == "tool_calls.function.arguments.delta":
                entries += 1
        final = await stream.get_final_completion()
    (want,), (got,) = whole.choices[0].message.tool_calls, final.choices[0].message.tool_calls
    assert entries > 100  # (the fake backend's tokens are bytes)
    assert (got.function.name, got.function.arguments) == (want.function.name,
                                                           want.function.arguments)
    assert json.loads(got.function.arguments)["content"] == CODE * 6
    assert final.choices[0].message.content == whole.choices[0].message.content
    assert final.choices[0].finish_reason == whole.choices[0].finish_reason == "tool_calls"


async def test_anthropic_sdk_gets_input_json_delta_pieces_that_add_up(long_call_client):
    api = anthropic.AsyncAnthropic(base_url=str(long_call_client.make_url("")), api_key="k",
                                   max_retries=0)
    tool = {"name": "write_file", "input_schema": WRITE["function"]["parameters"]}
    body = {"model": "tiny", "max_tokens": 1500, "tools": [tool],
            "messages": [{"role": "user", "content": "write hello.py"}]}
    whole = await api.messages.create(**body)
    pieces = []
    async with api.messages.stream(**body) as stream:
        async for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                pieces.append(event.delta.partial_json)
        final = await stream.get_final_message()
    assert len(pieces) > 100
    assert next(b.input for b in final.content if b.type == "tool_use") == \
        next(b.input for b in whole.content if b.type == "tool_use")
    assert json.loads("".join(pieces)) == {"path": "src/hello.py", "content": CODE * 6}
    assert [b.type for b in final.content] == [b.type for b in whole.content] == ["text",
                                                                                 "tool_use"]
    assert final.stop_reason == whole.stop_reason == "tool_use"


# --- a head's decision on a text is its decision on every longer text ---------------------------
HEADS = [
    ("hermes", '<tool_call>', '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'),
    ("hermes", '<tool_call>', '{ "name" :"read_file" ,\n"parameters":{}}'),
    ("hermes", '<tool_call>', '{"name": "get_weathe", "arguments": {}}'),
    ("hermes", '<tool_call>', '{"name": "get_weather", "arguments": "{}"}'),
    ("internlm", "<|action_start|><|plugin|>", '\n{"name": "get_time", "parameters": {}}'),
    ("deepseek_v3", DS_CB, f'function{DS_SEP}get_weather\n```json\n{{"city": "x"}}\n```'),
    ("deepseek_v3", DS_CB, f'function{DS_SEP}get_weather\n\n{{"city": "x"}}'),
    ("deepseek_v3", DS_CB, f'function{DS_SEP}get_weather\n```jsonc\n{{"city": "x"}}\n```'),
    ("deepseek_v3", DS_CB, f'get_time{DS_SEP} {{}}'),
    ("deepseek_v3", DS_CB, f'rm_rf{DS_SEP}{{}}'),
    ("deepseek_v3", DS_CB, "get_time" + " " * 300 + f'{DS_SEP}{{}}'),
    ("kimi_k2", K_CB, f'functions.read_file:3 {K_ARG}{{"path": "a"}}'),
    ("kimi_k2", K_CB, f'read_file{K_ARG} []'),
]


@pytest.mark.parametrize("parser,begin,body", HEADS)
def test_a_head_decides_alike_on_every_prefix(parser, begin, body):
    from gateway.tool_parser import make_parser
    p = make_parser(cfg(parser))
    final = p._stream_head(body)
    for i in range(len(body)):
        got = p._stream_head(body[:i])
        assert got is None or got == final, (body[:i], got, final)


@pytest.mark.parametrize("text", [
    '[TOOL_CALLS]get_weather[ARGS] {"city": "x"}', '[TOOL_CALLS]get_time{}',
    '[TOOL_CALLS]read_file[CALL_ID]a1B2c3D4e[ARGS]{"path": "a"}',
    '[TOOL_CALLS]rm_rf[ARGS]{}', '[TOOL_CALLS]get_time[ARGS]"{}"', '[TOOL_CALLS] [{"name": "x"}]',
    "[TOOL_CALLS]get_time[CALL_ID]" + "x" * 80 + "[ARGS]{}"])
def test_a_mistral_head_decides_alike_on_every_prefix(text):
    from gateway.tool_parser import make_parser
    p = make_parser(cfg("mistral"))
    final = p._v11_head(text)
    for i in range(len("[TOOL_CALLS]"), len(text)):
        got = p._v11_head(text[:i])
        assert got is None or got == final, (text[:i], got, final)


def test_mistral_streams_the_models_own_call_id():
    text = '[TOOL_CALLS]read_file[CALL_ID]a1B2c3D4e[ARGS]{"path": "src/main.py"}'
    got = _check_same(cfg("mistral"), text, range(len(text)))
    assert got["calls"][0]["id"] == "a1B2c3D4e" and got["calls"][0]["entries"] > 5
    assert _whole(cfg("mistral"), text)["calls"][0]["id"] == "a1B2c3D4e"


# --- /v1/messages: the events a client replays, block by block --------------------------------
def _replay(events) -> list[dict]:
    """Content blocks as Anthropic's SDK builds them from the events (each block started,
    given its deltas and stopped before the next starts)."""
    blocks, open_ = [], None
    for name, data in events:
        if name == "content_block_start":
            assert open_ is None and data["index"] == len(blocks)
            open_ = data["index"]
            blocks.append({**data["content_block"], "json": "", "deltas": 0})
        elif name == "content_block_delta":
            assert data["index"] == open_
            d, b = data["delta"], blocks[open_]
            b["deltas"] += 1
            if d["type"] == "text_delta":
                b["text"] += d["text"]
            else:
                b["json"] += d["partial_json"]
        else:
            assert name == "content_block_stop" and data["index"] == open_
            open_ = None
    assert open_ is None
    return blocks


@pytest.mark.parametrize("parser,text", [
    ("granite", ('Both.<|tool_call|>[{"name": "read_file", "arguments": {"path": "a.py"}}, '
     '{"name": "write_file", "arguments": {"path": "b.py", "content": "x = 1\\n"}}]')),
    ("hermes", ('<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>'
     '\nand\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')),
    ("kimi_k2", "Look." + KS_B + f'{K_CB}functions.read_file:0{K_ARG}{{"path": "a"}}{K_CE}'
     + KS_E + "Done."),
    ("qwen3_coder", ("<tool_call>\n<function=read_file>\n<parameter=path>\na.py\n</parameter>\n"
     "</function>\n</tool_call>")),
])
def test_messages_stream_blocks_in_order_and_as_whole(parser, text):
    from gateway.anthropic import BlockWriter
    w = BlockWriter(cfg(parser), streaming=True)
    events = []
    for k, ch in enumerate(text):
        events += w.feed(ch, k == len(text) - 1)
    got = _replay(events)
    whole = BlockWriter(cfg(parser))
    whole.feed(text, True)
    assert [b["type"] for b in got] == [b["type"] for b in whole.blocks]
    for g, b in zip(got, whole.blocks):
        if b["type"] == "text":
            assert g["text"] == b["text"]
        else:
            assert g["name"] == b["name"] and json.loads(g["json"]) == b["input"]
            assert g["deltas"] > 1 if parser in STREAMING else g["deltas"] == 1
    assert w.num_calls == whole.num_calls > 0


def test_messages_stream_a_cut_call_ends_its_block_with_a_json_prefix():
    from gateway.anthropic import BlockWriter
    text = '<tool_call>\n{"name": "write_file", "arguments": {"path": "a.py", "content": "pri'
    w = BlockWriter(cfg("hermes"), streaming=True)
    events = [e for ch in text for e in w.feed(ch, False)] + w.feed("", True)
    (block,) = _replay(events)
    assert block["type"] == "tool_use" and block["json"] == '{"path": "a.py", "content": "pri'
    whole = BlockWriter(cfg("hermes"))
    whole.feed(text, True)
    assert whole.blocks == [{"type": "text", "text": text}]


# --- marker soup: whatever the model writes, the stream's shapes hold and nothing raises ---------
@pytest.mark.parametrize("parser", sorted(PARSERS))
def test_marker_soup_keeps_the_delta_and_event_shapes(parser):
    from test_tool_parser_families import SOUP

    from gateway.anthropic import BlockWriter
    rng = random.Random("soup-" + parser)
    soup = [*SOUP, '{"name": "write_file", "arguments": {"path": "a", "content": "x',
            '[TOOL_CALLS]get_time[ARGS]{', '[TOOL_CALLS]read_file{"path": "', '"}', "\\",
            '<|tool_call|>[{"name": "get_time", "arguments": {}}, ', '{"name": "get_time", ']
    for _ in range(120):
        text = "".join(rng.choice(soup) for _ in range(rng.randint(1, 20)))
        cuts = [rng.randrange(len(text) + 1) for _ in range(rng.randint(0, 12))]
        got = _streamed(cfg(parser), _chunks(text, cuts))  # (asserts each entry's shape)
        whole = _whole(cfg(parser), text)
        # the whole reply's calls are the stream's, in order, arguments and all (the stream
        # may have begun more: calls broken off, which the whole reply gives as content)
        streamed = iter([(c["name"], c["arguments"]) for c in got["calls"]])
        assert all((c["name"], c["arguments"]) in streamed for c in whole["calls"])
        w = BlockWriter(cfg(parser), streaming=True)
        events = []
        for k, chunk in enumerate(_chunks(text, cuts)):
            events += w.feed(chunk, k == len(_chunks(text, cuts)) - 1)
        _replay(events)  # (asserts the blocks' order)


# --- qwen3_coder: arguments rebuilt from tagged text, string parameters streamed as written ------
QWEN_BITS = ["</parameter>", "<parameter=", "</function>", "\n", " ", "<", ">", "a", "é", "\\",
             '"', "{", "x = 1", "\t", "</parameter>\n", "\n</parameter>", "<b>"]
QWEN_VALUES = {
    "path": st.lists(st.sampled_from(QWEN_BITS), max_size=6).map("".join),
    "content": st.lists(st.sampled_from(QWEN_BITS), max_size=25).map("".join),
    "query": st.text(max_size=8),
    "max_results": st.sampled_from(["3", " 20 ", "three", "1.0", "2.5"]),
    "regex": st.sampled_from(["true", "False", "yes"]),
    "paths": st.sampled_from(['["src", "tests"]', "[]", "src"]),
    "threshold": st.sampled_from(["0.5", "None", "null", "high"]),
    "options": st.sampled_from(['{"case": true}', "{}", "none"]),
}
QWEN_TOOLS = {"write_file": ["path", "content"], "get_time": [],
              "search": ["query", "max_results", "regex", "paths", "threshold", "options"]}


@st.composite
def qwen_replies(draw):
    calls = []
    for _ in range(draw(st.integers(1, 2))):
        name = draw(st.sampled_from(sorted(QWEN_TOOLS)))
        keys = draw(st.permutations(QWEN_TOOLS[name]))[:draw(st.integers(0, 3))]
        params = "".join(
            f"<parameter={k}>" + draw(st.sampled_from(["\n", "", "\n\n"])) + draw(QWEN_VALUES[k])
            + draw(st.sampled_from(["\n</parameter>\n", "</parameter>", "\n", "\n</parameter>  "]))
            for k in keys)
        call = f"<function={name}>" + draw(st.sampled_from(["\n", ""])) + params + "</function>"
        if draw(st.booleans()):
            call = "<tool_call>" + draw(st.sampled_from(["\n", "", " "])) + call + "\n</tool_call>"
        calls.append(call)
    return draw(st.sampled_from(["", "I'll write it.\n"])) + "\n".join(calls)


def _check_against_the_reader(parser: str, text: str, cuts) -> None:
    """The whole reply equals the reader's with streaming off (the reader as it was), and any
    chunking of it equals the whole (but for calls begun and then no call after all)."""
    config = cfg(parser)
    whole = _whole(config, text)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(PARSERS[parser], "streams_arguments", False)
        before = _whole(config, text)
    assert [(c["name"], c["arguments"]) for c in whole["calls"]] == \
        [(c["name"], c["arguments"]) for c in before["calls"]]
    assert whole["content"] == before["content"]
    got = _streamed(config, list(text))
    if len(got["calls"]) > len(whole["calls"]):  # a call begun, then no call after all
        streamed = iter([(c["name"], c["arguments"]) for c in got["calls"]])
        assert all((c["name"], c["arguments"]) in streamed for c in whole["calls"])
        return
    _check_same(config, text, cuts)
    got = _check_same(config, text, range(len(text)))
    for call in got["calls"]:  # the content of a file streams as it is written
        args = json.loads(call["arguments"])
        if len(args.get("content", "")) > 4:
            assert call["entries"] > 2


@HYPOTHESIS
@given(qwen_replies(), st.lists(st.integers(0, 10**6), max_size=40))
def test_qwen3_coder_pieces_add_up_to_what_the_reader_gives_whole(text, cuts):
    _check_against_the_reader("qwen3_coder", text, cuts)


# --- glm45 and deepseek_v32: values that end at their first end tag ----------------------------
TEXT_BITS = ["</arg_value", "<arg_key>", "</arg_key>", "<arg_value>", "</｜DSML｜parameter",
             "<｜DSML｜parameter name=\"x\">", "\n", " ", "<", ">", "a", "é", "\\", '"', "{",
             "x = 1", "｜"]
TEXT_VALUES = {**QWEN_VALUES,
               "path": st.lists(st.sampled_from(TEXT_BITS), max_size=5).map("".join),
               "content": st.lists(st.sampled_from(TEXT_BITS), max_size=25).map("".join)}


@st.composite
def glm_replies(draw):
    calls = []
    for _ in range(draw(st.integers(1, 2))):
        name = draw(st.sampled_from(sorted(QWEN_TOOLS)))
        nl = draw(st.sampled_from(["\n", ""]))  # (GLM-4.5 / 4.6, and 4.7)
        keys = draw(st.permutations(QWEN_TOOLS[name]))[:draw(st.integers(0, 3))]
        calls.append(f"<tool_call>{name}{nl}" + "".join(
            f"<arg_key>{k}</arg_key>{nl}<arg_value>{draw(TEXT_VALUES[k])}</arg_value>{nl}"
            for k in keys) + "</tool_call>")
    return draw(st.sampled_from(["", "Checking.\n"])) + "".join(calls)


@st.composite
def dsml_replies(draw):
    invokes = []
    for _ in range(draw(st.integers(1, 2))):
        name = draw(st.sampled_from(sorted(QWEN_TOOLS)))
        keys = draw(st.permutations(QWEN_TOOLS[name]))[:draw(st.integers(0, 3))]
        invokes.append(f'<｜DSML｜invoke name="{name}">\n' + "".join(
            f'<｜DSML｜parameter name="{k}"'
            + draw(st.sampled_from(['', ' string="true"', ' string="false"'])) + ">"
            + draw(TEXT_VALUES[k]) + "</｜DSML｜parameter>\n" for k in keys) + "</｜DSML｜invoke>\n")
    section = draw(st.sampled_from(["function_calls", "tool_calls"]))
    return (draw(st.sampled_from(["", "I'll look.\n\n"])) + f"<｜DSML｜{section}>\n"
            + "".join(invokes) + f"</｜DSML｜{section}>")


@HYPOTHESIS
@given(glm_replies(), st.lists(st.integers(0, 10**6), max_size=40))
def test_glm45_pieces_add_up_to_what_the_reader_gives_whole(text, cuts):
    _check_against_the_reader("glm45", text, cuts)


@HYPOTHESIS
@given(dsml_replies(), st.lists(st.integers(0, 10**6), max_size=40))
def test_deepseek_v32_pieces_add_up_to_what_the_reader_gives_whole(text, cuts):
    _check_against_the_reader("deepseek_v32", text, cuts)


def test_each_choice_streams_its_own_calls():
    # n > 1: one parser and one call count per choice, whatever order their pieces come in
    a = '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>'
    b = 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    shaper = StreamShaper(cfg("hermes"), 2)
    got = {0: [], 1: []}
    for k in range(max(len(a), len(b))):
        for i, text in ((1, b), (0, a)):
            last = k == len(text) - 1
            if k < len(text):
                got[i].append(shaper.delta(i, text[k], "stop" if last else None))
    for i, text in ((0, a), (1, b)):
        entries = [e for d, _ in got[i] for e in d.get("tool_calls", ())]
        assert {e["index"] for e in entries} == {0} and len(entries) > 5
        args = "".join(e["function"]["arguments"] for e in entries)
        assert args == _whole(cfg("hermes"), text)["calls"][0]["arguments"]
        assert got[i][-1][1] == "tool_calls"


@pytest.mark.parametrize("parser,text", [
    ("hermes", '<tool_call>\n{"name": "get_time", "arguments": {"a": DEEP}}\n</tool_call>'),
    ("json", '{"name": "get_time", "parameters": {"a": DEEP}}'),
    ("json", '[{"name": "get_time", "parameters": {"a": DEEP}}]'),
    ("granite", '<|tool_call|>[{"name": "get_time", "arguments": {"a": DEEP}}]'),
    ("mistral", '[TOOL_CALLS]get_time[ARGS]{"a": DEEP}'),
    ("internlm", ('<|action_start|><|plugin|>{"name": "get_time", "parameters": {"a": DEEP}}'
     '<|action_end|>')),
    ("qwen3_coder", "<function=search>\n<parameter=paths>\nDEEP\n</parameter>\n</function>"),
])
def test_json_nested_past_pythons_stack_is_no_call_and_no_error(parser, text):
    # json.loads raises RecursionError, not ValueError, past Python's stack: such a block is
    # content as the model wrote it (it was a 500 before), and a stream of it raises nothing;
    # a Qwen value that does not read as its type stays the model's text (a call still)
    deep = "[" * 50_000 + "]" * 50_000
    text = text.replace("DEEP", deep)
    whole = _whole(cfg(parser), text)
    if parser == "qwen3_coder":
        assert [json.loads(c["arguments"]) for c in whole["calls"]] == [{"paths": deep}]
        _check_same(cfg(parser), text, range(0, len(text), 997))
        return
    assert whole["calls"] == [] and whole["content"] == text
    _streamed(cfg(parser), _chunks(text, range(0, len(text), 997)))


# --- pythonic: Python keyword arguments, strings streamed as they are written ------------------
PY_SCALARS = (st.none() | st.booleans() | st.integers(-10**20, 10**20)
              | st.floats(allow_nan=False, allow_infinity=True)
              | st.text(st.characters(blacklist_categories=("Cs",)), max_size=12))
PY_VALUES = st.recursive(PY_SCALARS, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(
    st.text(max_size=5), kids, max_size=3), max_leaves=12)
PY_KEYS = ["city", "path", "content", "days", "_x", "match", "print", "cité", "n2"]
PY_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\", "'": "\\'", '"': '\\"',
              "\a": "\\a", "\b": "\\b", "\f": "\\f", "\v": "\\v"}


def _py_literal(s: str, rng) -> str:
    """`s` as one Python string literal: a random quote, prefix and way of writing each
    character (escapes of every kind, line continuations, CRLF in triple quotes, raw)."""
    quote = rng.choice(["'", '"', "'''", '"""'])
    q, triple = quote[0], len(quote) == 3
    if rng.random() < 0.25 and not set(s) & {q, "\r", "\x00"} and not s.endswith("\\") \
            and (triple or "\n" not in s) and "\\" + q not in s:
        return rng.choice("rR") + quote + s + quote  # raw: as it is
    out, last_q = [rng.choice(["", "", "u", "U"]), quote], False
    for k, ch in enumerate(s):
        o, ways = ord(ch), []
        if ch in PY_ESCAPES:
            ways.append(PY_ESCAPES[ch])
        if o < 0x100:
            ways.append(rng.choice([f"\\x{o:02x}", f"\\x{o:02X}"]))
        if o < 0o400:  # (up to \777 is read, but Python 3.11 warns past \377)
            ways.append(f"\\{o:03o}")
        if o < 0x10000:
            ways.append(f"\\u{o:04x}")
        ways.append(f"\\U{o:08X}")
        try:  # (names are read ignoring case, but for the algorithmic ones: CJK, Hangul)
            name = unicodedata.name(ch)
            ways.append("\\N{" + (name if "CJK" in name or "HANGUL" in name
                                   else rng.choice([name, name.lower()])) + "}")
        except ValueError:
            pass
        if ch not in "\\\r\x00" + ("" if triple else "\n") and (
                ch != q or triple and not last_q and k < len(s) - 1):
            ways += [ch] * 4
        if ch == "\n" and triple:
            ways += ["\r\n", "\r"]  # (Python reads both as \n)
        way = rng.choice(ways)
        if rng.random() < 0.05:
            way = "\\\n" + way  # a line continuation: nothing
        out.append(way)
        last_q = way == q
    return "".join(out) + quote


def _py_string(s: str, rng) -> str:
    """`s` as Python source: one literal, or several concatenated ('a' "b")."""
    cuts = sorted(rng.randrange(len(s) + 1) for _ in range(rng.choice([0, 0, 1, 2])))
    parts = [s[a:b] for a, b in zip([0, *cuts], [*cuts, len(s)])]
    return rng.choice([" ", "\n  ", " # more\n", " \\\n"]).join(_py_literal(p, rng) for p in parts)


def _py_value(v, rng) -> str:
    def ws():
        return rng.choice(["", "", " ", "\n", "  ", "\t", " # x\n"])
    if isinstance(v, dict):
        items = [ws() + _py_string(k, rng) + ws() + ":" + ws() + _py_value(x, rng) + ws()
                 for k, x in v.items()]
        return "{" + ",".join(items) + rng.choice(["", "," if items else ""]) + "}"
    if isinstance(v, list):
        items = [ws() + _py_value(x, rng) + ws() for x in v]
        if rng.random() < 0.3:  # a tuple: json.dumps writes it as a list
            return "(" + ",".join(items) + ("," if len(items) == 1 else "") + ")"
        return "[" + ",".join(items) + "]"
    if isinstance(v, str):
        return _py_string(v, rng)
    if v is None or isinstance(v, bool):
        return repr(v)
    if isinstance(v, int):
        return rng.choice([str(v), f"{v:_}", hex(v), f"({v})", "+" + str(v) if v >= 0 else str(v)])
    if v in (float("inf"), float("-inf")):
        return "-1e999" if v < 0 else "1e999"
    return rng.choice([repr(v), f"{v:.17e}"])


def _py_call(name, args: dict, rng) -> str:
    def ws():
        return rng.choice(["", "", " ", "\n    ", " # note\n"])
    keys = {k: ("ｃity" if k == "city" and rng.random() < 0.3 else k) for k in args}
    items = [ws() + keys[k] + ws() + "=" + ws() + _py_value(v, rng) + ws() for k, v in args.items()]
    return name + rng.choice(["", " "]) + "(" + ",".join(items) + rng.choice(
        ["", "," if items else ""]) + ")"


def _check_against_the_pythonic_reader(text, cuts, want=None) -> dict:
    """The whole reply equals the reader's with streaming off (today's reading: json.dumps of the
    evaluated keyword arguments), and any chunking streams the same."""
    config = cfg("pythonic")
    whole = _whole(config, text)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(PARSERS["pythonic"], "streams_arguments", False)
        before = _whole(config, text)
    assert [(c["name"], c["arguments"]) for c in whole["calls"]] == \
        [(c["name"], c["arguments"]) for c in before["calls"]]
    assert (whole["content"], whole["finish"]) == (before["content"], before["finish"])
    if want is not None:
        assert [(c["name"], c["arguments"]) for c in whole["calls"]] == want
    _check_same(config, text, cuts)
    return _check_same(config, text, range(len(text)))  # one character at a time


@HYPOTHESIS
@given(st.lists(st.tuples(st.sampled_from(NAMES), st.dictionaries(
    st.sampled_from(PY_KEYS), PY_VALUES, max_size=4)), min_size=1, max_size=3),
       st.booleans(), st.integers(0, 2**32), st.lists(st.integers(0, 10**6), max_size=40))
def test_pythonic_pieces_add_up_to_the_whole_replys_arguments(calls, wrapped, seed, cuts):
    rng = random.Random(seed)
    text = "[" + rng.choice([",", ", ", ",\n "]).join(
        _py_call(n, a, rng) for n, a in calls) + rng.choice(["]", ",]", "\n]"])
    if wrapped:
        text = "<|python_start|>" + rng.choice(["", "\n"]) + text + "<|python_end|>"
    want = [(n, json.dumps(a, ensure_ascii=False)) for n, a in calls]
    got = _check_against_the_pythonic_reader(rng.choice(["", " ", "\n"]) + text, cuts, want)
    for call, (_, args) in zip(got["calls"], calls):
        long = [v for v in args.values() if isinstance(v, str) and len(v) > 3]
        assert call["entries"] > (2 if long else 1)


@pytest.mark.parametrize("text", [
    "[get_weather(city='Paris', days=3), read_file(path=\"a.py\")]",
    ("<|python_start|>[write_file(path='a.py', content='''def f():\n    return \"x\"\n''')]"
     "<|python_end|>"),
    "[write_file(path=r'C:\\dir\\f.py', content=u'caf\\xe9 \\N{SNOWMAN} \\u2603 \\U0001F600')]",
    "[write_file(content='a' \"b\"\n  '''c''' # joined\n  R'\\d', path='x')]",
    ("[search(query='x', max_results=0x10, regex=False, paths=('src', 'tests'), "
     "threshold=-1.5e-3, options={'case': True, 1: None, 'n': [1_000, +2, -.5]})]"),
    "[write_file(path='x', content='\\d\\8\\w \\\n\\777\\0')]",  # unknown escapes keep the \\
    "[get_time(), get_time( ), get_weather(\n    city = 'Oslo' ,\n)]",
    "[write_file(path='''''', content=\"\"\"'''\"\"\")]",
    "[write_file(path='a''b', content='''x''''y')]",  # ('' then 'b'; ''' then 'y')
    "[read_file(path='a'),get_time()]",
    "[(get_time)(), read_file(path='a')]",  # a head written otherwise: whole from there
    "[read_file(path='a'), # and\n get_time()]",
    "[read_file(path='a'), get_time \\\n()]",
])
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # (\\d: Python 3.11 warns)
@settings(max_examples=20, deadline=None)
@given(cuts=st.lists(st.integers(0, 10**6), max_size=30))
def test_pythonic_literal_forms_stream_as_whole(text, cuts):
    _check_against_the_pythonic_reader(text, cuts)


@pytest.mark.parametrize("text", [
    "The weather is fine.",
    "[rm_rf(path='/')]",                          # not a listed tool: never begun
    "[get_weather('Paris')]",                     # begun: positional
    "[get_weather(city=open('/etc/passwd'))]",    # not a literal: never evaluated
    "[get_weather(city='x'.upper())]",            # a string that goes on: no literal
    "[get_weather(city='x' + 'y')]",
    "[write_file(path=b'a.py')]",                 # bytes, f-strings: no JSON value
    "[write_file(path=f'a.py')]",
    "[write_file(path='a.py', content='print(",  # cut by max_tokens
    "[get_weather(city='Paris')] and then some prose",
    "[get_weather(city='Paris')",
    "[get_weather(city='x')]\n```",
])
def test_pythonic_no_call_is_content_and_a_begun_call_ends_with_its_pieces(text):
    config = cfg("pythonic")
    whole = _whole(config, text, "length")
    assert whole["calls"] == [] and whole["content"] == text
    got = _streamed(config, list(text), "length")
    assert got["finish"] == "length"
    begun = text.startswith(("[get_weather(", "[write_file("))  # (a listed tool, its `(`)
    assert bool(got["calls"]) == begun
    if not begun:
        assert got["content"] == text
        return
    # begun: the stream ends it with the pieces sent, the JSON of
    # what was read (a prefix, or the whole object when only what came after it was wrong)
    (call,) = got["calls"]
    assert call["name"] in NAMES and call["arguments"].startswith("{")
    assert got["content"] == ""
    if "prose" in text or "```" in text:
        assert json.loads(call["arguments"]) == {"city": "Paris" if "prose" in text else "x"}


def test_pythonic_repeated_keyword_streams_both_values_the_same_object():
    # ast reads f(a=1, a=2) (only the compiler refuses it): the whole call keeps the last value
    # in the first one's place, as it always has; the stream cannot take the first back
    text = "[get_weather(city='Paris', days=3, city='Oslo')]"
    whole = _whole(cfg("pythonic"), text)
    got = _streamed(cfg("pythonic"), list(text))
    assert whole["calls"][0]["arguments"] == '{"city": "Oslo", "days": 3}'
    assert got["calls"][0]["arguments"] == '{"city": "Paris", "days": 3, "city": "Oslo"}'
    assert json.loads(got["calls"][0]["arguments"]) == json.loads(whole["calls"][0]["arguments"])


@pytest.mark.parametrize("body", [
    "[get_weather(city='x')]", "<|python_start|>\n[ read_file (path='a')]", "[get_weathe(x=1)]",
    "[if(x=1)]", "[get_time\n()]", "[get_time.x()]", "[ｇet_time()]", "[" + " " * 300 + "get_time()",
    "[get_time" + "e" * 70 + "()]", "[1]", "[]"])
def test_a_pythonic_head_decides_alike_on_every_prefix(body):
    from gateway.tool_parser import make_parser
    p = make_parser(cfg("pythonic"))
    final = p._head(body, -1)
    for i in range(len("<|python_start|>") if body.startswith("<|") else 1, len(body)):
        got = p._head(body[:i], -1)
        assert got is None or got == final, (body[:i], got, final)
    after = "read_file(path='a')"
    rest = body.removeprefix("<|python_start|>\n").removeprefix("[")
    text = "[" + after + " ," + rest
    final = p._head(text, len("[" + after))
    for i in range(len("[" + after), len(text)):
        got = p._head(text[:i], len("[" + after))
        assert got is None or got == final, (text[:i], got, final)


PY_CODE = ('def hello(name):\n    """Say hi."""\n    print(f"hi, {name} \\u00e9")\n'
           "    return {'a': [1, 2]}\n")
PY_LONG = "[write_file(path='src/hello.py', content=" + repr(PY_CODE * 6) + ")]"


@pytest.fixture
async def long_pythonic_client(aiohttp_client):
    b = await FakeBackend(ipc_address(), script=Recorder(PY_LONG)).start()
    try:
        yield await aiohttp_client(create_app(make_config(b.address, tool_call_parser="pythonic"),
                                              startup_wait_s=5.0))
    finally:
        await b.stop()


async def test_openai_sdk_gets_a_long_pythonic_call_in_pieces_that_add_up(long_pythonic_client):
    api = sdk(long_pythonic_client)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "write hello.py"}],
            "tools": [WRITE]}
    whole = await api.chat.completions.create(**body)
    entries = 0
    async with api.chat.completions.stream(**body) as stream:
        async for event in stream:
            if event.type == "tool_calls.function.arguments.delta":
                entries += 1
        final = await stream.get_final_completion()
    (want,), (got,) = whole.choices[0].message.tool_calls, final.choices[0].message.tool_calls
    assert entries > 100  # (the fake backend's tokens are bytes)
    assert (got.function.name, got.function.arguments) == (want.function.name,
                                                           want.function.arguments)
    assert want.function.arguments == json.dumps({"path": "src/hello.py", "content": PY_CODE * 6})
    # (no content: None whole; the SDK's accumulated message starts from "")
    assert not final.choices[0].message.content and whole.choices[0].message.content is None
    assert final.choices[0].finish_reason == whole.choices[0].finish_reason == "tool_calls"


async def test_anthropic_sdk_gets_pythonic_input_json_delta_pieces_that_add_up(
        long_pythonic_client):
    api = anthropic.AsyncAnthropic(base_url=str(long_pythonic_client.make_url("")), api_key="k",
                                   max_retries=0)
    tool = {"name": "write_file", "input_schema": WRITE["function"]["parameters"]}
    body = {"model": "tiny", "max_tokens": 1500, "tools": [tool],
            "messages": [{"role": "user", "content": "write hello.py"}]}
    whole = await api.messages.create(**body)
    pieces = []
    async with api.messages.stream(**body) as stream:
        async for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                pieces.append(event.delta.partial_json)
        final = await stream.get_final_message()
    assert len(pieces) > 100
    assert [b.input for b in final.content] == [b.input for b in whole.content] == [
        {"path": "src/hello.py", "content": PY_CODE * 6}]
    assert "".join(pieces) == json.dumps({"path": "src/hello.py", "content": PY_CODE * 6})
    assert final.stop_reason == whole.stop_reason == "tool_use"


def test_pythonic_a_value_the_writer_refuses_comes_whole_at_the_end(caplog):
    # (no such text is known: simulated) the whole reading decides; the stream's call gets the
    # rest of its arguments in one piece at the end, and the pieces still add up
    from gateway import tool_args_python

    def refuse(text):
        raise tool_args_python._Invalid
    text = "[write_file(path='a.py', content='x = 1\\n', mode=[1, 2]), get_time()]"
    want = _whole(cfg("pythonic"), text)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(tool_args_python.PythonArgsWriter, "_evaluate", staticmethod(refuse))
        got = _check_same(cfg("pythonic"), text, range(len(text)))
    assert [c["arguments"] for c in got["calls"]] == [c["arguments"] for c in want["calls"]] == [
        '{"path": "a.py", "content": "x = 1\\n", "mode": [1, 2]}', "{}"]
    assert got["calls"][0]["entries"] > 5
    assert not caplog.records  # (the pieces add up: nothing to warn of)
