"""`--tool-call-parser openai`: gpt-oss's harmony format (OpenAI's harmony guide, "Receiving tool
calls"). After the prompt's `<|start|>assistant` the model writes one or more messages:

    <|channel|>analysis<|message|>Need the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>
    {"location": "Tokyo"}<|call|>

    <|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>It is
    sunny.<|return|>

A message's header (up to `<|message|>`) names its channel and, for a tool call, its recipient
(`to=functions.NAME`, in the role's part or the channel's). A message to `functions.NAME` with a
JSON object is a call; the `final` channel, and `commentary` without a recipient (a preamble the
user may see), are content, streamed as they come; `analysis` is the chain of thought, which the
guide says not to show to users: it is left out (there is no reasoning field here). A message to
any other recipient, or one whose arguments are no JSON object of a listed tool, is content as its
text. `<|call|>` and `<|return|>` are stop tokens, so the text may end without them. A reply that
does not start with a header is plain content. The markers are special tokens
(`keeps_special_tokens`).

A call's arguments stream in pieces once its header names a listed tool and its JSON object has
begun (the message's text up to an end marker is the block, as for the tagged formats).
"""
from __future__ import annotations

import re

from gateway.tool_call_parsers import (
    _SPACE,
    ArgsStream,
    BrokenCall,
    Item,
    ToolCallParser,
    _partial_tag,
    new_call_id,
)

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([A-Za-z0-9_]+)")
VISIBLE = ("final", "commentary")


class HarmonyToolCallParser(ToolCallParser):
    keeps_special_tokens = True
    streams_arguments = True

    def __init__(self, cfg, id_prefix: str = "call_") -> None:
        super().__init__(cfg, id_prefix)
        self._mode: str | None = None  # None: undecided; "text": plain; "header"; "body"
        self._searched = 0  # no end marker in the held body before this
        self._channel = ""
        self._recipient: str | None = None
        self._args = ArgsStream()  # the message's call, when its arguments stream

    def _step(self, final: bool) -> list[Item]:
        items: list[Item] = []
        while True:
            if self._mode is None:
                head = self._pending.lstrip()
                if not head:
                    break
                if head.startswith((START, CHANNEL)):
                    self._mode, self._pending = "header", head
                elif (START.startswith(head) or CHANNEL.startswith(head)) and not final:
                    break
                else:
                    self._mode = "text"
            if self._mode == "text":
                items.append(self._pending)
                self._pending = ""
                break
            if self._mode == "header":
                k = self._pending.find(MESSAGE)
                if k < 0:
                    if final:  # a header cut off: nothing of it is for the user
                        self._pending = ""
                    break
                header, self._pending = self._pending[:k], self._pending[k + len(MESSAGE):]
                m = _CHANNEL.search(header)
                r = _RECIPIENT.search(header)
                self._channel = m.group(1) if m else ""
                self._recipient = r.group(1) if r else None
                self._mode = "body"
            if not self._body_step(items, final):
                break
        return items

    def _body_step(self, items: list[Item], final: bool) -> bool:
        """One message's content; True when it ended (the next header may follow)."""
        buf = self._pending
        ends = (*ENDS, START, CHANNEL)
        hits = [(k, t) for t in ends if (k := buf.find(t, self._searched)) >= 0]
        k, tag = min(hits) if hits else (-1, "")
        shown = self._recipient is None and self._channel in VISIBLE
        self._stream_args(items, buf, k, ends, final)
        if k < 0 and not final:
            if self._recipient is None:  # shown: streamed; hidden: dropped as it comes
                keep = max(_partial_tag(buf, t) for t in ends)
                if shown:
                    items.append(buf[:len(buf) - keep])
                self._pending = buf[len(buf) - keep:]
            else:  # a call's arguments: held whole, its end not searched for again
                self._searched = max(0, len(buf) - max(map(len, ends)) + 1)
            return False
        self._searched = 0
        text = buf if k < 0 else buf[:k]
        self._pending = "" if k < 0 else buf[k + (len(tag) if tag in ENDS else 0):]
        if shown:
            items.append(text)
        elif self._recipient is not None:
            call = None
            if self._recipient.startswith("functions."):
                call = self.make_call(self._recipient.removeprefix("functions."), text.strip())
            if self._args.started:
                calls = self._args.end(None if call is None else [call])
                items.append(BrokenCall(text) if calls is None else calls[0])
            else:
                items.append(call if call is not None else text)
        self._args.end(None)
        self._mode = None
        return True

    def _stream_args(self, items: list[Item], buf: str, k: int, ends, final: bool) -> None:
        """A call's start and argument pieces, read up to the message's end (`k`; -1 while
        it is open: then up to a partial marker)."""
        args, name = self._args, (self._recipient or "").removeprefix("functions.")
        if args.headless or not (self._recipient or "").startswith("functions.") \
                or name not in self.names:
            return
        ended = k >= 0 or final
        limit = k if k >= 0 else len(buf) - (0 if final else max(_partial_tag(buf, t)
                                                                 for t in ends))
        if not args.started:
            pos = _SPACE.match(buf, 0, limit).end()
            if pos == limit or buf[pos] != "{":
                args.headless = pos < limit or ended
                return
            args.start(items, new_call_id(self.id_prefix), name, pos)
        args.write(items, buf, limit, ended)
