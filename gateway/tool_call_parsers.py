"""The tool-call parser classes (`hermes`'s `ToolCallParser`, `json`, `mistral`) and what they share
(`ToolCall`, call ids). Parsers by name, `make_parser` and the stream shaping are in
`gateway.tool_parser`; a parser that builds on these classes (`gateway.tool_parser_pythonic`)
imports them from here, so that the registry can import it in turn without a loop."""
from __future__ import annotations

import json
import os
import re
import string
from dataclasses import dataclass

from gateway.tools import CALL_CLOSE, CALL_OPEN, ToolConfig

OPEN_TAG, CLOSE_TAG = CALL_OPEN.rstrip("\n"), CALL_CLOSE.lstrip("\n")


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: dict

    def openai(self, index: int | None = None) -> dict:
        call = {"id": self.id, "type": "function",
                "function": {"name": self.name,
                             "arguments": json.dumps(self.arguments, ensure_ascii=False)}}
        return call if index is None else {"index": index, **call}


def new_call_id(prefix: str = "call_") -> str:
    return prefix + os.urandom(12).hex()


def _partial_tag(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ToolCallParser:
    def __init__(self, cfg: ToolConfig, id_prefix: str = "call_") -> None:
        self.names = cfg.names()
        self.id_prefix = id_prefix
        self.calls: list[ToolCall] = []
        self._pending = ""
        self._inside = False

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        """(content to show now, calls completed by this text)."""
        self._pending += text
        content, calls = [], []
        while True:
            if not self._inside:
                k = self._pending.find(OPEN_TAG)
                if k < 0:
                    keep = _partial_tag(self._pending, OPEN_TAG)
                    cut = len(self._pending) - keep
                    content.append(self._pending[:cut])
                    self._pending = self._pending[cut:]
                    break
                content.append(self._pending[:k])
                self._pending = self._pending[k + len(OPEN_TAG):]
                self._inside = True
            else:
                k = self._pending.find(CLOSE_TAG)
                if k < 0:
                    break
                body, self._pending = self._pending[:k], self._pending[k + len(CLOSE_TAG):]
                self._inside = False
                call = self._call(body)
                if call is None:
                    content.append(OPEN_TAG + body + CLOSE_TAG)
                else:
                    calls.append(call)
        return "".join(content), calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The end of the output: an unclosed block is a call if its JSON is complete."""
        rest, self._pending = self._pending, ""
        if self._inside:
            self._inside = False
            call = self._call(rest)
            if call is not None:
                return "", [call]
            return OPEN_TAG + rest, []
        return rest, []

    def _call(self, body: str) -> ToolCall | None:
        try:
            obj = json.loads(body)
        except ValueError:
            return None
        if not isinstance(obj, dict) or obj.get("name") not in self.names:
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args)
            except ValueError:
                return None
        if not isinstance(args, dict):
            return None
        call = ToolCall(new_call_id(self.id_prefix), obj["name"], args)
        self.calls.append(call)
        return call


class JsonToolCallParser(ToolCallParser):
    """`--tool-call-parser json` (Llama 3's JSON tool calls and their kin): the whole reply is
    one call object {"name", "arguments" | "parameters"} or an array of them, else it is
    content. While the reply could still be such JSON (its first non-blank character is `{` or
    `[`) it is held back; as soon as it cannot, it streams as content."""

    def __init__(self, cfg: ToolConfig, id_prefix: str = "call_") -> None:
        super().__init__(cfg, id_prefix)
        self._mode: str | None = None  # None: undecided, "json": held, "text": streamed

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self._pending += text
        if self._mode is None and self._pending.strip():
            self._mode = "json" if self._pending.lstrip()[0] in "{[" else "text"
        if self._mode == "text":
            out, self._pending = self._pending, ""
            return out, []
        return "", []

    def finish(self) -> tuple[str, list[ToolCall]]:
        rest, self._pending = self._pending, ""
        if self._mode != "json":
            return rest, []
        try:
            value = json.loads(rest)
        except ValueError:
            return rest, []
        items = value if isinstance(value, list) else [value]
        calls = [self._call(json.dumps(item)) for item in items]
        if not items or any(c is None for c in calls):
            self.calls = self.calls[:len(self.calls) - sum(c is not None for c in calls)]
            return rest, []
        return "", calls


MISTRAL_CALLS, MISTRAL_ARGS, MISTRAL_CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_MISTRAL_ID = re.compile(r"[A-Za-z0-9]{9}\Z")
_MISTRAL_NAME = re.compile(r"\s*([A-Za-z0-9_.\-]{1,64})")
_JSON = json.JSONDecoder()


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

    def __init__(self, cfg: ToolConfig, id_prefix: str = "call_") -> None:
        super().__init__(cfg, id_prefix)
        self._after = ""  # text after the first [TOOL_CALLS] not yet parsed

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        if self._inside:
            self._after += text
            return self._parse(final=False)
        self._pending += text
        k = self._pending.find(MISTRAL_CALLS)
        if k < 0:
            cut = len(self._pending) - _partial_tag(self._pending, MISTRAL_CALLS)
            content, self._pending = self._pending[:cut], self._pending[cut:]
            return content, []
        content, self._after = self._pending[:k], self._pending[k:]
        self._pending, self._inside = "", True
        more, calls = self._parse(final=False)
        return content + more, calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        if not self._inside:
            rest, self._pending = self._pending, ""
            return rest, []
        return self._parse(final=True)

    def _parse(self, final: bool) -> tuple[str, list[ToolCall]]:
        """Calls completed in self._after; what is surely not a call is content. With `final`,
        whatever is left is content."""
        content, calls = [], []
        while self._after:
            s = self._after
            if not s.startswith(MISTRAL_CALLS):
                k = s.find(MISTRAL_CALLS)  # text between calls or after them
                keep = len(s) - _partial_tag(s, MISTRAL_CALLS) if k < 0 else k
                if final and k < 0:
                    keep = len(s)
                content.append(s[:keep])
                self._after = s[keep:]
                if k < 0:
                    break
                continue
            body = s[len(MISTRAL_CALLS):]
            got = self._calls_v3(body) if body.lstrip().startswith("[") else self._call_v11(body)
            if got is None:  # incomplete: wait for more text (or give it back at the end)
                if final:
                    content.append(s)
                    self._after = ""
                break
            used, found = got
            if found is None:  # not a call of a known tool: as the model wrote it
                content.append(s[:len(MISTRAL_CALLS) + used])
            else:
                calls.extend(found)
            self._after = body[used:]
        if calls and not "".join(content).strip():
            content = []
        return "".join(content), calls

    def _calls_v3(self, body: str) -> tuple[int, list[ToolCall] | None] | None:
        start = len(body) - len(body.lstrip())
        try:
            value, end = _JSON.raw_decode(body, start)
        except ValueError:
            return None
        items = value if isinstance(value, list) else []
        calls = [self._mistral_call(o.get("name"), o.get("arguments", o.get("parameters", {})),
                                    o.get("id")) if isinstance(o, dict) else None for o in items]
        if not calls or any(c is None for c in calls):
            return end, None
        self.calls.extend(calls)
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
        while pos < len(body) and body[pos].isspace():
            pos += 1
        try:
            args, end = _JSON.raw_decode(body, pos)
        except ValueError:
            rest = body[pos:].lstrip()
            return None if not rest or rest[0] == "{" else (pos, None)
        call = self._mistral_call(m.group(1), args, call_id)
        if call is None:
            return end, None
        self.calls.append(call)
        return end, [call]

    def _mistral_call(self, name, args, call_id) -> ToolCall | None:
        if name not in self.names:
            return None
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
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
