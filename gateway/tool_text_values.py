"""The tagged-text tool-call formats' markers (`qwen3_coder`, `glm45`, `deepseek_v32`: examples in
gateway/tool_parser_xml.py), and how a value written there as text is read by its tool's schema:
what the whole-call parsers (gateway/tool_parser_xml.py) and the writers that stream those calls'
arguments (gateway/tool_args_qwen.py, gateway/tool_args_text.py) share. A module of its own so that
the parsers can import the writers and the writers these rules without an import loop.

A value is text as the template writes it: strings as they are, other values as JSON (Qwen's
template writes scalars with Jinja's `string`, so True / False / None too). Each value is read by
the type its tool's JSON schema gives the parameter: a string parameter keeps the text exactly
(code with quotes, braces and newlines stays as written), numbers, booleans, null, objects and
arrays are parsed, and a value that does not parse as its type stays the text the model wrote.
A parameter the schema does not type is JSON when it parses as JSON, else text.
"""
from __future__ import annotations

import json
from typing import Any

from gateway.tool_call_parsers import UNREADABLE

QWEN_CALL, QWEN_CALL_END = "<tool_call>", "</tool_call>"
QWEN_FUNCTION, QWEN_FUNCTION_END = "<function=", "</function>"
QWEN_PARAM, QWEN_PARAM_END = "<parameter=", "</parameter>"
GLM_KEY, GLM_KEY_END, GLM_VALUE, GLM_VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", \
    "</arg_value>"
_PY_LITERALS = {"True": True, "False": False, "None": None}
DSML = "｜DSML｜"
DSML_SECTIONS = tuple((f"<{DSML}{w}>", f"</{DSML}{w}>") for w in ("function_calls", "tool_calls"))
DSML_INVOKE, DSML_INVOKE_END = f"<{DSML}invoke name=", f"</{DSML}invoke>"
DSML_PARAM_END = f"</{DSML}parameter>"


def schema_types(schema: Any) -> set[str]:
    """The JSON types a parameter's schema allows (`type`, a list of them, or anyOf / oneOf)."""
    if not isinstance(schema, dict):
        return set()
    kind = schema.get("type")
    out = {kind} if isinstance(kind, str) else {k for k in kind if isinstance(k, str)} \
        if isinstance(kind, list) else set()
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or ():
            out |= schema_types(sub)
    if not out and "enum" in schema and all(isinstance(v, str) for v in schema["enum"] or ()):
        out.add("string")
    return out


def typed_value(text: str, schema: Any) -> Any:
    """`text` as the value of a parameter with this JSON schema (the rules above)."""
    types = schema_types(schema)
    if types == {"string"} or not text.strip() and "string" in types:
        return text
    s = text.strip()
    if s in _PY_LITERALS:
        s = json.dumps(_PY_LITERALS[s])
    try:
        value = json.loads(s)
    except UNREADABLE:
        return text
    if not types:
        return value
    kinds = {bool: "boolean", type(None): "null", str: "string", list: "array", dict: "object"}
    kind = kinds.get(type(value)) or ("integer" if isinstance(value, int) else "number")
    if kind in types or kind == "integer" and "number" in types:
        return value
    if kind == "number" and "integer" in types and float(value).is_integer():
        return int(value)
    return text


class SteppedArgsWriter:
    """What the tagged-text formats' argument writers (gateway/tool_args_qwen.py,
    gateway/tool_args_text.py) share: the interface of gateway.tool_args_json.JsonArgsWriter
    (`write(buf, limit, final)` -> the new piece, `done`, `invalid`, `text`) over a `_step`
    that each writer defines (one phase's progress on the buffer; True when it moved on) and the
    JSON pieces it appends to `_pieces`."""

    done: bool
    invalid: bool
    _pieces: list[str]
    _sent: int  # pieces given out

    @property
    def text(self) -> str:
        return "".join(self._pieces)

    def write(self, buf: str, limit: int, final: bool = False) -> str:
        while not (self.done or self.invalid) and self._step(buf, limit, final):
            pass
        if final and not self.done:
            self.invalid = True
        piece = "".join(self._pieces[self._sent:])
        self._sent = len(self._pieces)
        return piece

    def _step(self, buf: str, limit: int, final: bool) -> bool:
        raise NotImplementedError
