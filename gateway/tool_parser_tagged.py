"""Tool-call parsers for the families that mark their calls with control tokens, on
`TaggedToolCallParser` (gateway/tool_call_parsers.py). The formats are those the families' chat
templates write an assistant's calls in (the model writes its own calls the same way):

`deepseek_v3` (DeepSeek-V3 / V3-0324 / R1 / R1-0528, and V3.1's shorter form; the templates in the
models' tokenizer_config.json):

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜>
    <｜tool▁call▁begin｜>function<｜tool▁sep｜>...<｜tool▁call▁end｜><｜tool▁calls▁end｜>

    V3.1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}
          <｜tool▁call▁end｜><｜tool▁calls▁end｜>

`kimi_k2` (Kimi K2 Instruct / Thinking; the call id is the model's own, `functions.NAME:INDEX`,
which Kimi's template writes back into the conversation):

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0
    <|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>

`internlm` (InternLM 2 / 2.5): `<|action_start|><|plugin|>\\n{"name": ..., "parameters": {...}}
<|action_end|>`.

`granite` (IBM Granite 3.x): `<|tool_call|>` (3.0) or `<tool_call>` (3.1 on) followed by a JSON
array of {"name", "arguments"}; the array's end ends the block.

Their markers are special tokens: requests parsed with these parsers are detokenized with
special tokens kept (`keeps_special_tokens`).

All four stream a call's arguments in pieces: `_stream_head` finds where a block's JSON object
starts (gateway/tool_call_parsers.py does the rest); granite's array is read element by element.
"""
from __future__ import annotations

import json
import re

from gateway.tool_call_parsers import (
    _JSON,
    _SPACE,
    HEAD_WINDOW,
    UNREADABLE,
    Item,
    TaggedToolCallParser,
    ToolCall,
    head_tokens,
    json_call_head,
    new_call_id,
)

DS_CALLS_BEGIN, DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN, DS_CALL_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
KIMI_SECTION_BEGIN, KIMI_SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
KIMI_CALL_BEGIN, KIMI_CALL_END = "<|tool_call_begin|>", "<|tool_call_end|>"
KIMI_ARGS = "<|tool_call_argument_begin|>"
_KIMI_ID = re.compile(r"(?:functions\.)?([A-Za-z0-9_.\-]+?)(?::(\d+))?")
INTERNLM_BEGIN, INTERNLM_END = "<|action_start|><|plugin|>", "<|action_end|>"
GRANITE_TAGS = ("<|tool_call|>", "<tool_call>")


def _find_in_head(body: str, marker: str) -> int | bool | None:
    """Where `marker` is in the head of `body`; None while it may still come, False if the
    head is past without it (the same answer for every longer text)."""
    window = HEAD_WINDOW + len(marker)
    k = body.find(marker, 0, window)
    if k >= 0:
        return k
    return None if len(body) < window else False


def _object_start(body: str, pos: int) -> int | bool | None:
    """After whitespace from `pos`: the `{` that begins the arguments (its index), None at the
    end of the text, False for anything else."""
    pos = _SPACE.match(body, pos).end()
    if pos == len(body):
        return None
    return pos if body[pos] == "{" else False


class DeepSeekV3ToolCallParser(TaggedToolCallParser):
    keeps_special_tokens = True
    sections = ((DS_CALLS_BEGIN, DS_CALLS_END),)
    blocks = ((DS_CALL_BEGIN, DS_CALL_END),)
    streams_arguments = True

    def _stream_head(self, body: str):
        # the two forms as _body reads them: NAME<sep>{...} (V3.1), and function<sep>NAME, a
        # newline, then the object in an optional ```json fence (V3 / R1). A tool that is itself
        # named "function" comes whole.
        k = _find_in_head(body, DS_SEP)
        if k is None or k is False:
            return k
        name, pos = body[:k].strip(), k + len(DS_SEP)
        if name == "function":
            nl = body.find("\n", pos, pos + HEAD_WINDOW)
            if nl < 0:
                return None if len(body) < pos + HEAD_WINDOW else False
            name = body[pos:nl].strip()
            if name.startswith("{"):
                return False
            pos = _SPACE.match(body, nl + 1).end()
            for word in ("```", "json"):
                if body.startswith(word, pos):
                    pos += len(word)
                elif len(body) - pos < len(word) and word.startswith(body[pos:]):
                    return None
                else:
                    break
        if name not in self.names:
            return False
        start = _object_start(body, pos)
        return start if start is None or start is False else (name, start, None)

    def _body(self, begin: str, body: str, closed: bool) -> list[ToolCall] | None:
        head, sep, rest = body.partition(DS_SEP)
        if not sep:
            return None
        head = head.strip()
        name, args = head, rest
        if head == "function":  # V3 / R1: the call's type, then the name and fenced JSON
            line, nl, after = rest.partition("\n")
            fenced = _unfence(after) if nl else None
            if fenced is not None and not line.strip().startswith("{"):
                name, args = line.strip(), fenced
        call = self.make_call(name, args.strip())
        return None if call is None else [call]


def _unfence(text: str) -> str | None:
    """The JSON of "```json\\n{...}\\n```" (the fence optional on both sides)."""
    s = text.strip()
    if s.startswith("```"):
        s = s[3:].removeprefix("json")
        if not s.rstrip().endswith("```"):
            return None
        s = s.rstrip()[:-3]
    return s


class KimiK2ToolCallParser(TaggedToolCallParser):
    keeps_special_tokens = True
    sections = ((KIMI_SECTION_BEGIN, KIMI_SECTION_END),)
    blocks = ((KIMI_CALL_BEGIN, KIMI_CALL_END),)
    streams_arguments = True
    _made = 0

    def _stream_head(self, body: str):
        k = _find_in_head(body, KIMI_ARGS)
        if k is None or k is False:
            return k
        m = _KIMI_ID.fullmatch(body[:k].strip())
        if m is None or m.group(1) not in self.names:
            return False
        start = _object_start(body, k + len(KIMI_ARGS))
        if start is None or start is False:
            return start
        # the id _body gives the call (it counts the call when it makes it, after this)
        index = m.group(2) if m.group(2) is not None else str(self._made)
        return m.group(1), start, f"functions.{m.group(1)}:{index}"

    def _body(self, begin: str, body: str, closed: bool) -> list[ToolCall] | None:
        head, sep, args = body.partition(KIMI_ARGS)
        m = _KIMI_ID.fullmatch(head.strip())
        if not sep or m is None:
            return None
        name = m.group(1)
        # the model's own index; without one, the count of this reply's calls so far
        index = m.group(2) if m.group(2) is not None else str(self._made)
        call = self.make_call(name, args.strip(), f"functions.{name}:{index}")
        self._made += call is not None
        return None if call is None else [call]


class InternLMToolCallParser(TaggedToolCallParser):
    keeps_special_tokens = True
    blocks = ((INTERNLM_BEGIN, INTERNLM_END),)
    streams_arguments = True

    def _stream_head(self, body: str):
        return json_call_head(body, self.names)

    def _body(self, begin: str, body: str, closed: bool) -> list[ToolCall] | None:
        call = self.json_call(body)
        return None if call is None else [call]


class GraniteToolCallParser(TaggedToolCallParser):
    keeps_special_tokens = True
    blocks = tuple((tag, None) for tag in GRANITE_TAGS)
    streams_arguments = True

    def _stream_block(self, items: list[Item], begin: str, final: bool) -> None:
        # the array's elements in turn: each {"name": ..., "arguments": {...}} streams once its
        # head reads; after its object, the element's "}" and a "," lead to the next, "]" ends
        # the array. The first element that does not read so, and all after it, come whole.
        args, buf = self._args, self._pending
        while not args.headless:
            w = args.writer
            if w is None:
                start = head_tokens(buf, len(begin), "[")
            else:
                args.write(items, buf, len(buf), final)
                if not w.done:
                    return
                start = head_tokens(buf, w.end, "}", (",", "]"))
                if start and buf[start - 1] == "]":
                    start = False
            if start:
                head = json_call_head(buf[start:], self.names)
                if head:
                    name, offset, _ = head
                    args.start(items, new_call_id(self.id_prefix), name, start + offset)
                    continue
                start = head
            args.headless = start is False or final
            return

    def _match_block(self, buf: str, begin: str, final: bool
                     ) -> tuple[int, list[ToolCall] | None] | None:
        pos = _SPACE.match(buf, len(begin)).end()
        if pos == len(buf) and not final:
            return None
        if not final and buf[pos] in "[{" and self._json_end.find(buf, pos) < 0:
            return None  # (the JSON is still coming: decoded once it can be complete)
        try:
            value, end = _JSON.raw_decode(buf, pos)
        except UNREADABLE:
            return (len(buf), None) if final else (len(begin), None)
        items = value if isinstance(value, list) else [value]
        calls = [self.json_call(json.dumps(o)) if isinstance(o, dict) else None for o in items]
        if not calls or any(c is None for c in calls):
            return end, None
        close = buf[end:].lstrip()  # a </tool_call> after the array belongs to the block
        if begin == "<tool_call>" and close.startswith("</tool_call>"):
            end = len(buf) - len(close) + len("</tool_call>")
        elif begin == "<tool_call>" and not final and "</tool_call>".startswith(close):
            return None  # (it may still come)
        return end, calls
