"""A tool call's arguments as they stream: the model's JSON object rewritten, token by token, in
the form `json.dumps(json.loads(text), ensure_ascii=False)` gives it (", " and ": " between
items, no other whitespace, escapes decoded and written back as json.dumps writes them, numbers
as Python reads and prints them).

Why rewrite rather than pass the model's text through: a non-streamed call's `arguments` has
always been `json.dumps` of the parsed object, and the pieces a stream sends must add up to
exactly that string. The rewrite needs no lookahead but a token's end, so a string (a file's
content inside a `write_file` call) goes out as the model writes it, character runs copied as
they are; only an escape, a number or a literal waits for its last character.

The one case where the rewrite and `json.dumps(json.loads(...))` differ is an object that repeats
a key: `json.loads` keeps the last value in the first key's place, the rewrite keeps both as the
model wrote them (it cannot take back what it sent). Callers use the rewrite as the call's
arguments in both paths (gateway.tool_call_parsers), so streamed and whole still agree.
"""
from __future__ import annotations

import math
import re
from json.encoder import encode_basestring

_WS = re.compile(r"[ \t\n\r]*")  # json's whitespace, no more
_PLAIN = re.compile(r'[^"\\\x00-\x1f]*')  # string characters json.dumps writes as they are
_NUMBER_RUN = re.compile(r"[-+0-9.eE]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?\Z")  # json's NUMBER_RE
_HEX4 = re.compile(r"[0-9a-fA-F]{4}")
_SIMPLE_ESCAPES = {'"': '\\"', "\\": "\\\\", "/": "/", "b": "\\b", "f": "\\f", "n": "\\n",
                   "r": "\\r", "t": "\\t"}
_LITERALS = ("true", "false", "null", "NaN", "Infinity", "-Infinity")

# what may come next, outside a string
_VALUE, _VALUE_OR_CLOSE, _KEY, _KEY_OR_CLOSE, _COLON, _COMMA_OR_CLOSE = range(6)


class _Wait(Exception):
    """The token at the end of the text read so far may still grow."""


class _Invalid(Exception):
    """json.loads would refuse the text here."""


def _float_text(f: float) -> str:
    # json.encoder's floatstr
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "Infinity" if f > 0 else "-Infinity"
    return float.__repr__(f)


class JsonArgsWriter:
    """Reads one JSON object from `buf[start:]` (a buffer that grows) and gives its rewrite in
    pieces: `write(buf, limit, final)` reads up to `limit` and returns the rewrite of what it
    could complete. `final`: nothing more comes before `limit` (the block ended), so a token at
    the limit is whole. `done`: the object closed at `end`; `invalid`: json.loads would refuse
    the text at `i` (nothing more is written); `text`: everything written so far."""

    __slots__ = ("_expect", "_in_key", "_in_string", "_pieces", "_stack", "done", "end", "i",
                 "invalid")

    def __init__(self, start: int) -> None:
        self.i = start  # the next character of the buffer to read
        self._stack: list[str] = []
        self._expect = _VALUE
        self._in_string = self._in_key = False
        self.done = self.invalid = False
        self.end = -1
        self._pieces: list[str] = []  # (joined once, at the end: a long call has many pieces)

    def write(self, buf: str, limit: int, final: bool = False) -> str:
        if self.done or self.invalid:
            return ""
        out: list[str] = []
        try:
            self._read(buf, limit, final, out)
        except _Wait:
            if final:
                self.invalid = True
        except _Invalid:
            self.invalid = True
        if final and not self.done:
            self.invalid = True  # (the object never closed)
        piece = "".join(out)
        self._pieces.append(piece)
        return piece

    @property
    def text(self) -> str:
        return "".join(self._pieces)

    def _read(self, buf: str, limit: int, final: bool, out: list[str]) -> None:
        # self.i moves only past what `out` holds, so a _Wait leaves it at the token's start
        while self.i < limit and not self.done:
            i = self.i
            if self._in_string:
                j = _PLAIN.match(buf, i, limit).end()
                if j > i:
                    out.append(buf[i:j])
                    self.i = i = j
                    if i >= limit:
                        break
                c = buf[i]
                if c == '"':
                    out.append('"')
                    self.i = i + 1
                    self._in_string = False
                    self._expect = _COLON if self._in_key else _COMMA_OR_CLOSE
                elif c == "\\":
                    text, self.i = self._escape(buf, i, limit)
                    out.append(text)
                else:
                    raise _Invalid  # a raw control character (json.loads is strict)
                continue
            i = _WS.match(buf, i, limit).end()
            self.i = i
            if i >= limit:
                break
            c, expect = buf[i], self._expect
            if expect in (_KEY, _KEY_OR_CLOSE):
                if c == '"':
                    self._open_string(out, key=True)
                elif c == "}" and expect == _KEY_OR_CLOSE:
                    self._close(out, c)
                else:
                    raise _Invalid
            elif expect == _COLON:
                if c != ":":
                    raise _Invalid
                out.append(": ")
                self.i += 1
                self._expect = _VALUE
            elif expect == _COMMA_OR_CLOSE:
                top = self._stack[-1]
                if c == ",":
                    out.append(", ")
                    self.i += 1
                    self._expect = _KEY if top == "{" else _VALUE
                elif c == ("}" if top == "{" else "]"):
                    self._close(out, c)
                else:
                    raise _Invalid
            elif c == "]" and expect == _VALUE_OR_CLOSE:
                self._close(out, c)
            elif not self._stack and c != "{":
                raise _Invalid  # (the arguments are an object)
            elif c in "{[":
                self._stack.append(c)
                out.append(c)
                self.i += 1
                self._expect = _KEY_OR_CLOSE if c == "{" else _VALUE_OR_CLOSE
            elif c == '"':
                self._open_string(out, key=False)
            else:
                out.append(self._scalar(buf, i, limit, final))
                self._expect = _COMMA_OR_CLOSE

    def _open_string(self, out: list[str], key: bool) -> None:
        out.append('"')
        self.i += 1
        self._in_string, self._in_key = True, key

    def _close(self, out: list[str], c: str) -> None:
        out.append(c)
        self.i += 1
        self._stack.pop()
        self._expect = _COMMA_OR_CLOSE
        if not self._stack:
            self.done, self.end = True, self.i

    def _scalar(self, buf: str, i: int, limit: int, final: bool) -> str:
        """A number or a literal at `i`, rewritten; self.i moves past it."""
        rest = buf[i:min(limit, i + 10)]
        for lit in _LITERALS:
            if rest.startswith(lit):
                self.i = i + len(lit)
                return lit  # (json.dumps writes nan and the infinities as these words)
            if lit.startswith(rest) and not final:
                raise _Wait
        j = _NUMBER_RUN.match(buf, i, limit).end()
        if j == limit and not final:
            raise _Wait  # more digits may follow
        m = _NUMBER.match(buf[i:j])
        if m is None:
            raise _Invalid
        try:
            text = _float_text(float(buf[i:j])) if m.group(1) or m.group(2) \
                else int.__repr__(int(buf[i:j]))
        except ValueError:  # an integer past Python's digit limit: json.loads refuses it too
            raise _Invalid from None
        self.i = j
        return text

    def _escape(self, buf: str, i: int, limit: int) -> tuple[str, int]:
        """The escape at `i` (a backslash) rewritten, and the index after it."""
        if i + 1 >= limit:
            raise _Wait
        e = buf[i + 1]
        if e in _SIMPLE_ESCAPES:
            return _SIMPLE_ESCAPES[e], i + 2
        if e != "u":
            raise _Invalid
        code = self._hex4(buf, i + 2, limit)
        j = i + 6
        if 0xD800 <= code <= 0xDBFF:
            # json.loads joins a high surrogate with a low one that follows as an escape; any
            # other \\uXXXX after it is an escape of its own (but must still be four hex digits)
            nxt = buf[j:min(limit, j + 2)]
            if len(nxt) < 2 and "\\u".startswith(nxt):
                raise _Wait
            if nxt == "\\u":
                low = self._hex4(buf, j + 2, limit)
                if 0xDC00 <= low <= 0xDFFF:
                    code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                    j += 6
        return encode_basestring(chr(code))[1:-1], j

    @staticmethod
    def _hex4(buf: str, i: int, limit: int) -> int:
        digits = buf[i:min(limit, i + 4)]
        if _HEX4.match(digits):
            return int(digits, 16)
        if len(digits) < 4 and all(d in "0123456789abcdefABCDEF" for d in digits):
            raise _Wait
        raise _Invalid


def rewrite(text: str, start: int = 0) -> JsonArgsWriter:
    """The writer after reading all of `text` from `start` (the whole-text path)."""
    w = JsonArgsWriter(start)
    w.write(text, len(text), final=True)
    return w
