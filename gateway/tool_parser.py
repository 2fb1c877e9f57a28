"""Tool calls out of the model's text, whole or as it streams. Parsers by name
(`--tool-call-parser`): `hermes`, the generic format of `gateway.tools` (Hermes' and Qwen's:
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` blocks), the default; `json`,
a reply that is one JSON call object or an array of them (Llama 3's).

`ToolCallParser.feed(text)` returns what of the text is plain content and the calls completed so
far; it holds back only what could still be the start of a `<tool_call>` tag, so content streams
as it comes. A block whose JSON is not a call of a known tool is given back as content: the
client sees what the model wrote rather than a call that does not exist.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

from gateway.tools import CALL_CLOSE, CALL_OPEN, ToolConfig

OPEN_TAG, CLOSE_TAG = CALL_OPEN.rstrip("\n"), CALL_CLOSE.lstrip("\n")


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: dict

    def openai(self, index: int | None = None) -> dict:
        call = {"id": self.id, "type": "function",
                "function": {"name": self.name,
                             "arguments": json.dumps(self.arguments, ensure_ascii=False)}}
        return call if index is None else {"index": index, **call}


def new_call_id(prefix: str = "call_") -> str:
    return prefix + os.urandom(12).hex()


def _partial_tag(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ToolCallParser:
    def __init__(self, cfg: ToolConfig, id_prefix: str = "call_") -> None:
        self.names = cfg.names()
        self.id_prefix = id_prefix
        self.calls: list[ToolCall] = []
        self._pending = ""
        self._inside = False

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        """(content to show now, calls completed by this text)."""
        self._pending += text
        content, calls = [], []
        while True:
            if not self._inside:
                k = self._pending.find(OPEN_TAG)
                if k < 0:
                    keep = _partial_tag(self._pending, OPEN_TAG)
                    cut = len(self._pending) - keep
                    content.append(self._pending[:cut])
                    self._pending = self._pending[cut:]
                    break
                content.append(self._pending[:k])
                self._pending = self._pending[k + len(OPEN_TAG):]
                self._inside = True
            else:
                k = self._pending.find(CLOSE_TAG)
                if k < 0:
                    break
                body, self._pending = self._pending[:k], self._pending[k + len(CLOSE_TAG):]
                self._inside = False
                call = self._call(body)
                if call is None:
                    content.append(OPEN_TAG + body + CLOSE_TAG)
                else:
                    calls.append(call)
        return "".join(content), calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The end of the output: an unclosed block is a call if its JSON is complete."""
        rest, self._pending = self._pending, ""
        if self._inside:
            self._inside = False
            call = self._call(rest)
            if call is not None:
                return "", [call]
            return OPEN_TAG + rest, []
        return rest, []

    def _call(self, body: str) -> ToolCall | None:
        try:
            obj = json.loads(body)
        except ValueError:
            return None
        if not isinstance(obj, dict) or obj.get("name") not in self.names:
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args)
            except ValueError:
                return None
        if not isinstance(args, dict):
            return None
        call = ToolCall(new_call_id(self.id_prefix), obj["name"], args)
        self.calls.append(call)
        return call


class JsonToolCallParser(ToolCallParser):
    """`--tool-call-parser json` (Llama 3's JSON tool calls and their kin): the whole reply is
    one call object {"name", "arguments" | "parameters"} or an array of them, else it is
    content. While the reply could still be such JSON (its first non-blank character is `{` or
    `[`) it is held back; as soon as it cannot, it streams as content."""

    def __init__(self, cfg: ToolConfig, id_prefix: str = "call_") -> None:
        super().__init__(cfg, id_prefix)
        self._mode: str | None = None  # None: undecided, "json": held, "text": streamed

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self._pending += text
        if self._mode is None and self._pending.strip():
            self._mode = "json" if self._pending.lstrip()[0] in "{[" else "text"
        if self._mode == "text":
            out, self._pending = self._pending, ""
            return out, []
        return "", []

    def finish(self) -> tuple[str, list[ToolCall]]:
        rest, self._pending = self._pending, ""
        if self._mode != "json":
            return rest, []
        try:
            value = json.loads(rest)
        except ValueError:
            return rest, []
        items = value if isinstance(value, list) else [value]
        calls = [self._call(json.dumps(item)) for item in items]
        if not items or any(c is None for c in calls):
            self.calls = self.calls[:len(self.calls) - sum(c is not None for c in calls)]
            return rest, []
        return "", calls


PARSERS: dict[str, type[ToolCallParser]] = {"hermes": ToolCallParser, "json": JsonToolCallParser}


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
