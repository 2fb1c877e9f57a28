"""A Qwen3-Coder call's arguments as they stream: its `<parameter=KEY>` blocks written as the JSON
object the whole call's arguments string is (`json.dumps` of {KEY: value}, gateway/tool_parser_xml.py
reads the values), piece by piece.

A parameter its tool's schema types as a string (a file's content, the case that is long) streams
as it is written, escaped as json.dumps escapes it. Any other value is read by its type only once
it is whole (the text "3" is a number or a string by the schema), so it comes in one piece at its
end. What may still turn out to be the value's end is held back: the parser drops the template's
newline after `<parameter=KEY>` and before `</parameter>`, and a `</parameter>` (with the blanks
after it) only ends the value when the next `<parameter=` or the function's end follows; until
then a `</parameter>` or `</function>` in the text may be the value's own (code that writes XML).
"""
from __future__ import annotations

import json
import re

from gateway.tool_text_values import (
    QWEN_FUNCTION_END,
    QWEN_PARAM,
    QWEN_PARAM_END,
    SteppedArgsWriter,
    schema_types,
    typed_value,
)

_SPACE = re.compile(r"\s*")
_TAIL_START = re.compile(r"[\n<]")


def _may_end_value(buf: str, i: int, limit: int) -> bool:
    """`buf[i:limit]` (the end of a value's text so far) may still be what ends the value: a
    prefix of `\\n? (</parameter> blanks)? (</function> blanks)? <parameter=` (each part
    optional). (Read in place: a value's text may be long.)"""
    if buf.startswith("\n", i, limit):
        i += 1
    for tag in (QWEN_PARAM_END, QWEN_FUNCTION_END):
        if buf.startswith(tag, i, limit):
            i = _SPACE.match(buf, i + len(tag), limit).end()
        elif limit - i < len(tag) and tag.startswith(buf[i:limit]):
            return True
    return limit - i < len(QWEN_PARAM) and QWEN_PARAM.startswith(buf[i:limit])


def _value_text(raw: str) -> str:
    """A parameter's value as the parser reads it (Qwen3CoderToolCallParser._body)."""
    tail = raw.rstrip()
    if tail.endswith(QWEN_PARAM_END):
        raw = tail[:-len(QWEN_PARAM_END)]
    return raw.removeprefix("\n").removesuffix("\n")


class QwenArgsWriter(SteppedArgsWriter):
    """The arguments of the call whose parameters start at `start` of a growing buffer, in the
    interface of gateway.tool_args_json.JsonArgsWriter (`write(buf, limit, final)`, `done`,
    `invalid`, `text`). `wrapped`: the call is inside `<tool_call>` (its text ends with
    `</function>`; a bare `<function=...>` block ends at it, before `limit`). `props`: the tool's
    schema properties."""

    def __init__(self, start: int, wrapped: bool, props: dict) -> None:
        self.i = start
        self.wrapped, self.props = wrapped, props
        self.done = self.invalid = False
        self._phase = "gap"  # "gap" (before a parameter), "key", "value"
        self._first = True
        self._string = False  # the value is a string by its schema: it streams
        self._emitted: list[str] = []  # the string value's text sent so far, and its length
        self._emitted_n = 0
        self._search = 0  # no <parameter= in the value before this
        self._schema = None
        self._pieces: list[str] = ["{"]
        self._sent = 0  # pieces given out

    def _step(self, buf: str, limit: int, final: bool) -> bool:
        """One phase's progress; True when it moved on to the next phase."""
        if self._phase != "value":  # (a gap or a key is short: read as a copy)
            rest = buf[self.i:limit]
        if self._phase == "gap":  # blanks, then a parameter or the function's end
            k = rest.find(QWEN_PARAM)
            if k >= 0 and not rest[:k].strip():
                self.i += k + len(QWEN_PARAM)
                self._phase = "key"
                return True
            ending = rest.strip()
            if final and ending == (QWEN_FUNCTION_END if self.wrapped else ""):
                self._pieces.append("}")
                self.done = True
            elif ending and not (QWEN_PARAM.startswith(ending)
                                 or self.wrapped and QWEN_FUNCTION_END.startswith(ending)):
                self.invalid = True
            return False
        if self._phase == "key":
            k = rest.find(">")
            key = rest[:k] if k >= 0 else rest
            if "\n" in key or k >= 0 and not key.strip():
                self.invalid = True
                return False
            if k < 0:
                return False
            key = key.strip()
            self._pieces.append(("" if self._first else ", ")
                                + json.dumps(key, ensure_ascii=False) + ": ")
            self._first = False
            self._schema = self.props.get(key)
            self._string = schema_types(self._schema) == {"string"}
            self._emitted, self._emitted_n, self._search = [], 0, 0
            if self._string:
                self._pieces.append('"')
            self.i += k + 1
            self._phase = "value"
            return True
        # the value: up to the next parameter, or the function's end
        k = buf.find(QWEN_PARAM, self.i + self._search, limit)
        if k < 0 and not final:
            self._search = max(0, limit - self.i - len(QWEN_PARAM) + 1)
            if self._string:
                self._send(buf, limit)
            return False
        rest = buf[self.i:limit]
        k = k - self.i if k >= 0 else -1
        if k >= 0:
            raw, self.i, self._phase = rest[:k], self.i + k + len(QWEN_PARAM), "key"
        else:
            raw = rest.rstrip()
            if self.wrapped:
                if not raw.endswith(QWEN_FUNCTION_END):
                    self.invalid = True
                    return False
                raw = raw[:-len(QWEN_FUNCTION_END)]
            else:
                raw = rest
        value = _value_text(raw)
        if self._string:
            if not value.startswith("".join(self._emitted)):  # (cannot be: what went was sure)
                self.invalid = True
                return False
            self._pieces.append(json.dumps(value[self._emitted_n:],
                                           ensure_ascii=False)[1:-1] + '"')
        else:
            self._pieces.append(json.dumps(typed_value(value, self._schema), ensure_ascii=False))
        if k < 0:
            self._pieces.append("}")
            self.done = True
        return k >= 0

    def _send(self, buf: str, limit: int) -> None:
        """The string value's text that is surely its own: all but what may still end it."""
        if self.i == limit:
            return
        start = self.i + buf.startswith("\n", self.i)  # (the template's newline)
        sent, keep = start + self._emitted_n, limit
        for m in _TAIL_START.finditer(buf, sent, limit):
            if _may_end_value(buf, m.start(), limit):
                keep = m.start()
                break
        if keep > sent:
            self._emitted.append(buf[sent:keep])
            self._emitted_n += keep - sent
            self._pieces.append(json.dumps(buf[sent:keep], ensure_ascii=False)[1:-1])
