"""Tool calls out of the model's text, whole or as it streams. Parsers by name
(`--tool-call-parser`): `hermes`, the generic format of `gateway.tools` (Hermes' and Qwen's:
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` blocks), the default; `json`,
a reply that is one JSON call object or an array of them (Llama 3's); `mistral`, Mistral's
`[TOOL_CALLS]` control token followed by a JSON array of calls (tokenizers up to v7) or by
`name[ARGS]{...}` per call (v11 on, `[CALL_ID]id` between them from v13); `pythonic`, a Python
list of calls with keyword arguments (Llama 3.2's and Llama 4's; gateway/tool_parser_pythonic.py);
`deepseek_v3` (DeepSeek-V3 / R1 / V3.1), `kimi_k2`, `internlm`, `granite`: their control-token
blocks (gateway/tool_parser_tagged.py); `qwen3_coder` (`<function=f><parameter=x>...`), `glm45`
(`<arg_key>` / `<arg_value>`) and `deepseek_v32` (DeepSeek-V3.2's DSML): arguments as text read by
the tool's schema (gateway/tool_parser_xml.py); `openai`, gpt-oss's harmony messages (gateway/tool_parser_harmony.py).

`ToolCallParser.feed(text)` returns what of the text is plain content and the calls completed so
far (`feed_items`: the same in the output's order); it holds back only what could still be the
start of a call's marker, so content streams as it comes, and a call comes out as soon as it is
complete. A block that is not a call of a known tool is given back as content: the client sees
what the model wrote rather than a call that does not exist.

Arguments stream in pieces (`feed_items` gives a call's start, then its arguments as they are
written; `StreamShaper` and gateway/anthropic.py send them) for the parsers whose format has the
model write the arguments as a JSON object: `hermes` (and so every forced tool_choice, whose
grammar writes the generic format), `internlm`, `deepseek_v3`, `kimi_k2`, `granite` (each call of
its array), `json` (a reply of one call object; an array comes whole), `mistral` (v11 / v13
`name[ARGS]{...}`; the v2-v7 array, whose id follows the arguments, comes whole) and `openai`
(harmony: a message whose header names a listed function); and `qwen3_coder`, `glm45` and
`deepseek_v32`, whose arguments are tagged text: a value that is a string (by the tool's schema,
or DSML's `string="true"`; a file's content) streams as it is written, any other value at its
end, once it can be read by its type (gateway/tool_args_qwen.py, gateway/tool_args_text.py). A
call streams once its head is read in the order the format writes it (the name before the
arguments); a call written otherwise comes whole. `pythonic` (a Python list of calls) streams
each call from its `(`: string literals as they are written, other values whole at their end
(gateway/tool_args_python.py).
"""
from __future__ import annotations

from dataclasses import replace

from gateway.tool_call_parsers import (  # noqa: F401 -- the names callers read here
    CLOSE_TAG,
    OPEN_TAG,
    ArgsPiece,
    BrokenCall,
    CallStart,
    HermesToolCallParser,
    JsonToolCallParser,
    MistralToolCallParser,
    ToolCall,
    ToolCallParser,
    new_call_id,
    whole_items,
)
from gateway.tool_parser_harmony import HarmonyToolCallParser
from gateway.tool_parser_pythonic import PythonicToolCallParser
from gateway.tool_parser_tagged import (
    DeepSeekV3ToolCallParser,
    GraniteToolCallParser,
    InternLMToolCallParser,
    KimiK2ToolCallParser,
)
from gateway.tool_parser_xml import (
    DeepSeekV32ToolCallParser,
    Glm45ToolCallParser,
    Qwen3CoderToolCallParser,
)
from gateway.tools import ToolConfig

PARSERS: dict[str, type[ToolCallParser]] = {
    "hermes": HermesToolCallParser, "json": JsonToolCallParser, "mistral": MistralToolCallParser,
    "pythonic": PythonicToolCallParser, "deepseek_v3": DeepSeekV3ToolCallParser,
    "deepseek_v32": DeepSeekV32ToolCallParser,
    "qwen3_coder": Qwen3CoderToolCallParser, "glm45": Glm45ToolCallParser,
    "kimi_k2": KimiK2ToolCallParser, "openai": HarmonyToolCallParser,
    "granite": GraniteToolCallParser, "internlm": InternLMToolCallParser}


def sampling_for_parser(cfg: ToolConfig | None, sampling):
    """`sampling` with special tokens kept in the text when `cfg`'s parser reads one (Mistral's
    `[TOOL_CALLS]`); unchanged otherwise."""
    if cfg is None or not cfg.active or cfg.forced \
            or not getattr(PARSERS.get(cfg.parser), "keeps_special_tokens", False):
        return sampling
    return replace(sampling, skip_special_tokens=False)


def make_parser(cfg: ToolConfig, id_prefix: str = "call_") -> ToolCallParser:
    """The parser `cfg` names (gateway.tools.ToolConfig.parser)."""
    return PARSERS[cfg.parser](cfg, id_prefix)


def parse_all(text: str, cfg: ToolConfig) -> tuple[str | None, list[ToolCall]]:
    """(content or None when only calls remain, calls) of a whole output."""
    parser = make_parser(cfg)
    content, calls = parser.feed(text)
    tail, more = parser.finish()
    content += tail
    calls += more
    if calls and not content.strip():
        return None, calls
    return content, calls


def finish_reason(reason: str | None, calls: list | int, cfg: ToolConfig) -> str | None:
    """OpenAI's: `tool_calls` when the model called tools on its own or had to call one of a
    list; `stop` for a named function (as OpenAI answers it). `calls`: the calls, or how many."""
    if calls and reason == "stop" and cfg.choice != "function":
        return "tool_calls"
    return reason


def shape_choice(choice: dict, cfg: ToolConfig) -> dict:
    """A chat completion choice (non-streaming) with its calls moved into `tool_calls`."""
    msg = choice["message"]
    text = msg.get("content") or ""
    content, calls = parse_all(text, cfg)
    if content != text:  # (harmony's reply without calls is still its final channel's text)
        msg["content"] = content
    if calls:
        msg["tool_calls"] = [c.openai() for c in calls]
        choice["finish_reason"] = finish_reason(choice["finish_reason"], calls, cfg)
    return choice


class StreamShaper:
    """Streaming chat deltas with tool calls: one parser per choice. `delta(i, text, finish)`
    gives the chunk's `delta` object and finish reason, in OpenAI's shape: a call whose
    arguments stream (the parsers with `streams_arguments`) starts with an entry holding its
    index, id, type, name and arguments "" (and the first piece, when it came with it), then
    entries of only its index and `function.arguments` pieces; the pieces add up to exactly the
    arguments string of the same reply returned whole. Other calls arrive whole, in one entry.

    A call is started once its name is complete and listed and its arguments have begun (a
    JSON object's `{`; in the tagged-text formats, the name read); a stream cannot take it back.
    When its block then turns out to be no call (the output ends inside the arguments, as with
    max_tokens, or the model breaks its format after starting the call), the call ends with the
    pieces sent: a prefix of its JSON, which does not parse unless the object was complete and
    only what followed it was wrong (as OpenAI's and vLLM's streams end such a call), and
    `finish_reason` says why (`length`). The same reply returned whole gives that block as
    content. A forced tool_choice is written under its grammar: its calls always complete unless
    cut off."""

    def __init__(self, cfg: ToolConfig, num_choices: int) -> None:
        self.cfg = cfg
        self.parsers = [make_parser(cfg) for _ in range(num_choices)]
        self.started = [0] * num_choices  # calls begun (streamed or whole), per choice

    def delta(self, i: int, text: str, finish: str | None) -> tuple[dict, str | None]:
        parser = self.parsers[i]
        items = parser.feed_items(text)
        if finish is not None:
            items += parser.finish_items()
        content: list[str] = []
        entries: list[dict] = []  # (one per call index: a call's pieces in this delta merge)
        for item in items:
            if isinstance(item, str):
                content.append(item)
            elif isinstance(item, CallStart) or isinstance(item, ToolCall) and not item.streamed:
                entry = {"index": self.started[i], "id": item.id, "type": "function",
                         "function": {"name": item.name, "arguments": ""}}
                if isinstance(item, ToolCall):
                    entry["function"]["arguments"] = item.arguments_text
                entries.append(entry)
                self.started[i] += 1
            elif isinstance(item, ArgsPiece):
                index = self.started[i] - 1
                if not entries or entries[-1]["index"] != index:
                    entries.append({"index": index, "function": {"arguments": ""}})
                entries[-1]["function"]["arguments"] += item.text
            # (a streamed ToolCall or a BrokenCall ends the call: nothing more to send)
        delta: dict = {}
        joined = "".join(content)
        if joined and not (self.started[i] and not joined.strip()):
            delta["content"] = joined
        if entries:
            delta["tool_calls"] = entries
        return delta, finish_reason(finish, self.started[i], self.cfg) if finish else None
