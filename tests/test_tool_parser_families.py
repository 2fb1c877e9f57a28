"""Tool-call parsers per model family (issue 29): `deepseek_v3`, `qwen3_coder`, `glm45`, `kimi_k2`,
`openai` (gpt-oss harmony), `granite`, `internlm`. Each is fed replies written the way the family's
chat template writes an assistant's calls (the model writes its own calls the same way): whole,
split in two at every position, one character at a time and in random chunks, the streamed items
(content and calls, in order) must equal the whole reply's. What is no call (an unknown tool, JSON
cut by max_tokens, a marker in prose, random marker soup) stays content as written and never
raises. `--tool-call-parser auto` picks each from an excerpt of the family's template; through the
gateway with the openai and anthropic SDKs."""
from __future__ import annotations

import json
import random

import anthropic
import pytest
from test_gateway_fakes import FakeBackend
from test_gateway_http import ipc_address, make_config
from test_structured_gateway import Recorder, sdk

from gateway.app import create_app
from gateway.tool_call_parsers import ToolCall, whole_items
from gateway.tool_parser import PARSERS, make_parser, parse_all, sampling_for_parser
from gateway.tools import parse_tools, parser_for_template, with_parser


def _tool(name, required=(), **props):
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": props, "required": list(required)}}}


TOOLS = [
    _tool("get_weather", ["city"], city={"type": "string"},
          unit={"type": "string", "enum": ["celsius", "fahrenheit"]}, days={"type": "integer"}),
    _tool("read_file", ["path"], path={"type": "string"}),
    _tool("write_file", ["path", "content"], path={"type": "string"},
          content={"type": "string"}),
    _tool("search", ["query"], query={"type": "string"}, max_results={"type": "integer"},
          regex={"type": "boolean"}, paths={"type": "array", "items": {"type": "string"}},
          options={"type": "object"}, threshold={"type": ["number", "null"]}),
    _tool("get_time"),
]


def cfg(parser):
    return with_parser(parse_tools({"tools": TOOLS}), parser)


# --- the families' formats ----------------------------------------------------------------------
DS_B, DS_E = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CB, DS_CE, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


def ds_v3(name, args):  # DeepSeek-V3 / R1's template
    return f"{DS_CB}function{DS_SEP}{name}\n```json\n{json.dumps(args)}\n```{DS_CE}"


def ds_v31(name, args):  # DeepSeek-V3.1's
    return f"{DS_CB}{name}{DS_SEP}{json.dumps(args)}{DS_CE}"


KS_B, KS_E = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
K_CB, K_CE, K_ARG = "<|tool_call_begin|>", "<|tool_call_end|>", "<|tool_call_argument_begin|>"


def kimi(call_id, args, space=""):
    return f"{K_CB}{call_id}{space}{K_ARG}{json.dumps(args)}{K_CE}"


def qwen(name, *params):  # Qwen3-Coder's template: '<parameter=' + k + '>\n' + v + '\n</parameter>\n'
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def glm(name, *pairs, nl="\n"):  # GLM-4.5 / 4.6 (nl="\n") and GLM-4.7 (nl="")
    body = "".join(f"<arg_key>{k}</arg_key>{nl}<arg_value>{v}</arg_value>{nl}" for k, v in pairs)
    return f"<tool_call>{name}{nl}{body}</tool_call>"


DSML_B, DSML_E = "<｜DSML｜function_calls>", "</｜DSML｜function_calls>"


def dsml(name, *params):  # DeepSeek-V3.2's DSML: (key, value, string attribute or None)
    body = "".join(
        f'<｜DSML｜parameter name="{k}"' + ("" if t is None else f' string="{t}"')
        + f">{v}</｜DSML｜parameter>\n" for k, v, t in params)
    return f'<｜DSML｜invoke name="{name}">\n{body}</｜DSML｜invoke>\n'


HARMONY_CALL = ("<|channel|>analysis<|message|>User asks for the weather in Tokyo. Use get_weather."
                "<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
                '<|constrain|>json<|message|>{"city": "Tokyo"}')
CODE = 'def hello():\n    print("<b>hi</b> {x}")\n    return [1, 2]\n'
W = "get_weather"

# (parser, reply, content or None, [(name, arguments, id or None)])
CASES = [
    # DeepSeek-V3 / R1: text before, two calls separated by a newline, as the template writes them
    ("deepseek_v3", "Let me check both." + DS_B + ds_v3(W, {"city": "Paris"}) + "\n"
     + ds_v3(W, {"city": "Tokyo", "unit": "celsius"}) + DS_E, "Let me check both.",
     [(W, {"city": "Paris"}, None), (W, {"city": "Tokyo", "unit": "celsius"}, None)]),
    # R1 thinks first (no reasoning parser here: the thinking is content)
    ("deepseek_v3", "<think>\nThe user wants a file.\n</think>\n\n" + DS_B
     + ds_v3("read_file", {"path": "src/main.py"}) + DS_E,
     "<think>\nThe user wants a file.\n</think>\n\n", [("read_file", {"path": "src/main.py"}, None)]),
    # V3.1's form, and a reply that stops at the end of its last call (an EOS in place of the end)
    ("deepseek_v3", DS_B + ds_v31("read_file", {"path": "a.py"}) + ds_v31("get_time", {}) + DS_E,
     None, [("read_file", {"path": "a.py"}, None), ("get_time", {}, None)]),
    ("deepseek_v3", DS_B + ds_v3(W, {"city": "Oslo", "days": 3}), None,
     [(W, {"city": "Oslo", "days": 3}, None)]),
    ("deepseek_v3", "No tools needed: 2 + 2 = 4.", "No tools needed: 2 + 2 = 4.", []),
    # DeepSeek-V3.2's DSML: string="true" keeps the text, "false" is JSON, none: by the schema
    ("deepseek_v32", "I'll write it.\n\n" + DSML_B + "\n"
     + dsml("write_file", ("path", "src/a.py", "true"), ("content", CODE, "true"))
     + dsml("search", ("query", "42", "true"), ("max_results", "5", "false"),
            ("paths", '["src"]', "false"), ("regex", "true", None)) + DSML_E,
     "I'll write it.\n\n", [("write_file", {"path": "src/a.py", "content": CODE}, None),
                              ("search", {"query": "42", "max_results": 5, "paths": ["src"],
                                          "regex": True}, None)]),
    ("deepseek_v32", "<｜DSML｜tool_calls>" + dsml("get_time") + "</｜DSML｜tool_calls>", None,
     [("get_time", {}, None)]),
    # Kimi K2: the model's own ids, text before, a space after the id (seen in the wild)
    ("kimi_k2", "I'll look that up." + KS_B + kimi("functions.get_weather:0", {"city": "Beijing"})
     + kimi("functions.read_file:1", {"path": "README.md"}, space=" ") + KS_E,
     "I'll look that up.", [(W, {"city": "Beijing"}, "functions.get_weather:0"),
                            ("read_file", {"path": "README.md"}, "functions.read_file:1")]),
    ("kimi_k2", KS_B + kimi("get_time", {}) + KS_E, None, [("get_time", {}, "functions.get_time:0")]),
    # Qwen3-Coder: string parameters keep code exactly; others are read by the schema's type
    ("qwen3_coder", "I'll create the file.\n" + qwen("write_file", ("path", "src/hello.py"),
                                                    ("content", CODE)),
     "I'll create the file.\n", [("write_file", {"path": "src/hello.py", "content": CODE}, None)]),
    ("qwen3_coder", qwen("search", ("query", "TODO: fix {this}"), ("max_results", "20"),
                         ("regex", "False"), ("paths", '["src", "tests"]'),
                         ("options", '{"case": true}'), ("threshold", "0.5")) + "\n"
     + qwen("read_file", ("path", "123")), None,
     [("search", {"query": "TODO: fix {this}", "max_results": 20, "regex": False,
                  "paths": ["src", "tests"], "options": {"case": True}, "threshold": 0.5}, None),
      ("read_file", {"path": "123"}, None)]),
    ("qwen3_coder", "<function=get_time>\n</function>", None, [("get_time", {}, None)]),
    ("qwen3_coder", qwen(W, ("city", "Paris"), ("days", "three")), None,  # not an integer: text
     [(W, {"city": "Paris", "days": "three"}, None)]),
    # GLM-4.5 / 4.6 and 4.7's form
    ("glm45", "Checking.\n" + glm(W, ("city", "Beijing"), ("days", "3")), "Checking.\n",
     [(W, {"city": "Beijing", "days": 3}, None)]),
    ("glm45", glm("search", ("query", "a </b> b"), ("options", '{"case": true}'), nl="")
     + glm("get_time", nl=""), None,
     [("search", {"query": "a </b> b", "options": {"case": True}}, None), ("get_time", {}, None)]),
    # gpt-oss: the analysis channel is left out; a call's header names its recipient
    ("openai", HARMONY_CALL + "<|call|>", None, [(W, {"city": "Tokyo"}, None)]),
    ("openai", HARMONY_CALL, None, [(W, {"city": "Tokyo"}, None)]),  # <|call|> is a stop token
    ("openai", ("<|channel|>analysis<|message|>Simple arithmetic.<|end|><|start|>assistant"
     "<|channel|>final<|message|>2 + 2 = 4.<|return|>"), "2 + 2 = 4.", []),
    ("openai", ("<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.read_file"
     '<|channel|>commentary json<|message|>{"path": "a.py"}<|call|>'), None,
     [("read_file", {"path": "a.py"}, None)]),
    ("openai", ("<|channel|>commentary<|message|>Checking the weather now.<|end|><|start|>assistant"
     '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Rome"}'),
     "Checking the weather now.", [(W, {"city": "Rome"}, None)]),
    ("openai", "Plain text from a model that skipped the format.",
     "Plain text from a model that skipped the format.", []),
    # Granite 3.0 and 3.1+
    ("granite", '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Boston"}}]', None,
     [(W, {"city": "Boston"}, None)]),
    ("granite", ('Sure.<tool_call>[{"name": "read_file", "arguments": {"path": "x"}}, '
     '{"name": "get_time", "arguments": {}}]'), "Sure.",
     [("read_file", {"path": "x"}, None), ("get_time", {}, None)]),
    # InternLM 2.5 (its docs' example)
    ("internlm", ("Sure, I will search for the weather of Shanghai.<|action_start|><|plugin|>\n"
     '{"name": "get_weather", "parameters": {"city": "Shanghai"}}<|action_end|>'),
     "Sure, I will search for the weather of Shanghai.", [(W, {"city": "Shanghai"}, None)]),
]


def _norm(items) -> list:
    """Items with adjacent text merged, calls as (name, arguments, id)."""
    out: list = []
    for item in items:
        if isinstance(item, ToolCall):
            out.append((item.name, item.arguments, item.id))
        elif item:
            if out and isinstance(out[-1], str):
                out[-1] += item
            else:
                out.append(item)
    return out


def _stream(parser, chunks) -> list:
    p = make_parser(cfg(parser))
    items = []
    for chunk in chunks:
        items += p.feed_items(chunk)
    items += p.finish_items()
    assert p.calls == [i for i in items if isinstance(i, ToolCall)]
    return _norm(whole_items(items))


def _without_fresh_ids(norm, given_ids) -> list:
    return [x if isinstance(x, str) or x[2] in given_ids else x[:2] for x in norm]


def _check_every_split(parser, text):
    whole = _stream(parser, [text])
    given = {x[2] for x in whole if not isinstance(x, str) and x[2].startswith("functions.")}
    want = _without_fresh_ids(whole, given)
    chunkings = [[text[:i], text[i:]] for i in range(len(text) + 1)] + [list(text)]
    rng = random.Random(len(text))
    for _ in range(30):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
        chunkings.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])])
    for chunks in chunkings:
        assert _without_fresh_ids(_stream(parser, chunks), given) == want, chunks
    return whole


@pytest.mark.parametrize("parser,text,content,want", CASES)
def test_family_formats_whole_and_at_every_chunk_boundary(parser, text, content, want):
    got_content, calls = parse_all(text, cfg(parser))
    assert got_content == content
    assert [(c.name, c.arguments) for c in calls] == [(n, a) for n, a, _ in want]
    for c, (_, _, call_id) in zip(calls, want):
        assert c.id == call_id if call_id else c.id.startswith("call_")
    assert len({c.id for c in calls}) == len(calls)
    whole = _check_every_split(parser, text)
    assert [x[:2] for x in whole if not isinstance(x, str)] == [(n, a) for n, a, _ in want]
    # OpenAI's shape: arguments as JSON text that parses back to the same object
    for i, c in enumerate(calls):
        assert json.loads(c.openai(i)["function"]["arguments"]) == c.arguments


# what is no call stays content, exactly as the model wrote it
NOT_CALLS = [
    ("deepseek_v3", DS_B + ds_v3("rm_rf", {"path": "/"}) + DS_E),  # not a listed tool
    ("deepseek_v3", DS_B + DS_CB + f'function{DS_SEP}get_weather\n```json\n{{"city": "Pa'),  # cut
    ("deepseek_v3", "Hmm." + DS_B + "On second thought, no tools."),
    ("deepseek_v3", "Trailing marker" + DS_B),
    ("deepseek_v3", DS_B + DS_CB + "get_weather" + DS_SEP + '["not", "an object"]' + DS_CE + DS_E),
    ("deepseek_v32", DSML_B + dsml("rm_rf", ("path", "/", "true")) + DSML_E),
    ("deepseek_v32", (DSML_B + '<｜DSML｜invoke name="write_file">\n<｜DSML｜parameter name="path" '
                      'string="true">a.py</｜DSML｜parameter>\n<｜DSML｜parameter name="content" '
                      'string="true">print(')),  # cut by max_tokens
    ("deepseek_v32", DSML_B + '<｜DSML｜invoke name="get_time">junk</｜DSML｜invoke>' + DSML_E),
    ("kimi_k2", KS_B + kimi("functions.delete_all:0", {}) + KS_E),
    ("kimi_k2", KS_B + K_CB + "functions.get_weather:0" + K_ARG + '{"city": '),
    ("qwen3_coder", qwen("rm_rf", ("path", "/"))),
    ("qwen3_coder", ("<tool_call>\n<function=write_file>\n<parameter=path>\na.py\n</parameter>\n"
                    "<parameter=content>\nprint(")),  # cut by max_tokens
    ("qwen3_coder", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"),
    ("qwen3_coder", "In HTML, write <b>bold</b> and a < b; see <function> docs."),
    ("glm45", glm("rm_rf", ("path", "/"))),
    ("glm45", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par"),
    ("glm45", "<tool_call>get_weather\n<arg_value>Paris</arg_value>\n</tool_call>"),
    ("openai", "<|channel|>commentary to=functions.rm_rf <|constrain|>json<|message|>{}<|call|>"),
    ("openai", "<|channel|>commentary to=functions.get_weather<|message|>{not json<|call|>"),
    ("openai", '<|channel|>commentary to=browser.search<|message|>{"query": "x"}<|call|>'),
    ("granite", '<|tool_call|>[{"name": "rm_rf", "arguments": {}}]'),
    ("granite", "<|tool_call|>not json at all"),
    ("granite", '<tool_call>[{"name": "get_weather", "arguments": {"city": "Bo'),
    ("internlm", '<|action_start|><|plugin|>\n{"name": "rm_rf", "parameters": {}}<|action_end|>'),
    ("internlm", '<|action_start|><|plugin|>\n{"name": "get_weather", "param'),
]


@pytest.mark.parametrize("parser,text", NOT_CALLS)
def test_what_is_no_call_stays_content(parser, text):
    content, calls = parse_all(text, cfg(parser))
    assert calls == []
    if parser == "openai":  # the message's text, its header not shown (it is structure)
        assert content == text.split("<|message|>")[1].removesuffix("<|call|>")
    else:
        assert content == text
    _check_every_split(parser, text)


def test_a_known_call_after_an_unknown_one_is_still_a_call():
    text = DS_B + ds_v3("rm_rf", {}) + "\n" + ds_v3(W, {"city": "Paris"}) + DS_E
    content, calls = parse_all(text, cfg("deepseek_v3"))
    assert [c.name for c in calls] == [W] and content == DS_B + ds_v3("rm_rf", {})


@pytest.mark.parametrize("parser", sorted(set(PARSERS) - {"json", "pythonic"}))
def test_prose_streams_at_once_and_a_call_comes_out_when_its_block_closes(parser):
    p = make_parser(cfg(parser))
    assert p.feed("Hello, world") == ("Hello, world", [])


def test_calls_come_out_before_the_reply_ends():
    p = make_parser(cfg("deepseek_v3"))
    assert p.feed("Sure." + DS_B[:3]) == ("Sure.", [])  # a marker's start is held back
    assert p.feed(DS_B[3:] + ds_v3(W, {"city": "Paris"})[:-4]) == ("", [])
    content, calls = p.feed(DS_CE[-4:] + "\n" + DS_CB)  # the first call is out now
    assert content == "" and [c.arguments for c in calls] == [{"city": "Paris"}]
    p = make_parser(cfg("qwen3_coder"))
    content, calls = p.feed(qwen("read_file", ("path", "a.py")) + "\n<tool_")
    assert [c.name for c in calls] == ["read_file"]
    p = make_parser(cfg("openai"))  # the final channel streams as it is written
    assert p.feed("<|channel|>final<|message|>It is sun") == ("It is sun", [])
    assert p.feed("ny.<|ret") == ("ny.", []) and p.feed("urn|>") == ("", [])
    assert p.finish() == ("", [])
    p = make_parser(cfg("openai"))  # the analysis channel is never shown
    assert p.feed("<|channel|>analysis<|message|>thinking " * 50) == ("", [])


# random marker soup: whatever the model writes, no parser raises, and streaming == whole
SOUP = [DS_B, DS_E, DS_CB, DS_CE, DS_SEP, KS_B, KS_E, K_CB, K_CE, K_ARG, "<tool_call>",
        "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>", "<arg_key>",
        "</arg_key>", "<arg_value>", "</arg_value>", "<|channel|>", "<|message|>", "<|start|>",
        "<|end|>", "<|call|>", "<|return|>", " to=functions.", "<|constrain|>", "<|tool_call|>",
        "<|action_start|><|plugin|>", "<|action_end|>", "function", "get_weather", "read_file",
        "city", "path", ">", "\n", " ", "```json", "```", "{", "}", "[", "]", '"', ":", ",",
        '{"city": "Paris"}', '"name": "get_weather"', '"arguments": ', "3", "text", "<", "|",
        # whole calls of every family, so that the soup holds real calls among the junk
        DS_B + ds_v3(W, {"city": "Paris"}), ds_v31("get_time", {}) + DS_E, KS_B
        + kimi("functions.get_time:0", {}), kimi("functions.get_weather:1", {"city": "x"}) + KS_E,
        qwen(W, ("city", "Paris")), "<function=get_time>\n</function>", glm(W, ("city", "Oslo")),
        HARMONY_CALL, "<|channel|>final<|message|>Done.", DSML_B, DSML_E,
        DSML_B + dsml(W, ("city", "Paris", "true")), dsml("get_time"), '<｜DSML｜parameter name="x">',
        "</｜DSML｜parameter>", '<｜DSML｜invoke name="',
        '<|tool_call|>[{"name": "get_time", "arguments": {}}]',
        '<|action_start|><|plugin|>{"name": "get_time", "parameters": {}}<|action_end|>',
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>']


@pytest.mark.parametrize("parser", sorted(set(PARSERS) - {"json", "pythonic", "mistral"}))
def test_random_marker_soup_never_raises_and_streams_as_whole(parser):
    rng = random.Random(parser)
    calls = 0
    for _ in range(150):
        text = "".join(rng.choice(SOUP) for _ in range(rng.randint(1, 25)))
        if parser == "openai" and rng.random() < 0.3:  # (harmony reads calls from the start)
            text = HARMONY_CALL + rng.choice(("<|call|>", "<|end|>", "")) + text
        whole = _stream(parser, [text])
        calls += sum(not isinstance(x, str) for x in whole)
        given = {x[2] for x in whole if not isinstance(x, str) and x[2].startswith("functions.")}
        want = _without_fresh_ids(whole, given)
        cut = rng.randint(0, len(text))
        for chunks in ([text[:cut], text[cut:]], list(text)):
            assert _without_fresh_ids(_stream(parser, chunks), given) == want, text
        if parser != "openai":  # (harmony hides headers and the analysis channel)
            shown = "".join(x for x in whole if isinstance(x, str))
            assert len(shown) <= len(text)
    assert calls > 0  # (the soup reaches the call paths too)


# --- --tool-call-parser auto -------------------------------------------------------------------
@pytest.mark.parametrize("template,parser", [
    # excerpts of what each family's chat template writes for an assistant's calls
    (("{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + "
     "'<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json' }}"), "deepseek_v3"),
    (("{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'+ tool['function']['name'] + "
     "'<｜tool▁sep｜>' + tool['function']['arguments'] + '<｜tool▁call▁end｜>'}}"), "deepseek_v3"),
    ('<｜DSML｜function_calls>\\n<｜DSML｜invoke name="{{ name }}">', "deepseek_v32"),
    (("{{- '\\n<tool_call>\\n<function=' + tool_call.name + '>\\n' }}{{- '<parameter=' + "
     "args_name + '>\\n' }}"), "qwen3_coder"),
    (("For each function call, output the function name and arguments within the following XML "
     "format:\\n<tool_call>{function-name}\\n<arg_key>{arg-key-1}</arg_key>"), "glm45"),
    (("<|tool_calls_section_begin|>{%- for tool_call in message['tool_calls'] -%}"
     "<|tool_call_begin|>{{ tool_call['id'] }}<|tool_call_argument_begin|>"), "kimi_k2"),
    ("{{- '<|start|>assistant to=' + tool_call.name + '<|channel|>commentary' }}", "openai"),
    ("{{- '<|start_of_role|>available_tools<|end_of_role|>\\n' }}", "granite"),
    ("{{ message['content'] }}<|action_start|><|plugin|>\\n{{ tool_call | tojson }}", "internlm"),
    (("For each function call, return a json object with function name and arguments within "
     "<tool_call></tool_call> XML tags"), "hermes"),
])
def test_auto_picks_the_family_from_its_template(template, parser):
    assert parser_for_template(template) == parser
    native = "{% if tools %}{{ tools|tojson }}{% endif %}" + template  # it renders the tools
    assert with_parser(parse_tools({"tools": TOOLS}), "auto", native).parser == parser
    # a template that renders no tools (DeepSeek-V3's / R1's own): the gateway shows them in the
    # generic format, so that is the format the model is told to write
    assert with_parser(parse_tools({"tools": TOOLS}), "auto", template).parser == "hermes"


async def test_two_turn_loop_through_a_template_that_writes_arguments_as_text():
    """DeepSeek's templates concatenate a call's arguments into the text ('```json' + '\\n' +
    arguments); Qwen3-Coder's iterate them (`arguments|items`): both render the earlier call."""
    from test_gateway_fakes import tokenizer_json

    from gateway.chat_render import chat_prompt_ids
    from gateway.openai_schema import ChatMessage
    from tokenizer.bundle import TokenizerBundle

    deepseek = ("{% for m in messages %}{% if m.tool_calls %}{% for tool in m.tool_calls %}"
                "{{ '<|tc|>' + tool['type'] + '<|sep|>' + tool['function']['name'] + '\\n' + "
                "'```json' + '\\n' + tool['function']['arguments'] + '\\n' + '```' }}"
                "{% endfor %}{% else %}<{{ m.role }}>{{ m.content }}{% endif %}{% endfor %}"
                "{# tools are described by the caller #}{{ tools|length }}")
    qwen = ("{% for m in messages %}{% for c in m.tool_calls or [] %}<function="
            "{{ c.function.name }}>{% for k, v in c.function.arguments|items %}<parameter={{ k }}>"
            "{{ v }}</parameter>{% endfor %}{% endfor %}{% endfor %}{{ tools|length }}")
    msgs = [ChatMessage("user", "hi"),
            ChatMessage("assistant", "", ({"id": "c1", "name": "get_weather",
                                           "arguments": '{"city": "Oslo", "days": 2}'},)),
            ChatMessage("tool", "cold", (), "c1")]
    for template, want in (
            (deepseek, ('<user>hi<|tc|>function<|sep|>get_weather\n```json\n{"city": "Oslo", '
                       '"days": 2}\n```<tool>cold5')),
            (qwen, ("<function=get_weather><parameter=city>Oslo</parameter><parameter=days>2"
                   "</parameter>5"))):
        class Gw:
            passes_text = False
            bundle = TokenizerBundle.from_parts(tokenizer_json(), template, 256, (257,), "t")

        ids = await chat_prompt_ids(Gw(), msgs, cfg("hermes"), True, False)
        assert Gw.bundle.decode(ids) == want


def test_special_tokens_are_kept_for_the_formats_whose_markers_are_special():
    from gateway.openai_schema import SamplingParams

    s = SamplingParams()
    for name in ("deepseek_v3", "deepseek_v32", "kimi_k2", "openai", "glm45", "granite",
                 "internlm"):
        assert sampling_for_parser(cfg(name), s).skip_special_tokens is False, name
    assert sampling_for_parser(cfg("qwen3_coder"), s) is s  # <tool_call> is plain text in Qwen's


def test_serve_offers_every_parser():
    from gateway.serve import build_parser

    action = next(a for a in build_parser()._actions if a.dest == "tool_call_parser")
    assert set(action.choices) == {"auto", *PARSERS}


# --- through the gateway -----------------------------------------------------------------------
QWEN_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                 "{% endfor %}{% if tools %}{{ tools | tojson }}If you choose to call a function "
                 "ONLY reply in the following format:\n<tool_call>\n<function=example_function_name>"
                 "\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n</function>\n"
                 "</tool_call>{% endif %}<|im_start|>assistant\n")


class QwenTemplated(FakeBackend):
    def info(self):
        info = super().info()
        info.chat_template = QWEN_TEMPLATE
        return info


async def test_qwen3_coder_through_the_gateway_with_auto_and_the_openai_sdk(aiohttp_client):
    reply = "Writing it.\n" + qwen("write_file", ("path", "src/hello.py"), ("content", CODE))
    rec = Recorder(reply)
    b = await QwenTemplated(ipc_address(), script=rec).start()
    try:
        client = await aiohttp_client(create_app(make_config(b.address, tool_call_parser="auto"),
                                                 startup_wait_s=5.0))
        oa = sdk(client)
        msgs = [{"role": "user", "content": "Write hello.py"}]
        resp = await oa.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS)
        (call,) = resp.choices[0].message.tool_calls
        assert call.function.name == "write_file" and resp.choices[0].finish_reason == "tool_calls"
        assert json.loads(call.function.arguments) == {"path": "src/hello.py", "content": CODE}
        assert resp.choices[0].message.content == "Writing it.\n"
        stream = await oa.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS,
                                                  stream=True)
        chunks = [c.choices[0] async for c in stream if c.choices]
        calls = [tc for c in chunks for tc in (c.delta.tool_calls or [])]
        # the call's first entry names it; then its arguments come in pieces (by index)
        assert (calls[0].index, calls[0].function.name) == (0, "write_file")
        assert {tc.index for tc in calls} == {0} and len(calls) > 10
        assert "".join(tc.function.arguments for tc in calls) == call.function.arguments
        assert "".join(c.delta.content or "" for c in chunks) == "Writing it.\n"
        assert chunks[-1].finish_reason == "tool_calls"
    finally:
        await b.stop()


async def test_deepseek_through_the_gateway_streamed_byte_by_byte(aiohttp_client):
    # the fake backend's tokens are bytes: the markers' multi-byte characters arrive split
    reply = "Checking." + DS_B + ds_v3(W, {"city": "Paris"}) + "\n" + ds_v3(W, {"city": "Oslo"}) \
        + DS_E
    rec = Recorder(reply)
    b = await FakeBackend(ipc_address(), script=rec).start()
    try:
        client = await aiohttp_client(create_app(make_config(b.address,
                                                             tool_call_parser="deepseek_v3"),
                                                 startup_wait_s=5.0))
        stream = await sdk(client).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], tools=TOOLS, stream=True)
        chunks = [c.choices[0] async for c in stream if c.choices]
        calls: dict[int, dict] = {}  # (the arguments come in pieces: accumulated by index)
        for tc in (tc for c in chunks for tc in (c.delta.tool_calls or [])):
            entry = calls.setdefault(tc.index, {"id": tc.id, "arguments": ""})
            entry["arguments"] += tc.function.arguments or ""
        assert [(i, json.loads(c["arguments"])["city"]) for i, c in sorted(calls.items())] == \
            [(0, "Paris"), (1, "Oslo")]
        assert len({c["id"] for c in calls.values()}) == 2
        assert "".join(c.delta.content or "" for c in chunks) == "Checking."
        assert rec.samplings[-1].skip_special_tokens is False
    finally:
        await b.stop()


async def test_anthropic_blocks_keep_the_output_order(aiohttp_client):
    # text, a call, text again: three blocks in that order, whole and streamed
    reply = "Let me look." + KS_B + kimi("functions.read_file:0", {"path": "a.py"}) + KS_E \
        + "Done."
    rec = Recorder(reply)
    b = await FakeBackend(ipc_address(), script=rec).start()
    try:
        client = await aiohttp_client(create_app(make_config(b.address,
                                                             tool_call_parser="kimi_k2"),
                                                 startup_wait_s=5.0))
        api = anthropic.AsyncAnthropic(base_url=str(client.make_url("")), api_key="k",
                                       max_retries=0)
        tools = [{"name": "read_file", "input_schema": {"type": "object", "properties": {
            "path": {"type": "string"}}}}]
        msgs = [{"role": "user", "content": "Read a.py"}]
        msg = await api.messages.create(model="tiny", max_tokens=400, messages=msgs, tools=tools)
        assert [(b.type, getattr(b, "text", None) or getattr(b, "input", None))
                for b in msg.content] == [("text", "Let me look."),
                                          ("tool_use", {"path": "a.py"}), ("text", "Done.")]
        assert msg.content[1].id == "functions.read_file:0" and msg.stop_reason == "tool_use"
        async with api.messages.stream(model="tiny", max_tokens=400, messages=msgs,
                                       tools=tools) as s:
            final = await s.get_final_message()
        assert [b.type for b in final.content] == ["text", "tool_use", "text"]
        assert final.content[2].text == "Done."
    finally:
        await b.stop()


# --- streaming cost: a long call is decoded once, not once per piece ---------------------------
@pytest.mark.parametrize("parser,text", [
    ("granite", '<|tool_call|>[{"name": "write_file", "arguments": {"path": "a", "content": '
     + json.dumps("x = {'a': [1]}\n" * 400) + "}}]"),
    ("mistral", "[TOOL_CALLS]write_file[ARGS]" + json.dumps({"path": "a", "content": "}]\\\"{" * 800})),
    ("mistral", '[TOOL_CALLS] [{"name": "write_file", "arguments": '
     + json.dumps({"path": "a", "content": "[[" * 800}) + "}]"),
])
def test_a_long_call_is_decoded_once_however_many_pieces(parser, text, monkeypatch):
    decodes = []
    raw_decode = json.JSONDecoder.raw_decode

    def counted(self, s, idx=0):
        decodes.append(idx)
        return raw_decode(self, s, idx)

    monkeypatch.setattr(json.JSONDecoder, "raw_decode", counted)
    p = make_parser(cfg(parser) if parser != "mistral" else with_parser(
        parse_tools({"tools": TOOLS}), "mistral"))
    calls = []
    for i in range(0, len(text), 4):
        calls += p.feed(text[i:i + 4])[1]
    calls += p.finish()[1]
    # (a v11 Mistral call streams its arguments: their rewrite is read once more, at the end)
    assert [c.name for c in calls] == ["write_file"] and len(decodes) <= 3, len(decodes)


def test_json_end_finds_where_a_value_ends_across_pieces():
    from gateway.tool_call_parsers import JsonEnd

    rng = random.Random(7)
    for value in ({"a": [1, {"b": "x]}\"\\"}], "c": "{[\\\"", "d": None}, [1, "]", {"}": "\\"}],
                  {}, [[[]]], {"s": "\u00e9\ud7ff"}):
        text = json.dumps(value, ensure_ascii=False) + ' tail {"x": 1}'
        want = 2 + len(json.dumps(value, ensure_ascii=False))
        for _ in range(100):
            scan, buf, got = JsonEnd(), "  ", -1
            for i in range(0, len(text), rng.randint(1, 6)):
                buf = "  " + text[:i + 6]
                if (got := scan.find(buf, 2)) >= 0:
                    break
            assert got == want


async def test_gpt_oss_harmony_through_the_anthropic_sdk_streamed(aiohttp_client):
    # the analysis channel is not shown, the preamble is a text block, the call a tool_use block
    reply = ("<|channel|>analysis<|message|>Need the file first.<|end|><|start|>assistant"
             "<|channel|>commentary<|message|>Reading it.<|end|><|start|>assistant<|channel|>"
             'commentary to=functions.read_file <|constrain|>json<|message|>{"path": "a.py"}'
             "<|call|>")
    rec = Recorder(reply)
    b = await FakeBackend(ipc_address(), script=rec).start()
    try:
        client = await aiohttp_client(create_app(make_config(b.address, tool_call_parser="openai"),
                                                 startup_wait_s=5.0))
        api = anthropic.AsyncAnthropic(base_url=str(client.make_url("")), api_key="k",
                                       max_retries=0)
        tools = [{"name": "read_file", "input_schema": {"type": "object", "properties": {
            "path": {"type": "string"}}}}]
        async with api.messages.stream(model="tiny", max_tokens=400, tools=tools, messages=[
                {"role": "user", "content": "Read a.py"}]) as s:
            kinds = [e.type async for e in s]
            final = await s.get_final_message()
        assert [(b.type, getattr(b, "text", None) or getattr(b, "input", None))
                for b in final.content] == [("text", "Reading it."),
                                            ("tool_use", {"path": "a.py"})]
        assert final.stop_reason == "tool_use" and "content_block_delta" in kinds
        assert rec.samplings[-1].skip_special_tokens is False
    finally:
        await b.stop()
