"""Incremental detokenization and stop-string matching.

`IncrementalDetokenizer` turns a growing list of token ids into text deltas. It decodes a small
window twice (the "prefix" already emitted, and prefix + new tokens) and emits the difference,
as vLLM's and TGI's incremental detokenizers do:

    ids:  ... | prefix_offset ........ read_offset ........ len(ids)
              |<- emitted already ->|<- not yet emitted ->|

A byte-level tokenizer may split one UTF-8 character over several tokens; while the decoded
window ends in U+FFFD (an incomplete character) the delta is held back, and `flush()` emits
whatever is left when the sequence ends.

`StopMatcher` finds stop strings in the text stream: the text up to the first stop is emitted,
the stop string itself is not, and while streaming the longest suffix that could still grow
into a stop string is held back (so a stop split across deltas is never half-sent).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT_CHAR = "\ufffd"
# How many prompt tokens to decode as left context for the first generated token (so that a
# tokenizer that drops a leading space at the start of a decode still gets it right).
PROMPT_CONTEXT_TOKENS = 5

Decode = Callable[[Sequence[int]], str]


class IncrementalDetokenizer:
    """Text deltas from token ids, correct across multi-byte characters split between tokens."""

    __slots__ = ("_decode", "_ids", "_num_prompt", "_prefix_offset", "_read_offset")

    def __init__(self, decode: Decode, prompt_ids: Sequence[int] = ()) -> None:
        self._decode = decode
        context = list(prompt_ids[-PROMPT_CONTEXT_TOKENS:]) if prompt_ids else []
        self._ids: list[int] = context
        self._num_prompt = len(context)
        self._prefix_offset = 0
        self._read_offset = len(context)

    def add(self, new_ids: Sequence[int]) -> str:
        """Append tokens; return the text that is now complete (maybe "")."""
        self._ids.extend(new_ids)
        return self._emit(final=False)

    def flush(self) -> str:
        """The held-back remainder at the end of the sequence (may contain U+FFFD)."""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        if self._read_offset >= len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix_offset:self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset:])
        if not final and (len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT_CHAR)):
            return ""
        delta = new_text[len(prefix_text):]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return delta


class StopMatcher:
    """Stop strings over a stream of text deltas."""

    __slots__ = ("_held", "_stops", "matched", "stopped")

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False
        self.matched: str | None = None

    def feed(self, delta: str) -> str:
        """Text that can be sent now. After a stop string is found, `stopped` is True and
        everything from the stop string on is dropped."""
        if self.stopped:
            return ""
        if not self._stops:
            return delta
        text = self._held + delta
        best = -1
        for stop in self._stops:
            idx = text.find(stop)
            if idx != -1 and (best == -1 or idx < best):
                best, self.matched = idx, stop
        if best != -1:
            self.stopped = True
            self._held = ""
            return text[:best]
        hold = self._partial_suffix_len(text)
        self._held = text[len(text) - hold:] if hold else ""
        return text[:len(text) - hold]

    def flush(self) -> str:
        """At the end of the sequence: the held text was not a stop after all."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _partial_suffix_len(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:n]):
                    best = n
                    break
        return best
