"""A call's arguments as they stream, for the formats that write each value as text between tags
and end it at the first end tag: GLM-4.5's `<arg_key>K</arg_key><arg_value>V</arg_value>` and
DeepSeek-V3.2's DSML `<｜DSML｜parameter name="K" string="...">V</｜DSML｜parameter>`. The writer
gives, in pieces, the JSON object the reader makes of them (`json.dumps` of {K: value},
gateway/tool_parser_xml.py), so that the pieces add up to the whole call's arguments string.

A value that is a string (by the DSML `string="true"` attribute, or by the tool's schema) goes
out as it is written, escaped as json.dumps escapes it; only what may be the start of its end tag
waits. Any other value is read by its type when it is whole (the text "3" is a number or a string
by the schema), so it comes in one piece at its end. (Qwen3-Coder's values end less simply:
gateway/tool_args_qwen.py.)
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable

from gateway.tool_call_parsers import _partial_tag
from gateway.tool_text_values import SteppedArgsWriter, schema_types, typed_value

_SPACE = re.compile(r"\s*")

# a parameter's head at `pos` of the buffer, read up to `limit`: (key, the DSML string attribute
# or None, where the value starts), None while it may still come, False when it is no head
ParamHead = Callable[[str, int, int], "tuple[str, str | None, int] | bool | None"]


class TextArgsWriter(SteppedArgsWriter):
    """The arguments whose first parameter head is at `start` of a growing buffer, in the
    interface of gateway.tool_args_json.JsonArgsWriter (`write(buf, limit, final)`, `done`,
    `invalid`, `text`). `props`: the tool's schema properties; `head`: reads a parameter's head;
    `value_end`: the tag that ends a value. After the last value only blanks may come."""

    def __init__(self, start: int, props: dict, head: ParamHead, value_end: str) -> None:
        self.i = start
        self.props, self._head, self._end = props, head, value_end
        self.done = self.invalid = False
        self._in_value = False
        self._first = True
        self._string = False  # the value streams as text
        self._schema = None  # what reads a value that is not streamed
        self._search = 0  # no end tag in the value before this (from its start)
        self._pieces: list[str] = ["{"]
        self._sent = 0

    def _step(self, buf: str, limit: int, final: bool) -> bool:
        """Progress on a parameter's head or its value; True when it moved on."""
        if not self._in_value:
            pos = _SPACE.match(buf, self.i, limit).end()
            if pos == limit:  # (blanks so far: the arguments end here if the block does)
                if final:
                    self._pieces.append("}")
                    self.done = True
                return False
            head = self._head(buf, pos, limit)
            if not head:
                self.invalid = head is False
                return False
            key, text_attr, self.i = head
            schema = self.props.get(key)
            self._string = text_attr == "true" or text_attr is None \
                and schema_types(schema) == {"string"}
            self._schema = {} if text_attr == "false" else schema  # (DSML's "false": JSON)
            self._pieces.append(("" if self._first else ", ")
                                + json.dumps(key, ensure_ascii=False) + ": "
                                + ('"' if self._string else ""))
            self._first, self._in_value, self._search = False, True, 0
            return True
        k = buf.find(self._end, self.i + self._search, limit)
        if k < 0:
            # (the value may still end: not past a partial end tag, not searched again)
            keep = limit - _partial_tag(buf[max(self.i, limit - len(self._end)):limit],
                                        self._end)
            self._search = max(0, keep - self.i)
            if self._string and keep > self.i:
                self._pieces.append(json.dumps(buf[self.i:keep], ensure_ascii=False)[1:-1])
                self.i, self._search = keep, 0
            return False
        value = buf[self.i:k]
        self._pieces.append(json.dumps(value, ensure_ascii=False)[1:-1] + '"' if self._string
                            else json.dumps(typed_value(value, self._schema), ensure_ascii=False))
        self.i, self._in_value = k + len(self._end), False
        return True
