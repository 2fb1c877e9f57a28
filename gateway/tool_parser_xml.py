"""Tool-call parsers for the families that write each argument as tagged text rather than JSON,
on `TaggedToolCallParser` (gateway/tool_call_parsers.py). The formats are those of the families'
chat templates (how they write an assistant's calls back; the model writes its own the same way):

`qwen3_coder` (Qwen3-Coder 30B-A3B / 480B-A35B, and the Qwen 3.5 templates that took its format):

    <tool_call>
    <function=write_file>
    <parameter=path>
    src/app.py
    </parameter>
    <parameter=content>
    print("hello")
    </parameter>
    </function>
    </tool_call>

(a bare `<function=...>...</function>` without the `<tool_call>` wrapper is read too).

`glm45` (GLM-4.5 / 4.6, and GLM-4.7's form without the newlines):

    <tool_call>write_file
    <arg_key>path</arg_key>
    <arg_value>src/app.py</arg_value>
    </tool_call>

`deepseek_v32` (DeepSeek-V3.2's DSML, `function_calls`; DeepSeek-V4 names it `tool_calls`; the
`string` attribute says whether the value is text or JSON):

    <｜DSML｜function_calls>
    <｜DSML｜invoke name="write_file">
    <｜DSML｜parameter name="path" string="true">src/app.py</｜DSML｜parameter>
    <｜DSML｜parameter name="mode" string="false">420</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>

How a value written as text is read (by its tool's schema): gateway/tool_text_values.py.
"""
from __future__ import annotations

import re

from gateway.tool_args_qwen import QwenArgsWriter
from gateway.tool_args_text import TextArgsWriter
from gateway.tool_call_parsers import (
    _SPACE,
    HEAD_WINDOW,
    TaggedToolCallParser,
    ToolCall,
)
from gateway.tool_text_values import (
    DSML,
    DSML_INVOKE,
    DSML_INVOKE_END,
    DSML_PARAM_END,
    DSML_SECTIONS,
    GLM_KEY,
    GLM_KEY_END,
    GLM_VALUE,
    GLM_VALUE_END,
    QWEN_CALL,
    QWEN_CALL_END,
    QWEN_FUNCTION,
    QWEN_FUNCTION_END,
    QWEN_PARAM,
    QWEN_PARAM_END,
    typed_value,
)

_DSML_NAME = re.compile(r'\s*"([^"\n]+)"\s*>')
_DSML_PARAM = re.compile(r'\s*<' + DSML
                         + r'parameter name="([^"\n]+)"(?:\s+string="(true|false)")?\s*>')


class _ArgTextParser(TaggedToolCallParser):
    """What the two formats share: the call of `name` with these (key, text) arguments."""

    def _call(self, name: str, pairs: list[tuple[str, str]]) -> list[ToolCall] | None:
        if name not in self.names or len({k for k, _ in pairs}) != len(pairs):
            return None
        props = self._props(name)
        call = self.make_call(name, {k: typed_value(v, props.get(k)) for k, v in pairs})
        return None if call is None else [call]

    def _props(self, name: str) -> dict:
        """The schema properties of the listed tool `name`."""
        tool = next(t for t in self.cfg.tools if t.name == name)
        props = tool.schema.get("properties") if isinstance(tool.schema, dict) else None
        return props if isinstance(props, dict) else {}


class Qwen3CoderToolCallParser(_ArgTextParser):
    """Arguments stream in pieces (gateway/tool_args_qwen.py) once `<function=NAME>` names a
    listed tool: string parameters as they are written, others whole at their end."""

    blocks = ((QWEN_CALL, QWEN_CALL_END), (QWEN_FUNCTION, QWEN_FUNCTION_END))
    streams_arguments = True

    def _stream_head(self, body: str):
        # `_body`'s reading of the head: (blanks and <function= in the wrapped form), a name
        # without a newline up to ">"; the same answer on any longer text
        pos = 0
        if self._wrapped:
            pos = _SPACE.match(body).end()
            if not body.startswith(QWEN_FUNCTION, pos):
                return None if QWEN_FUNCTION.startswith(body[pos:]) else False
            pos += len(QWEN_FUNCTION)
        gt = body.find(">", pos, pos + HEAD_WINDOW)
        if gt < 0:
            name = body[pos:pos + HEAD_WINDOW]
            return False if "\n" in name or len(name) == HEAD_WINDOW else None
        name = body[pos:gt]
        if "\n" in name or name.strip() not in self.names:
            return False
        return name.strip(), gt + 1, None

    def _stream_block(self, items, begin: str, final: bool) -> None:
        self._wrapped = begin == QWEN_CALL  # (the block's form, for _stream_head)
        super()._stream_block(items, begin, final)

    def _args_writer(self, begin: str, name: str, start: int):
        return QwenArgsWriter(start, begin == QWEN_CALL, self._props(name))

    def _body(self, begin: str, body: str, closed: bool) -> list[ToolCall] | None:
        if begin == QWEN_CALL:
            body = body.strip()
            if not body.startswith(QWEN_FUNCTION) or not body.endswith(QWEN_FUNCTION_END):
                return None  # (an unclosed function is a cut call)
            body = body[len(QWEN_FUNCTION):-len(QWEN_FUNCTION_END)]
        elif not closed:
            return None
        name, gt, rest = body.partition(">")
        chunks = rest.split(QWEN_PARAM)
        if not gt or "\n" in name or chunks[0].strip():
            return None
        pairs = []
        for chunk in chunks[1:]:
            key, gt, value = chunk.partition(">")
            if not gt or not key.strip() or "\n" in key:
                return None
            tail = value.rstrip()
            if tail.endswith(QWEN_PARAM_END):  # (a missing </parameter> is forgiven)
                value = tail[:-len(QWEN_PARAM_END)]
            value = value.removeprefix("\n").removesuffix("\n")  # the template's own newlines
            pairs.append((key.strip(), value))
        return self._call(name.strip(), pairs)


def _glm_param_head(buf: str, pos: int, limit: int):
    """`<arg_key>K</arg_key> <arg_value>` at `pos` (gateway.tool_args_text.ParamHead)."""
    if not buf.startswith(GLM_KEY, pos, limit):
        return None if limit - pos < len(GLM_KEY) and GLM_KEY.startswith(buf[pos:limit]) \
            else False
    end = buf.find(GLM_KEY_END, pos + len(GLM_KEY), limit)
    if end < 0:
        return None
    value = _SPACE.match(buf, end + len(GLM_KEY_END), limit).end()
    if not buf.startswith(GLM_VALUE, value, limit):
        return None if limit - value < len(GLM_VALUE) \
            and GLM_VALUE.startswith(buf[value:limit]) else False
    return buf[pos + len(GLM_KEY):end].strip(), None, value + len(GLM_VALUE)


def _dsml_param_head(buf: str, pos: int, limit: int):
    """`<｜DSML｜parameter name="K" string="...">` at `pos` (gateway.tool_args_text.ParamHead)."""
    m = _DSML_PARAM.match(buf, pos, limit)
    if m is not None:
        return m.group(1), m.group(2), m.end()
    return None if limit - pos < HEAD_WINDOW else False


class Glm45ToolCallParser(_ArgTextParser):
    """Arguments stream in pieces (gateway/tool_args_text.py) once the name before the first
    `<arg_key>` is a listed tool: string values as they are written, others whole at their
    end."""

    keeps_special_tokens = True
    blocks = ((QWEN_CALL, QWEN_CALL_END),)
    streams_arguments = True

    def _stream_head(self, body: str):
        k = body.find(GLM_KEY, 0, HEAD_WINDOW + len(GLM_KEY))
        if k < 0:  # (a call without arguments comes whole)
            return None if len(body) < HEAD_WINDOW + len(GLM_KEY) else False
        name = body[:k].strip()
        return (name, k, None) if name in self.names else False

    def _args_writer(self, begin: str, name: str, start: int):
        return TextArgsWriter(start, self._props(name), _glm_param_head, GLM_VALUE_END)

    def _body(self, begin: str, body: str, closed: bool) -> list[ToolCall] | None:
        k = body.find(GLM_KEY)
        name, rest = (body, "") if k < 0 else (body[:k], body[k:])
        if not name.strip() or "\n" in name.strip():
            return None
        pairs = []
        while rest.strip():
            rest = rest.lstrip()
            if not rest.startswith(GLM_KEY):
                return None
            key, sep, rest = rest[len(GLM_KEY):].partition(GLM_KEY_END)
            rest = rest.lstrip()
            if not sep or not rest.startswith(GLM_VALUE):
                return None
            value, sep, rest = rest[len(GLM_VALUE):].partition(GLM_VALUE_END)
            if not sep:
                return None
            pairs.append((key.strip(), value))
        return self._call(name.strip(), pairs)


class DeepSeekV32ToolCallParser(_ArgTextParser):
    """Arguments stream in pieces (gateway/tool_args_text.py) once the invoke's name is a
    listed tool: values with `string="true"` (or typed string by the schema when the attribute
    is missing) as they are written, others whole at their end."""

    keeps_special_tokens = True
    sections = DSML_SECTIONS
    blocks = ((DSML_INVOKE, DSML_INVOKE_END),)
    streams_arguments = True

    def _stream_head(self, body: str):
        m = _DSML_NAME.match(body)
        if m is None:
            return None if len(body) < HEAD_WINDOW else False
        return (m.group(1), m.end(), None) if m.group(1) in self.names else False

    def _args_writer(self, begin: str, name: str, start: int):
        return TextArgsWriter(start, self._props(name), _dsml_param_head, DSML_PARAM_END)

    def _body(self, begin: str, body: str, closed: bool) -> list[ToolCall] | None:
        m = _DSML_NAME.match(body)
        if m is None or not closed:
            return None
        pos, raw = m.end(), []
        while body[pos:].strip():
            p = _DSML_PARAM.match(body, pos)
            end = body.find(DSML_PARAM_END, p.end()) if p else -1
            if end < 0:
                return None
            raw.append((p.group(1), body[p.end():end], p.group(2)))
            pos = end + len(DSML_PARAM_END)
        calls = self._call(m.group(1), [(k, v) for k, v, _ in raw])
        if calls is None:
            return None
        # string="true": the text as it is; "false": JSON (what the schema says otherwise)
        args = calls[0].arguments
        for key, value, is_text in raw:
            if is_text == "true":
                args[key] = value
            elif is_text == "false":
                args[key] = typed_value(value, {})
        return calls
