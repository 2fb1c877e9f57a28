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

Arguments stream in pieces (issue 29): a call starts once its name is complete and listed and its
`(` is read (`[get_weather(`, `<|python_start|>[f(`, `..., g(` after a call's `)`); its keyword
arguments then go out as JSON as they are written (gateway/tool_args_python.py: string literals as
written, other values whole at their end). A head written otherwise (a comment or a line
continuation before the name, a non-ASCII name, `(f)(...)`) does not stream: that call and those
after it come whole. The reply is still read whole with `ast` at its end, and that reading decides,
as before: the calls' arguments strings are json.dumps of the evaluated keyword arguments, in both
paths (the stream's pieces add up to the same string: tested). A reply that then turns out to be
no list of calls (text after the list, a value that is no literal, `'a'.upper()`) is content
whole; a stream cannot take back the call it began: it ends with the pieces sent
(gateway/tool_parser.py's StreamShaper says what the client sees). A call that repeats a keyword
(`ast` reads it, keeping the last value) streams both values; the string's JSON is the same
object.
"""
from __future__ import annotations

import ast
import json
import logging
import re

from gateway.tool_args_python import MAX_DEPTH, NAME, PythonArgsWriter, identifier
from gateway.tool_call_parsers import (
    HEAD_WINDOW,
    ArgsPiece,
    ArgsStream,
    BrokenCall,
    Item,
    ToolCall,
    WholeReplyToolCallParser,
    new_call_id,
)

log = logging.getLogger(__name__)

PY_START, PY_END = "<|python_start|>", "<|python_end|>"
MAX_CHARS = 1 << 20  # ast's compiler can exhaust the C stack on deep input: bounded first
_BLANK = re.compile(r"\s*")  # what str.strip() takes (the reply's ends; around the wrapper's body)
_PY_BLANK = re.compile(r"[ \t\f\n\r]*")  # what Python's tokenizer skips inside brackets


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
    streams_arguments = True

    def __init__(self, cfg, id_prefix: str = "call_") -> None:
        super().__init__(cfg, id_prefix)
        self._args = ArgsStream()

    def _progress(self, final: bool) -> list[Item]:
        """The calls begun so far and their argument pieces, in order (each call's head is read
        once the previous call's `)` is)."""
        args = self._args
        if args.headless or self._mode != "calls" or not self.streams_arguments:
            return []
        items: list[Item] = []
        buf = self._pending
        while True:
            w = args.writer
            if w is not None:
                args.write(items, buf, len(buf), final)
                if not w.done:
                    break  # (more to come; or no call after all: the end says so)
            head = self._head(buf, w.end if w is not None else -1)
            if not head:
                args.headless = head is False or final
                break
            name, start = head
            args.start(items, new_call_id(self.id_prefix), name, start, PythonArgsWriter(start))
        return items

    def _head(self, buf: str, after: int) -> tuple[str, int] | bool | None:
        """The next call's head: (its name, where its arguments start, past the `(`); None while
        the text may still become one; False when it does not (the list's `]` included). The
        first call's after the list's `[`, a later one's after `,` past the previous call's end
        (`after`). The same answer on any longer text."""
        if after < 0:
            pos = _BLANK.match(buf).end()
            if buf.startswith(PY_START, pos):
                pos = _BLANK.match(buf, pos + len(PY_START)).end()
            if pos >= HEAD_WINDOW:
                return False
            if pos == len(buf):
                return None
            if buf[pos] != "[":
                return False
        else:
            pos = _PY_BLANK.match(buf, after).end()
            if pos - after >= HEAD_WINDOW:
                return False
            if pos == len(buf):
                return None
            if buf[pos] != ",":
                return False
        # the name and its `(`, within HEAD_WINDOW of the `[` or `,` (so that a longer text never
        # decides otherwise: past the window it is False whatever follows)
        start = pos = pos + 1
        pos = _PY_BLANK.match(buf, pos).end()
        m = NAME.match(buf, pos)
        if m is not None and m.end() < len(buf):
            name = m.group()
            if not name.isascii() or identifier(name) != name or name not in self.names:
                return False
            pos = _PY_BLANK.match(buf, m.end()).end()
            if pos < len(buf):
                return (name, pos + 1) if buf[pos] == "(" and pos - start < HEAD_WINDOW else False
        elif m is None and pos < len(buf) or m is not None and len(m.group()) > 64:
            return False
        return None if len(buf) - start < HEAD_WINDOW else False  # (the head may go on)

    def _end(self, rest: str, calls: list[ToolCall] | None) -> list[Item]:
        """The reply read whole decides: its calls, the begun ones marked streamed (their
        arguments string the whole reading's, which the pieces add up to); or, when it is no
        list of calls of which the begun ones are the first, a BrokenCall (content whole)."""
        started = self._args.started
        self._args.started, self._args.headless = [], False
        if not started:
            return super()._end(rest, calls)
        if calls is None or len(calls) < len(started) \
                or any(c.name != s.name for (s, _), c in zip(started, calls)):
            return [BrokenCall(rest)]
        items: list[Item] = []
        for (s, w), c in zip(started, calls):
            whole, sent = c.arguments_text, w.text
            if not w.done and whole.startswith(sent):  # (the last begun call, refused by the
                items.append(ArgsPiece(whole[len(sent):]))  # writer: the rest in one piece)
                sent = whole
            if sent != whole:  # (a repeated keyword; else a bug of the writer's)
                log.warning("pythonic call %s: streamed arguments (%d chars) differ from the "
                            "whole reading's (%d)", c.name, len(sent), len(whole))
            items.append(ToolCall(s.id, c.name, c.arguments, streamed=True))
        return items + calls[len(started):]

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
