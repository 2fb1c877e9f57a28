"""The tool-call parser classes and what they share (`ToolCall`, call ids, the ordered feed).
Parsers by name, `make_parser` and the stream shaping are in `gateway.tool_parser`; parsers that
build on these classes (`gateway.tool_parser_pythonic`, `_tagged`, `_xml`, `_harmony`) import them
from here, so that the registry can import them in turn without a loop.

Every parser reads text as it streams: `feed_items(text)` gives, in the output's order, the plain
content (str) and the calls (ToolCall) that this text completed; `finish_items()` gives the rest
at the end of the output. `feed` / `finish` give the same as (content, calls). What is surely no
call streams at once; only what could still be the start of a call is held back. A block that
is not a call of a known tool, or that cannot be read, is given back as content as the model
wrote it: the client sees the model's text rather than a call that does not exist (never an
error).

Arguments in pieces: a parser whose format has the model write the arguments as a JSON object
(`streams_arguments`) gives a call's start (`CallStart`: id and name) as soon as the name is
complete and names a listed tool and the arguments object has begun, then its arguments as they
are written (`ArgsPiece`, gateway/tool_args_json.py's rewrite), then the `ToolCall` (`streamed`)
when its block ends. The block is still read whole at its end as before: if it turns out to be no
call after all (JSON that breaks off or goes wrong, text after the object that the format does not
allow), a `BrokenCall` carries the block's text. A whole-output reader (`feed` / `finish`, the
non-streamed reply) sees only calls and content (`whole_items`): the BrokenCall's text is content
there, as it always was. A stream cannot take back a call it began: the stream shaper ends it with
the pieces sent (gateway/tool_parser.py says what the client sees). The arguments string of such a
call is the rewrite in both paths, so the pieces add up to exactly the whole reply's string."""
from __future__ import annotations

import json
import os
import re
import string
from dataclasses import dataclass

from gateway.tool_args_json import JsonArgsWriter
from gateway.tools import CALL_CLOSE, CALL_OPEN, ToolConfig

OPEN_TAG, CLOSE_TAG = CALL_OPEN.rstrip("\n"), CALL_CLOSE.lstrip("\n")
_JSON = json.JSONDecoder()
# what reading JSON text raises when it cannot: bad text, or text nested past Python's stack
# (a block of the model's that is no call, not an error)
UNREADABLE = (ValueError, RecursionError)


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: dict
    # the arguments string the client gets: the streamed rewrite when the call was streamed in
    # pieces (`streamed`), else json.dumps of `arguments` (the same text but for repeated keys)
    arguments_json: str | None = None
    streamed: bool = False

    @property
    def arguments_text(self) -> str:
        if self.arguments_json is not None:
            return self.arguments_json
        return json.dumps(self.arguments, ensure_ascii=False)

    def openai(self, index: int | None = None) -> dict:
        call = {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments_text}}
        return call if index is None else {"index": index, **call}


@dataclass(frozen=True, slots=True)
class CallStart:
    """A call begins: its arguments follow as ArgsPiece items, then its ToolCall or a
    BrokenCall."""
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ArgsPiece:
    text: str


@dataclass(frozen=True, slots=True)
class BrokenCall:
    """The started call's block is no call: `text` is the block as the model wrote it."""
    text: str


Item = str | ToolCall | CallStart | ArgsPiece | BrokenCall


def new_call_id(prefix: str = "call_") -> str:
    return prefix + os.urandom(12).hex()


def _partial_tag(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


_SPACE = re.compile(r"\s*")


class JsonEnd:
    """Where the JSON object or array that starts at `start` of a growing buffer ends, found
    incrementally: each character is looked at once however many pieces the buffer grows by
    (strings and their escapes skipped), so that a parser tries to decode it once, when it can
    be complete, not once per streamed piece (which made a 120 KB call cost seconds)."""

    __slots__ = ("depth", "end", "escape", "i", "in_string", "start")
    _SKIP = re.compile(r'[^"\[\]{}]*')  # nothing that changes the state
    _IN_STRING = re.compile(r'[^"\\]*')

    def __init__(self) -> None:
        self.reset()

    def reset(self, start: int = -1) -> None:
        self.start, self.i, self.depth, self.in_string, self.escape = start, start, 0, False, False
        self.end = -1

    def find(self, buf: str, start: int) -> int:
        """The index just past the value's end; -1 while it is open."""
        if start != self.start:
            self.reset(start)
        if self.end >= 0:
            return self.end
        i, n = self.i, len(buf)
        while i < n:
            if self.escape:
                self.escape, i = False, i + 1
            elif self.in_string:
                i = self._IN_STRING.match(buf, i).end()
                if i < n:
                    self.escape, self.in_string = buf[i] == "\\", buf[i] != '"'
                    i += 1
            else:
                i = self._SKIP.match(buf, i).end()
                if i < n:
                    c = buf[i]
                    i += 1
                    if c == '"':
                        self.in_string = True
                    elif c in "[{":
                        self.depth += 1
                    else:
                        self.depth -= 1
                        if self.depth <= 0:
                            self.i = self.end = i
                            return i
        self.i = i
        return -1


def whole_items(items: list[Item]) -> list[Item]:
    """Content and calls only, as a reader of the whole output sees them: a call's start and
    pieces are left out (its ToolCall follows), a BrokenCall's block is content."""
    out: list[Item] = []
    for item in items:
        if isinstance(item, BrokenCall):
            item = item.text
        if isinstance(item, str) and out and isinstance(out[-1], str):
            out[-1] += item
        elif isinstance(item, (str, ToolCall)):
            out.append(item)
    return out


def split_items(items: list[Item]) -> tuple[str, list[ToolCall]]:
    items = whole_items(items)
    return ("".join(i for i in items if isinstance(i, str)),
            [i for i in items if isinstance(i, ToolCall)])


class ArgsStream:
    """The streamed calls of one block (or reply): each call's start and its arguments' writer,
    in order. `headless`: the next call's head was read and it does not stream (the block's
    calls from there on come whole)."""

    __slots__ = ("headless", "started")

    def __init__(self) -> None:
        self.started: list[tuple[CallStart, JsonArgsWriter]] = []
        self.headless = False

    def start(self, items: list[Item], call_id: str, name: str, offset: int,
              writer=None) -> None:
        """A call begins; its arguments object starts at `offset` of the buffer (`writer`:
        one for a format whose arguments are not JSON, in JsonArgsWriter's interface)."""
        call = CallStart(call_id, name)
        self.started.append((call, writer or JsonArgsWriter(offset)))
        items.append(call)

    @property
    def writer(self) -> JsonArgsWriter | None:
        """The last started call's writer (None before the first)."""
        return self.started[-1][1] if self.started else None

    def write(self, items: list[Item], buf: str, limit: int, final: bool) -> None:
        if self.started:
            items.append(ArgsPiece(self.started[-1][1].write(buf, limit, final)))

    def end(self, calls: list[ToolCall] | None) -> list[ToolCall] | None:
        """The block's calls now that it ended (`calls`: as the block reads whole): the started
        ones as streamed (their arguments the rewrite), the rest as read; None when the block
        does not read as calls that begin with the started ones, their objects closed."""
        started, self.started, self.headless = self.started, [], False
        if not started:
            return calls
        if calls is None or len(calls) < len(started) or any(
                not w.done or c.name != s.name for (s, w), c in zip(started, calls)):
            return None
        try:
            return [ToolCall(s.id, s.name, json.loads(w.text), w.text, streamed=True)
                    for s, w in started] + calls[len(started):]
        except UNREADABLE:
            return None


class ToolCallParser:
    """The base: `_step(final)` reads `self._pending` and gives items in order; what it leaves
    in `_pending` waits for more text. `keeps_special_tokens`: the format's markers are special
    tokens, so requests parsed with it are detokenized with special tokens kept."""

    keeps_special_tokens = False
    streams_arguments = False  # a call's arguments come out in pieces (CallStart, ArgsPiece)

    def __init__(self, cfg: ToolConfig, id_prefix: str = "call_") -> None:
        self.cfg = cfg
        self.names = cfg.names()
        self.id_prefix = id_prefix
        self.calls: list[ToolCall] = []  # every call given out so far
        self._pending = ""
        self._inside = False

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        """(content to show now, calls completed by this text)."""
        return split_items(self.feed_items(text))

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The end of the output: whatever was held is content or calls now."""
        return split_items(self.finish_items())

    def feed_items(self, text: str) -> list[Item]:
        self._pending += text
        return self._record(self._step(final=False))

    def finish_items(self) -> list[Item]:
        return self._record(self._step(final=True))

    def _step(self, final: bool) -> list[Item]:
        raise NotImplementedError

    def _record(self, items: list[Item]) -> list[Item]:
        out: list[Item] = []
        for item in items:
            if isinstance(item, ToolCall):
                self.calls.append(item)
            elif isinstance(item, ArgsPiece) and not item.text or item == "":
                continue
            elif isinstance(item, str) and out and isinstance(out[-1], str):
                item = out.pop() + item
            out.append(item)
        return out

    def make_call(self, name, arguments, call_id: str | None = None) -> ToolCall | None:
        """A call of a listed tool whose arguments are an object (or JSON text of one); None
        otherwise."""
        if not isinstance(name, str) or name not in self.names:
            return None
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except UNREADABLE:
                return None
        if not isinstance(arguments, dict):
            return None
        return ToolCall(call_id or new_call_id(self.id_prefix), name, arguments)

    def json_call(self, body: str) -> ToolCall | None:
        """{"name": ..., "arguments" | "parameters": {...}} as JSON text -> the call."""
        try:
            obj = json.loads(body)
        except UNREADABLE:
            return None
        if not isinstance(obj, dict):
            return None
        return self.make_call(obj.get("name"), obj.get("arguments", obj.get("parameters", {})))


def _earliest(text: str, tags) -> tuple[int, str]:
    """(where the first of `tags` starts in `text`, which), or (-1, ""); a search never reads
    past a tag already found (a held block starts with its tag: that costs nothing per piece)."""
    for tag in tags:
        if text.startswith(tag):
            return 0, tag
    best, found = -1, ""
    for tag in tags:
        k = text.find(tag, 0, len(text) if best < 0 else best + len(tag) - 1)
        if k >= 0 and (best < 0 or k < best):
            best, found = k, tag
    return best, found


class TaggedToolCallParser(ToolCallParser):
    """Calls in marked blocks between the content: `blocks` lists (begin, end) of one call
    (end None: the subclass's `_match_block` finds where it ends); `sections`, when set, are the
    (begin, end) pairs that may hold all the calls of a reply (DeepSeek's, Kimi's), and blocks
    count only inside one. `_body(begin, body, closed)` reads one block's text (`closed`: its end
    marker was seen; False only at the end of the output) into its calls, or None when it is no
    call. A section that holds no call is given back as written; whitespace between calls is
    dropped.

    Arguments in pieces (`streams_arguments`, blocks with an end marker): `_stream_head(body)`
    reads the start of a block's text: (name, where the arguments object starts in it, the call's
    id or None) once the name is complete and listed and the object has begun; None while the
    text may still become that; False when it cannot (the block is then read whole, as before).
    Its decision on a text must be the one it gives on any longer text (so that a stream and the
    whole reply decide alike), and it must decide within a short head, as it reads the head again
    on every piece until it does. The block's text is read only up to where it is surely the
    block's (not a partial end marker)."""

    sections: tuple[tuple[str, str], ...] = ()
    blocks: tuple[tuple[str, str | None], ...] = ()

    def __init__(self, cfg: ToolConfig, id_prefix: str = "call_") -> None:
        super().__init__(cfg, id_prefix)
        self._in_section = False
        self._section_end = ""
        self._held = ""  # the section's text before its first call: given back if none comes
        self._found = 0
        self._searched = 0  # the open block's end marker is not before this (in _pending)
        self._json_end = JsonEnd()  # (for a block that a JSON value ends)
        self._args = ArgsStream()  # the open block's streamed calls

    def _stream_head(self, body: str) -> tuple[str, int, str | None] | bool | None:
        return False

    def _args_writer(self, begin: str, name: str, start: int):
        """The writer of a call's arguments that start at `start` (None: they are JSON)."""
        return

    def _body(self, begin: str, body: str, closed: bool) -> list[ToolCall] | None:
        raise NotImplementedError

    def _end_marker(self, buf: str, begin: str, end: str, final: bool) -> int:
        """Where the open block's end marker `end` starts in `buf` (which starts with `begin`),
        or -1 while none is seen."""
        return buf.find(end, max(len(begin), self._searched))

    def _match_block(self, buf: str, begin: str, final: bool
                     ) -> tuple[int, list[ToolCall] | None] | None:
        """`buf` starts with `begin`: (characters the block takes, its calls or None), or None
        while it is incomplete (never when `final`)."""
        end = dict(self.blocks)[begin]
        j = self._end_marker(buf, begin, end, final) if end else -1
        if j < 0:
            if not final:
                self._searched = max(0, len(buf) - len(end) + 1) if end else 0
                return None
            return len(buf), self._body(begin, buf[len(begin):], False)
        return j + len(end), self._body(begin, buf[len(begin):j], True)

    def _step(self, final: bool) -> list[Item]:
        items: list[Item] = []
        while self._pending:
            more = self._section_step(items, final) if self._in_section \
                else self._top_step(items, final)
            if not more:
                break
        if final:
            items.append(self._held + self._pending)
            self._pending = self._held = ""
            self._in_section = False
        return items

    def _top_step(self, items: list[Item], final: bool) -> bool:
        buf = self._pending
        openers = tuple(b for b, _ in self.sections or self.blocks)
        k, tag = _earliest(buf, openers)
        if k < 0:
            keep = 0 if final else max(_partial_tag(buf, t) for t in openers)
            items.append(buf[:len(buf) - keep])
            self._pending = buf[len(buf) - keep:]
            return False
        items.append(buf[:k])
        if self.sections:
            self._in_section, self._held, self._found = True, tag, 0
            self._section_end = dict(self.sections)[tag]
            self._pending = buf[k + len(tag):]
            return True
        self._pending = buf[k:]
        return self._block_step(items, tag, final)

    def _section_step(self, items: list[Item], final: bool) -> bool:
        buf = self._pending
        cut = _SPACE.match(buf).end()
        s, ws = buf[cut:], buf[:cut]  # (no copy of a held block, which starts at 0)
        end = self._section_end
        if s.startswith(end):
            if self._found == 0:
                items.append(self._held + ws + end)
            self._in_section, self._held = False, ""
            self._pending = s[len(end):]
            return True
        for begin, _ in self.blocks:
            if s.startswith(begin):
                if self._found == 0:
                    self._held += ws  # (between calls it is dropped)
                self._pending = s
                return self._block_step(items, begin, final)
        if not s or any(t.startswith(s) for t in (end, *(b for b, _ in self.blocks))):
            return False  # a marker's start, or nothing yet: wait (or the end gives it back)
        # text in the section that is none of its markers: not this format after all
        items.append(self._held + ws if self._found == 0 else ws)
        self._in_section, self._held = False, ""
        self._pending = s
        return True

    def _block_step(self, items: list[Item], begin: str, final: bool) -> bool:
        if self.streams_arguments:  # (before _body reads the block: Kimi counts its calls)
            self._stream_block(items, begin, final)
        got = self._match_block(self._pending, begin, final)
        if got is None:
            return False
        self._searched = 0
        self._json_end.reset()
        used, calls = got
        text, self._pending = self._pending[:used], self._pending[used:]
        if self._args.started:
            calls = self._args.end(calls)
            if calls is None:
                items.append(BrokenCall(self._held + text))
                self._held = ""
                return True
        self._args.headless = False
        if calls:
            items.extend(calls)
            self._held = ""
            self._found += len(calls)
        else:
            items.append(self._held + text)
            self._held = ""
        return True

    def _stream_block(self, items: list[Item], begin: str, final: bool) -> None:
        """The open block's call start and argument pieces so far. Its text is read up to its
        end marker (found as _match_block finds it), or while open, up to a partial end marker,
        which may be the block's end."""
        args = self._args
        if args.headless:
            return
        buf, end = self._pending, dict(self.blocks)[begin]
        limit = self._end_marker(buf, begin, end, final)
        ended = limit >= 0 or final
        if limit < 0:
            limit = len(buf) if final else max(len(begin), len(buf) - _partial_tag(buf, end))
        if not args.started:
            head = self._stream_head(buf[len(begin):limit])
            if not head:
                args.headless = head is False or ended
                return
            name, offset, call_id = head
            start = len(begin) + offset
            args.start(items, call_id or new_call_id(self.id_prefix), name, start,
                       self._args_writer(begin, name, start))
        args.write(items, buf, limit, ended)


_WS = re.compile(r"[ \t\n\r]*")  # JSON's whitespace
# how far into a block a head (a name, its separator) is looked for before the block is read
# whole: a name is at most 64 characters (gateway.tools.NAME_RE), the rest of a head a few words
HEAD_WINDOW = 160
_HEAD_NAME = re.compile(r'"([A-Za-z0-9_.\-]{1,64})"')
_HEAD_NAME_OPEN = re.compile(r'"[A-Za-z0-9_.\-]{0,64}\Z')


def head_tokens(text: str, pos: int, *tokens: str | tuple[str, ...]) -> int | bool | None:
    """`text` from `pos` read as `tokens` in turn (a string, or a tuple of alternatives), with
    JSON whitespace before each: the index after the last; None when the text ends first (it may
    still go on so); False when it goes otherwise."""
    for token in tokens:
        pos = _WS.match(text, pos).end()
        rest = text[pos:pos + 16]
        choices = token if isinstance(token, tuple) else (token,)
        hit = next((t for t in choices if rest.startswith(t)), None)
        if hit is None:
            return None if any(t.startswith(rest) for t in choices) else False
        pos += len(hit)
    return pos


def json_call_head(body: str, names: set[str]) -> tuple[str, int, None] | bool | None:
    """The head `{"name": "NAME", "arguments" | "parameters": {` of a JSON call object (the order
    the generic format and the forced-call grammar write): (NAME, where its object starts, None),
    None while `body` may still become that, False otherwise or when NAME is not listed. A name
    written with escapes, or the keys in another order, do not stream: the call comes whole."""
    pos = head_tokens(body, 0, "{", '"name"', ":")
    if not pos:
        return pos
    pos = _WS.match(body, pos).end()
    m = _HEAD_NAME.match(body, pos)
    if m is None:
        return None if pos == len(body) or _HEAD_NAME_OPEN.match(body, pos) else False
    if m.group(1) not in names:
        return False
    end = head_tokens(body, m.end(), ",", ('"arguments"', '"parameters"'), ":", "{")
    return end if not end else (m.group(1), end - 1, None)


class HermesToolCallParser(TaggedToolCallParser):
    """`--tool-call-parser hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
    blocks (Hermes', Qwen 2.5's / Qwen 3's, and the generic format of gateway.tools). An
    unclosed block at the end of the output is a call if its JSON is complete."""

    blocks = ((OPEN_TAG, CLOSE_TAG),)
    streams_arguments = True

    def _stream_head(self, body: str):
        return json_call_head(body, self.names)

    def _end_marker(self, buf: str, begin: str, end: str, final: bool) -> int:
        """A block whose text starts with a JSON object ends at the first end marker after
        that object: `</tool_call>` inside one of its strings (a file's content that mentions
        the format) is the argument's text, not the block's end -- a forced tool_choice's
        grammar allows it there. While the object is open no marker counts; if the output ends
        with it still open, the first marker does (as a plain search finds it)."""
        pos = _SPACE.match(buf, len(begin)).end()
        if not buf.startswith("{", pos):
            return super()._end_marker(buf, begin, end, final)
        e = self._json_end.find(buf, pos)
        if e >= 0:
            return buf.find(end, max(e, self._searched))
        return buf.find(end, len(begin)) if final else -1

    def _body(self, begin: str, body: str, closed: bool) -> list[ToolCall] | None:
        call = self.json_call(body)
        return None if call is None else [call]


class WholeReplyToolCallParser(ToolCallParser):
    """A reply that is calls as a whole, or content: while the reply could still be calls
    (`_looks_like_calls` of its start is True) it is held back; as soon as it cannot (False)
    it streams as content; None: undecided yet. At the end `_parse` reads the held reply into
    its calls, or None: then it is content as written."""

    def __init__(self, cfg: ToolConfig, id_prefix: str = "call_") -> None:
        super().__init__(cfg, id_prefix)
        self._mode: str | None = None  # None: undecided, "calls": held, "text": streamed

    def _looks_like_calls(self, head: str) -> bool | None:
        raise NotImplementedError

    def _parse(self, text: str) -> list[ToolCall] | None:
        raise NotImplementedError

    def _step(self, final: bool) -> list[Item]:
        head = self._pending.lstrip()
        if self._mode is None and head:
            looks = self._looks_like_calls(head)
            if looks is not None:
                self._mode = "calls" if looks else "text"
        if self._mode == "text" or final and self._mode is None:
            out, self._pending = self._pending, ""
            return [out]
        if not final:
            return self._progress(final=False)
        items = self._progress(final=True)
        rest, self._pending = self._pending, ""
        return items + self._end(rest, self._parse(rest))

    def _progress(self, final: bool) -> list[Item]:
        """What of the held reply streams before its end (a call's start and pieces)."""
        return []

    def _end(self, rest: str, calls: list[ToolCall] | None) -> list[Item]:
        return [rest] if not calls else list(calls)


class JsonToolCallParser(WholeReplyToolCallParser):
    """`--tool-call-parser json` (Llama 3's JSON tool calls and their kin): the whole reply is
    one call object {"name", "arguments" | "parameters"} or an array of them, else it is
    content. Held while its first non-blank character is `{` or `[`. A reply that starts as one
    call object (`json_call_head`) streams its arguments in pieces; an array comes whole."""

    streams_arguments = True

    def __init__(self, cfg: ToolConfig, id_prefix: str = "call_") -> None:
        super().__init__(cfg, id_prefix)
        self._args = ArgsStream()

    def _looks_like_calls(self, head: str) -> bool | None:
        return head[0] in "{["

    def _progress(self, final: bool) -> list[Item]:
        args = self._args
        if args.headless or self._mode != "calls":
            return []
        items: list[Item] = []
        buf = self._pending
        if not args.started:
            head = json_call_head(buf, self.names)
            if not head:
                args.headless = head is False or final
                return []
            name, start, _ = head
            args.start(items, new_call_id(self.id_prefix), name, start)
        args.write(items, buf, len(buf), final)
        return items

    def _end(self, rest: str, calls: list[ToolCall] | None) -> list[Item]:
        if not self._args.started:
            return super()._end(rest, calls)
        # the streamed call stands if the reply reads (as whole) as that one call
        calls = self._args.end(calls)
        return [BrokenCall(rest)] if calls is None or len(calls) != 1 else calls

    def _parse(self, text: str) -> list[ToolCall] | None:
        try:
            value = json.loads(text)
        except UNREADABLE:
            return None
        items = value if isinstance(value, list) else [value]
        try:
            calls = [self.json_call(json.dumps(item)) for item in items]
        except UNREADABLE:  # (written back nested one level deeper)
            return None
        return calls if items and all(c is not None for c in calls) else None


MISTRAL_CALLS, MISTRAL_ARGS, MISTRAL_CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_MISTRAL_ID = re.compile(r"[A-Za-z0-9]{9}\Z")
_MISTRAL_NAME = re.compile(r"\s*([A-Za-z0-9_.\-]{1,64})")


class MistralToolCallParser(ToolCallParser):
    """`--tool-call-parser mistral`. Content streams until the `[TOOL_CALLS]` control token;
    what follows it is calls, in either of Mistral's formats (mistral-common's tokenizers):

        [TOOL_CALLS][{"name": "f", "arguments": {...}, "id": "a1b2c3d4e"}, ...]   (v2-v7)
        [TOOL_CALLS]f[ARGS]{...}[TOOL_CALLS]g[CALL_ID]a1b2c3d4e[ARGS]{...}       (v11, v13)

    (`[ARGS]` may be missing when a detokenizer dropped it.) A call is given out as soon as its
    JSON is complete. Calls of unknown tools, or text that is no call, are given back as content
    as the model wrote them. Ids are Mistral's: 9 letters and digits (the model's own when it
    wrote a valid one), which Mistral's chat templates require of a call written back.
    `[TOOL_CALLS]` is a special token: requests parsed with this parser are detokenized with
    special tokens kept (`sampling_for_parser`), as vLLM's mistral parser asks too."""

    keeps_special_tokens = True
    streams_arguments = True  # (v11 / v13: name[ARGS]{...}; a v2-v7 array comes whole)

    def __init__(self, cfg: ToolConfig, id_prefix: str = "call_") -> None:
        super().__init__(cfg, id_prefix)
        self._after = ""  # text after the first [TOOL_CALLS] not yet parsed
        self._json_end = JsonEnd()
        self._args = ArgsStream()  # the v11 call being streamed (offsets in _after)

    def _step(self, final: bool) -> list[Item]:
        if self._inside:
            self._after += self._pending
            self._pending = ""
            return self._parse(final)
        buf = self._pending
        k = buf.find(MISTRAL_CALLS)
        if k < 0:
            cut = len(buf) if final else len(buf) - _partial_tag(buf, MISTRAL_CALLS)
            self._pending = buf[cut:]
            return [buf[:cut]]
        self._after, self._pending, self._inside = buf[k:], "", True
        self._json_end.reset()
        return [buf[:k], *self._parse(final)]

    def _parse(self, final: bool) -> list[Item]:
        """Calls in self._after, in order with what is surely not a call (content). With
        `final`, whatever is left is content."""
        items: list[Item] = []
        while self._after:
            s = self._after
            if not s.startswith(MISTRAL_CALLS):
                k = s.find(MISTRAL_CALLS)  # text between calls or after them
                keep = len(s) - _partial_tag(s, MISTRAL_CALLS) if k < 0 else k
                if final and k < 0:
                    keep = len(s)
                items.append(s[:keep])
                self._after = s[keep:]
                self._json_end.reset()
                if k < 0:
                    break
                continue
            body = s[len(MISTRAL_CALLS):]
            v3 = body.startswith("[", _SPACE.match(body).end())
            if not v3:
                self._stream_v11(items, s, final)
            got = self._calls_v3(body) if v3 else self._call_v11(body)
            if got is None:  # incomplete: wait for more text (or give it back at the end)
                if final:
                    items.append(BrokenCall(s) if self._args.started else s)
                    self._after = ""
                    self._end_block()
                break
            used, found = got
            text = s[:len(MISTRAL_CALLS) + used]
            if self._args.started:
                found = self._args.end(found)
                items.append(BrokenCall(text) if found is None else found[0])
            elif found is None:  # not a call of a known tool: as the model wrote it
                items.append(text)
            else:
                items.extend(found)
            self._after = body[used:]
            self._end_block()
        if any(isinstance(i, ToolCall) for i in items) \
                and not "".join(i for i in items if isinstance(i, str)).strip():
            items = [i for i in items if not isinstance(i, str)]  # (blanks between calls)
        return items

    def _end_block(self) -> None:
        self._json_end.reset()
        self._args.end(None)

    def _stream_v11(self, items: list[Item], s: str, final: bool) -> None:
        """The start and argument pieces of the v11 call at the start of `s` so far."""
        args = self._args
        if args.headless:
            return
        if not args.started:
            head = self._v11_head(s)
            if not head:
                args.headless = head is False or final
                return
            name, start, call_id = head
            ok = call_id is not None and _MISTRAL_ID.match(call_id)
            args.start(items, call_id if ok else mistral_call_id(), name, start)
        args.write(items, s, len(s), final)

    def _v11_head(self, s: str) -> tuple[str, int, str | None] | bool | None:
        """`[TOOL_CALLS]NAME([CALL_ID]ID)?([ARGS])? {` as _call_v11 reads it: (NAME, where its
        object starts, ID or None); None while `s` may still become that; False otherwise (or
        NAME not listed). The same answer on any longer text."""
        pos = len(MISTRAL_CALLS)
        m = _MISTRAL_NAME.match(s, pos)
        if m is None:
            return None if not s[pos:].strip() else False
        pos, call_id = m.end(), None
        if pos == len(s):
            return None  # (the name may go on)
        if s.startswith(MISTRAL_CALL_ID, pos):
            end = s.find(MISTRAL_ARGS, pos, pos + 64)
            if end < 0:
                return None if len(s) < pos + 64 else False
            call_id, pos = s[pos + len(MISTRAL_CALL_ID):end], end
        elif len(s) - pos < len(MISTRAL_CALL_ID) and MISTRAL_CALL_ID.startswith(s[pos:]):
            return None
        if s.startswith(MISTRAL_ARGS, pos):
            pos += len(MISTRAL_ARGS)
        elif len(s) - pos < len(MISTRAL_ARGS) and MISTRAL_ARGS.startswith(s[pos:]):
            return None
        pos = _SPACE.match(s, pos).end()
        if pos == len(s):
            return None
        if s[pos] != "{" or m.group(1) not in self.names:
            return False
        return m.group(1), pos, call_id

    def _calls_v3(self, body: str) -> tuple[int, list[ToolCall] | None] | None:
        start = _SPACE.match(body).end()
        if self._json_end.find(body, start) < 0:
            return None  # (not complete yet: not decoded again on every piece)
        try:
            value, end = _JSON.raw_decode(body, start)
        except UNREADABLE:
            return None
        items = value if isinstance(value, list) else []
        calls = [self._mistral_call(o.get("name"), o.get("arguments", o.get("parameters", {})),
                                    o.get("id")) if isinstance(o, dict) else None for o in items]
        if not calls or any(c is None for c in calls):
            return end, None
        return end, calls

    def _call_v11(self, body: str) -> tuple[int, list[ToolCall] | None] | None:
        m = _MISTRAL_NAME.match(body)
        if m is None:
            return (0, None) if body and not _could_start_name(body) else None
        pos, call_id = m.end(), None
        if body.startswith(MISTRAL_CALL_ID, pos):
            end = body.find(MISTRAL_ARGS, pos)
            if end < 0:
                return None
            call_id, pos = body[pos + len(MISTRAL_CALL_ID):end], end
        if body.startswith(MISTRAL_ARGS, pos):
            pos += len(MISTRAL_ARGS)
        elif MISTRAL_ARGS.startswith(body[pos:]) or MISTRAL_CALL_ID.startswith(body[pos:]):
            return None  # "[ARG" or "[CALL" so far
        pos = _SPACE.match(body, pos).end()
        if body.startswith("{", pos) and self._json_end.find(body, pos) < 0:
            return None
        try:
            args, end = _JSON.raw_decode(body, pos)
        except UNREADABLE:
            rest = body[pos:].lstrip()
            return None if not rest or rest[0] == "{" else (pos, None)
        call = self._mistral_call(m.group(1), args, call_id)
        if call is None:
            return end, None
        return end, [call]

    def _mistral_call(self, name, args, call_id) -> ToolCall | None:
        if name not in self.names:
            return None
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except UNREADABLE:
                return None
        if not isinstance(args, dict):
            return None
        ok = isinstance(call_id, str) and _MISTRAL_ID.match(call_id)
        return ToolCall(call_id if ok else mistral_call_id(), name, args)


def _could_start_name(body: str) -> bool:
    return body.isspace()


def mistral_call_id() -> str:
    """9 letters and digits: the only tool-call id Mistral's templates accept."""
    alphabet = string.ascii_letters + string.digits
    return "".join(alphabet[b % len(alphabet)] for b in os.urandom(9))
