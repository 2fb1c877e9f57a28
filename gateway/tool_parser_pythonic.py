"""`--tool-call-parser pythonic`: tool calls written as a Python list of calls with keyword
arguments, as Llama 3.2 (1B/3B) and Llama 4 write them (Meta's prompt-format pages; vLLM's
`pythonic` / `llama4_pythonic` parsers):

    [get_weather(city='San Francisco', metric='celsius'), get_time(tz="PST")]

optionally between Llama 4's `<|python_start|>` and `<|python_end|>`. The reply is read as a
Python expression with `ast` (never evaluated): each element must be a call of a listed tool by
name with keyword arguments whose values are literals (strings, numbers, True/False/None, lists,
dicts). Anything else is content, as the model wrote it. While the reply could still be such a
list (its first non-blank character is `[`) it is held back; as soon as it cannot, it streams as
content (as `--tool-call-parser json`; both are `WholeReplyToolCallParser`s).
"""
from __future__ import annotations

import ast
import json

from gateway.tool_call_parsers import ToolCall, WholeReplyToolCallParser, new_call_id

PY_START, PY_END = "<|python_start|>", "<|python_end|>"
MAX_CHARS = 1 << 20  # ast's compiler can exhaust the C stack on deep input: bounded first
MAX_DEPTH = 64


def _depth(text: str) -> int:
    """Bracket nesting (strings not skipped: an over-estimate, which only refuses more)."""
    depth = deepest = 0
    for ch in text:
        if ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}":
            depth -= 1
    return deepest


class PythonicToolCallParser(WholeReplyToolCallParser):
    def _looks_like_calls(self, head: str) -> bool | None:
        if head.startswith(("[", PY_START)):
            return True
        return None if PY_START.startswith(head) else False  # (a prefix of the wrapper)

    def _parse(self, text: str) -> list[ToolCall] | None:
        body = text.strip()
        if body.startswith(PY_START):
            body = body[len(PY_START):]
            body = body.removesuffix(PY_END)
            body = body.strip()
        if not body.startswith("[") or len(body) > MAX_CHARS or _depth(body) > MAX_DEPTH:
            return None
        try:
            node = ast.parse(body, mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        if not isinstance(node, ast.List) or not node.elts:
            return None
        calls = []
        for e in node.elts:
            if not (isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and not e.args) \
                    or e.func.id not in self.names or any(k.arg is None for k in e.keywords):
                return None
            try:
                args = {k.arg: ast.literal_eval(k.value) for k in e.keywords}
                json.dumps(args)  # a set or bytes is no JSON argument
            except (ValueError, TypeError, SyntaxError, RecursionError):
                return None
            calls.append(ToolCall(new_call_id(self.id_prefix), e.func.id, args))
        return calls
