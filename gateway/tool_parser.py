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
"""
from __future__ import annotations

from dataclasses import replace

from gateway.tool_call_parsers import (  # noqa: F401 -- the names callers read here
    CLOSE_TAG,
    OPEN_TAG,
    HermesToolCallParser,
    JsonToolCallParser,
    MistralToolCallParser,
    ToolCall,
    ToolCallParser,
    new_call_id,
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


def finish_reason(reason: str | None, calls: list, cfg: ToolConfig) -> str | None:
    """OpenAI's: `tool_calls` when the model called tools on its own or had to call one of a
    list; `stop` for a named function (as OpenAI answers it)."""
    if calls and reason == "stop" and cfg.choice != "function":
        return "tool_calls"
    return reason


def shape_choice(choice: dict, cfg: ToolConfig) -> dict:
    """A chat completion choice (non-streaming) with its calls moved into `tool_calls`."""
    msg = choice["message"]
    content, calls = parse_all(msg.get("content") or "", cfg)
    if calls:
        msg["content"] = content
        msg["tool_calls"] = [c.openai() for c in calls]
        choice["finish_reason"] = finish_reason(choice["finish_reason"], calls, cfg)
    return choice


class StreamShaper:
    """Streaming chat deltas with tool calls: one parser per choice. `delta(i, text, finish)`
    gives the chunk's `delta` object and finish reason (OpenAI's shape: a call arrives whole,
    with its index, id, type, name and arguments)."""

    def __init__(self, cfg: ToolConfig, num_choices: int) -> None:
        self.cfg = cfg
        self.parsers = [make_parser(cfg) for _ in range(num_choices)]

    def delta(self, i: int, text: str, finish: str | None) -> tuple[dict, str | None]:
        parser = self.parsers[i]
        first = len(parser.calls)
        content, _ = parser.feed(text)
        if finish is not None:
            tail, _ = parser.finish()
            content += tail
        calls = parser.calls[first:]
        delta: dict = {}
        if content and not (parser.calls and not content.strip()):
            delta["content"] = content
        if calls:
            delta["tool_calls"] = [c.openai(first + k) for k, c in enumerate(calls)]
        return delta, finish_reason(finish, parser.calls, self.cfg) if finish else None
