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

    @property
    def pending(self) -> bool:
        """Tokens whose text is held back (an incomplete character at the end)."""
        return self._read_offset < len(self._ids)

    def mark(self) -> tuple[int, int, int]:
        """Where it is now, for `rewind` (a step's tokens fed again one at a time)."""
        return len(self._ids), self._prefix_offset, self._read_offset

    def rewind(self, mark: tuple[int, int, int]) -> None:
        num_ids, self._prefix_offset, self._read_offset = mark
        del self._ids[num_ids:]

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
    """Stop strings over a stream of text deltas, linear in the text: an Aho-Corasick automaton
    over the stop strings, advanced one character at a time and kept between deltas.

    The output ends where a stop string is first completed (the longest one, when several end
    at the same character) and is cut at its start, or after it with `include_stop`. That is
    where a generation checked after every token stops too. The automaton's state is the
    longest suffix of the text that is a prefix of some stop: exactly what must be held back.
    """

    __slots__ = ("_depth", "_fail", "_goto", "_held", "_include", "_match", "_state", "matched",
                 "stopped")

    def __init__(self, stops: Sequence[str], include_stop: bool = False) -> None:
        self._include = include_stop
        self._goto: list[dict[str, int]] = [{}]
        self._depth = [0]
        self._match: list[str | None] = [None]  # longest stop that ends at this state
        for stop in dict.fromkeys(s for s in stops if s):
            state = 0
            for ch in stop:
                nxt = self._goto[state].get(ch)
                if nxt is None:
                    nxt = len(self._goto)
                    self._goto[state][ch] = nxt
                    self._goto.append({})
                    self._depth.append(self._depth[state] + 1)
                    self._match.append(None)
                state = nxt
            self._match[state] = stop
        self._fail = [0] * len(self._goto)
        queue = list(self._goto[0].values())
        for state in queue:  # breadth first: a state's fail link is shallower, so already set
            for ch, nxt in self._goto[state].items():
                f = self._fail[state]
                while f and ch not in self._goto[f]:
                    f = self._fail[f]
                self._fail[nxt] = self._goto[f].get(ch, 0) if self._goto[f].get(ch) != nxt else 0
                if self._match[nxt] is None:
                    self._match[nxt] = self._match[self._fail[nxt]]
                queue.append(nxt)
        self._state = 0
        self._held = ""
        self.stopped = False
        self.matched: str | None = None

    @property
    def active(self) -> bool:
        """Whether there are stop strings to match."""
        return len(self._goto) > 1

    def mark(self) -> tuple[int, str]:
        """Where it is now (before any stop), for `rewind`."""
        return self._state, self._held

    def rewind(self, mark: tuple[int, str]) -> None:
        self._state, self._held = mark
        self.stopped, self.matched = False, None

    def feed(self, delta: str) -> str:
        """Text that can be sent now. After a stop string is found, `stopped` is True and
        everything from the stop string on (after it, with include_stop) is dropped."""
        if self.stopped:
            return ""
        if len(self._goto) == 1:
            return delta
        goto, fail, match = self._goto, self._fail, self._match
        state = self._state
        text = self._held + delta
        base = len(self._held)
        for i, ch in enumerate(delta):
            while state and ch not in goto[state]:
                state = fail[state]
            state = goto[state].get(ch, 0)
            stop = match[state]
            if stop is not None:
                self.stopped, self.matched, self._held = True, stop, ""
                end = base + i + 1
                return text[:end] if self._include else text[:end - len(stop)]
        self._state = state
        hold = self._depth[state]
        self._held = text[len(text) - hold:] if hold else ""
        return text[:len(text) - hold]

    def skip(self, delta: str) -> str:
        """Text that stop strings must not end (vLLM's min_tokens): passed through, unmatched."""
        if self.stopped:
            return ""
        held, self._held, self._state = self._held, "", 0
        return held + delta

    def flush(self) -> str:
        """At the end of the sequence: the held text was not a stop after all."""
        held, self._held, self._state = self._held, "", 0
        return "" if self.stopped else held
