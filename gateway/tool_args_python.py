"""A pythonic tool call's arguments as they stream (`--tool-call-parser pythonic`, Llama 3.2's and
Llama 4's `[write_file(path="a.py", content="...")]`): the keyword arguments after a call's `(`
written, piece by piece, as the JSON object the whole call's arguments string is
(`json.dumps({name: ast.literal_eval(value), ...}, ensure_ascii=False)`,
gateway/tool_parser_pythonic.py).

Why a tokenizer of our own rather than `ast` on every piece: `ast` reads only a complete
expression, and a file's content inside a call is the long part. A value that is a string literal
(single, double or triple quotes; `u` and `r` prefixes; escapes of every kind; implicit
concatenation `'a' 'b'`) is decoded as Python's tokenizer decodes it and goes out as it is written,
escaped as json.dumps escapes it; only what may still change waits: a backslash and its escape, a
`\\r` (Python reads `\\r\\n` and a lone `\\r` in a source as `\\n`), quotes that may be a triple
quote's end, and the JSON string's closing `"` until the value is seen to end (`,` or `)`, not
another string literal). Any other value (numbers, True / False / None, lists, tuples, dicts, and
a string in parentheses) is read whole at its end, with `ast.literal_eval` as the whole-call parser
reads it, and goes out in one piece. Bytes and f-strings are no JSON value (the whole call is no
call): they are read whole and refused.

Python 3.11's rules: an unknown escape (`\\d`) keeps its backslash, `\\N{...}` names are looked up
by Python itself; a call that repeats a keyword is read by `ast` (the compiler refuses it, `ast`
does not), the whole call keeping the last value in the first one's place: this writer cannot take
the first back, so its string has both (json.loads of it gives the same object). This module
imports no parser (gateway/tool_parser_pythonic.py imports it).
"""
from __future__ import annotations

import ast
import json
import keyword
import re
import unicodedata
from json.encoder import encode_basestring
from typing import ClassVar

MAX_DEPTH = 64  # bracket nesting given to `ast` (the whole-call parser's bound; deeper is refused)

_SPACE = re.compile(r"[ \t\f\n\r]*")  # what Python's tokenizer skips between tokens in brackets
_LINE_END = re.compile(r"[\n\r]")
# a name as the tokenizer reads one (ASCII letters, digits, _, and any non-ASCII character; a
# non-ASCII name must then be an identifier, and is NFKC-normalized)
NAME = re.compile(r"[A-Za-z0-9_\x80-\U0010ffff]+")
_RUNS = {q: re.compile(f"[^{q}\\\\\\n\\r\\x00]*") for q in "'\""}  # string text taken as it is
_OUTSIDE = re.compile(r"[^'\"#()\[\]{},\\]*")  # in a value read whole: nothing that counts
_CHAR_NAME = re.compile(r"[A-Za-z0-9 \-]{1,128}\Z")
_SIMPLE = {"\\": "\\", "'": "'", '"': '"', "a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r",
           "t": "\t", "v": "\v"}
_SIMPLE_JSON = {e: encode_basestring(v)[1:-1] for e, v in _SIMPLE.items()}
_HEX = frozenset("0123456789abcdefABCDEF")
_OCTAL = frozenset("01234567")
_HEX_LEN = {"x": 2, "u": 4, "U": 8}

_KEY, _EQUALS, _VALUE, _STRING, _AFTER_STRING, _WHOLE = range(6)


class _Invalid(Exception):
    """Python's parser would refuse the text here (or literal_eval / json.dumps its value)."""


def _quote_at(buf: str, i: int, limit: int) -> str | None:
    """The string quote that opens at `i` (`'`, `"`, or three of one); None while it may still
    be a triple quote's start."""
    q = buf[i]
    if buf.startswith(q * 3, i, limit):
        return q * 3
    if limit - i < 3 and buf[i:limit] == q * (limit - i):
        return None
    return q


def identifier(token: str) -> str | None:
    """A name token as Python's parser reads it (NFKC when non-ASCII); None if it is no
    identifier or a keyword."""
    if not token.isidentifier() or keyword.iskeyword(token):
        return None
    return token if token.isascii() else unicodedata.normalize("NFKC", token)


class PythonArgsWriter:
    """The keyword arguments that start at `start` of a growing buffer (just after the call's
    `(`), in the interface of gateway.tool_args_json.JsonArgsWriter: `write(buf, limit, final)`
    gives the rewrite of what it could complete; `done` once the call's `)` is read (`end`: the
    index after it); `invalid` where Python would refuse the text; `text`: all written so far."""

    __slots__ = ("_comment", "_depth", "_first", "_key", "_pieces", "_quote", "_raw", "_sent",
                 "_start", "_state", "_vquote", "done", "end", "i", "invalid")

    def __init__(self, start: int) -> None:
        self.i = start
        self.done = self.invalid = False
        self.end = -1
        self._state = _KEY
        self._first = True
        self._key = ""
        self._comment = False  # inside a comment between tokens, or in a value read whole
        self._quote, self._raw = "", False  # the open string literal
        self._start = self._depth = 0  # a value read whole: where it starts, its nesting
        self._vquote = ""  # a string inside a value read whole
        self._pieces: list[str] = ["{"]
        self._sent = 0

    @property
    def text(self) -> str:
        return "".join(self._pieces)

    def write(self, buf: str, limit: int, final: bool = False) -> str:
        if not (self.done or self.invalid):
            try:
                while self.i < limit and not self.done and self._STEPS[self._state](
                        self, buf, limit):
                    pass
            except _Invalid:
                self.invalid = True
            if final and not self.done:
                self.invalid = True  # (the call's `)` never came)
        piece = "".join(self._pieces[self._sent:])
        self._sent = len(self._pieces)
        return piece

    # each step reads from self.i; True: it moved on to another state, False: wait for more text
    def _space(self, buf: str, limit: int) -> bool:
        """Blanks, comments and line continuations skipped: True when a token follows."""
        i = self.i
        while True:
            if self._comment:
                m = _LINE_END.search(buf, i, limit)
                if m is None:
                    self.i = limit
                    return False
                i, self._comment = m.start(), False
            i = _SPACE.match(buf, i, limit).end()
            if i < limit and buf[i] == "#":
                self._comment, i = True, i + 1
                continue
            if i < limit and buf[i] == "\\":  # a line continuation
                if i + 1 >= limit:
                    break
                if buf[i + 1] not in "\n\r":
                    raise _Invalid
                i += 2
                continue
            break
        self.i = i
        return i < limit and not buf.startswith("\\", i)

    def _read_key(self, buf: str, limit: int) -> bool:
        if not self._space(buf, limit):
            return False
        i = self.i
        if buf[i] == ")":
            return self._close(i)
        m = NAME.match(buf, i, limit)
        if m is None:
            raise _Invalid  # (a positional or ** argument, or no argument)
        if m.end() >= limit:
            return False  # (the name may go on)
        key = identifier(m.group())
        if key is None:
            raise _Invalid
        self._key, self.i, self._state = key, m.end(), _EQUALS
        return True

    def _read_equals(self, buf: str, limit: int) -> bool:
        if not self._space(buf, limit):
            return False
        if buf[self.i] != "=":
            raise _Invalid
        self._pieces.append(("" if self._first else ", ") + encode_basestring(self._key) + ": ")
        self._first = False
        self.i += 1
        self._state = _VALUE
        return True

    def _read_value(self, buf: str, limit: int) -> bool:
        if not self._space(buf, limit):
            return False
        opened = self._open_string(buf, limit)
        if opened is None:
            return False
        if opened:
            self._pieces.append('"')
        else:
            self._start, self._depth, self._vquote, self._state = self.i, 0, "", _WHOLE
        return True

    def _open_string(self, buf: str, limit: int) -> bool | None:
        """A string literal this writer streams opens at self.i (`u`, `r` or no prefix): True,
        and self.i is past its quote; False when it is not one; None: wait."""
        i = self.i
        c = buf[i]
        j = i if c in "'\"" else i + 1 if c in "rRuU" else -1
        if j < 0:
            return False
        if j >= limit:
            return None
        if buf[j] not in "'\"":
            return False
        quote = _quote_at(buf, j, limit)
        if quote is None:
            return None
        self._quote, self._raw = quote, c in "rR"
        self.i, self._state = j + len(quote), _STRING
        return True

    def _read_string(self, buf: str, limit: int) -> bool:
        quote = self._quote
        q, triple = quote[0], len(quote) == 3
        run, out = _RUNS[q], self._pieces
        i = self.i
        try:
            while i < limit:
                j = run.match(buf, i, limit).end()
                if j > i:
                    out.append(encode_basestring(buf[i:j])[1:-1])
                    i = j
                    if i >= limit:
                        break
                c = buf[i]
                if c == q:
                    if not triple:
                        i += 1
                        self._state = _AFTER_STRING
                        return True
                    if buf.startswith(quote, i, limit):
                        i += 3
                        self._state = _AFTER_STRING
                        return True
                    if limit - i < 3 and buf[i:limit] == q * (limit - i):
                        break  # (may be the end)
                    out.append(encode_basestring(q)[1:-1])
                    i += 1
                elif c == "\\" and not self._raw and i + 1 < limit and buf[i + 1] in _SIMPLE_JSON:
                    out.append(_SIMPLE_JSON[buf[i + 1]])  # (the common escapes, inline: \n)
                    i += 2
                elif c == "\\":
                    got = self._escape(buf, i, limit)
                    if got is None:
                        break
                    text, i = got
                    if text:
                        out.append(encode_basestring(text)[1:-1])
                elif c == "\x00" or not triple:
                    raise _Invalid  # (a NUL; a line end in a one-line string: unterminated)
                elif c == "\n":
                    out.append("\\n")
                    i += 1
                else:  # \r: \r\n and a lone \r are both read as \n
                    if i + 1 >= limit:
                        break
                    out.append("\\n")
                    i += 2 if buf[i + 1] == "\n" else 1
            return False
        finally:
            self.i = i

    def _escape(self, buf: str, i: int, limit: int) -> tuple[str, int] | None:
        """The escape at `i` (a backslash) decoded, and the index after it; None: wait."""
        if i + 1 >= limit:
            return None
        e = buf[i + 1]
        if e == "\r":  # a line continuation (\r\n or \r)
            if i + 2 >= limit:
                return None
            j = i + 3 if buf[i + 2] == "\n" else i + 2
            return ("\\\n" if self._raw else ""), j
        if e == "\x00":
            raise _Invalid
        if self._raw:  # the backslash and the character after it, as written
            return "\\" + e, i + 2
        if e in _SIMPLE:
            return _SIMPLE[e], i + 2
        if e == "\n":
            return "", i + 2
        if e in _OCTAL:  # one to three digits
            j = i + 2
            while j < min(limit, i + 4) and buf[j] in _OCTAL:
                j += 1
            if j < i + 4 and j >= limit:
                return None
            return chr(int(buf[i + 1:j], 8)), j
        if e in _HEX_LEN:
            n = _HEX_LEN[e]
            digits = buf[i + 2:min(limit, i + 2 + n)]
            if not all(d in _HEX for d in digits):
                raise _Invalid
            if len(digits) < n:
                return None
            code = int(digits, 16)
            if code > 0x10FFFF:
                raise _Invalid
            return chr(code), i + 2 + n
        if e == "N":  # \N{NAME}: looked up by Python's own string literal reader
            if i + 2 >= limit:
                return None
            if buf[i + 2] != "{":
                raise _Invalid
            k = buf.find("}", i + 3, min(limit, i + 3 + 129))
            name = buf[i + 3:k if k >= 0 else min(limit, i + 3 + 129)]
            if k < 0:
                if len(name) > 128 or name and not _CHAR_NAME.match(name):
                    raise _Invalid
                return None
            if not _CHAR_NAME.match(name):
                raise _Invalid
            try:
                return ast.literal_eval('"\\N{' + name + '}"'), k + 1
            except (SyntaxError, ValueError):
                raise _Invalid from None
        return "\\" + e, i + 2  # an unknown escape keeps its backslash (Python 3.11 warns)

    def _read_after_string(self, buf: str, limit: int) -> bool:
        """A string literal ended: the value ends (`,` or `)`) or another literal follows
        (implicit concatenation: the same JSON string goes on)."""
        if not self._space(buf, limit):
            return False
        c = buf[self.i]
        if c in ",)":
            self._pieces.append('"')
            return self._value_end(c)
        opened = self._open_string(buf, limit)
        if opened is None:
            return False
        if not opened:
            raise _Invalid  # (`'a'.upper()`, `'a' + 'b'`, `'a' b'x'`, ...: no literal string)
        return True

    def _read_whole(self, buf: str, limit: int) -> bool:
        """A value that is not a plain string literal: read to its end (a `,` or `)` outside
        brackets, strings and comments), then evaluated whole."""
        i = self.i
        while i < limit:
            if self._comment:
                m = _LINE_END.search(buf, i, limit)
                if m is None:
                    i = limit
                    break
                i, self._comment = m.start(), False
            if self._vquote:
                quote = self._vquote
                i = _RUNS[quote[0]].match(buf, i, limit).end()
                if i >= limit:
                    break
                c = buf[i]
                if c == "\\":  # (the escaped character, or a line continuation)
                    if i + 1 >= limit or buf[i + 1] == "\r" and i + 2 >= limit:
                        break
                    i += 3 if buf[i + 1] == "\r" and buf[i + 2] == "\n" else 2
                elif c == quote[0]:
                    if len(quote) == 1 or buf.startswith(quote, i, limit):
                        i += len(quote)
                        self._vquote = ""
                    elif limit - i < 3 and buf[i:limit] == c * (limit - i):
                        break
                    else:
                        i += 1
                elif c == "\x00" or len(quote) == 1:
                    raise _Invalid
                else:
                    i += 1
                continue
            i = _OUTSIDE.match(buf, i, limit).end()
            if i >= limit:
                break
            c = buf[i]
            if c in "'\"":
                quote = _quote_at(buf, i, limit)
                if quote is None:
                    break
                self._vquote = quote
                i += len(quote)
            elif c == "#":
                self._comment, i = True, i + 1
            elif c == "\\":
                if i + 1 >= limit:
                    break
                if buf[i + 1] not in "\n\r":
                    raise _Invalid
                i += 2
            elif c in "([{":
                self._depth += 1
                if self._depth > MAX_DEPTH:
                    raise _Invalid
                i += 1
            elif self._depth:  # (a bracket's `,` or closer)
                self._depth -= c != ","
                i += 1
            elif c in ",)":  # the value's end
                self._pieces.append(self._evaluate(buf[self._start:i]))
                self.i = i
                return self._value_end(c)
            else:
                raise _Invalid  # (a `]` or `}` that closes nothing)
        self.i = i
        return False

    @staticmethod
    def _evaluate(text: str) -> str:
        """A value's text (between `=` and its `,` or `)`) as the whole-call parser reads it:
        ast.literal_eval, then json.dumps. (Parsed as the one element of a tuple, so that an
        empty text is refused and a comment at its end does not hide the closer.)"""
        try:
            node = ast.parse("(" + text + "\n,)", mode="eval").body
            if not isinstance(node, ast.Tuple) or len(node.elts) != 1:
                raise _Invalid
            return json.dumps(ast.literal_eval(node.elts[0]), ensure_ascii=False)
        except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
            raise _Invalid from None

    def _value_end(self, c: str) -> bool:
        """The value ended at self.i with `c`: the next keyword, or the call's end."""
        if c == ")":
            return self._close(self.i)
        self.i += 1
        self._state = _KEY
        return True

    def _close(self, i: int) -> bool:
        self._pieces.append("}")
        self.i = self.end = i + 1
        self.done = True
        return False

    _STEPS: ClassVar[dict] = {_KEY: _read_key, _EQUALS: _read_equals, _VALUE: _read_value,
              _STRING: _read_string, _AFTER_STRING: _read_after_string, _WHOLE: _read_whole}
