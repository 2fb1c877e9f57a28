"""Closing a grammar before the token budget runs out: length-safe structured output.

A constrained request cut by `max_tokens` while it is still inside its grammar (a string the
model keeps extending, digits of a pattern, an array it keeps growing) returns text that does
not parse. So near the end of its budget the engine looks for a short completion of the grammar
from where the output is, and once that completion needs the whole remaining budget, it is
the only thing the request may write (backend/runner/grammar.py): the output ends inside the
grammar (valid JSON for a schema), reported with finish_reason "length".

The completion is found by a depth-first search over the matcher's states: forced tokens
(`compute_ff_tokens`) are taken whole; otherwise single-byte tokens are tried in an order that
closes things first (`"` `}` `]`, then `,` `:` and a space, then `0` `.` `1` `a` `A`, then
the other printable bytes), at most `branch` allowed ones per state, the byte just written
tried last (so `[0-9]+\\.` tries `.` after one digit instead of writing digits forever). The
first complete path is taken: short, not always the shortest. A search visits at most
`max_nodes` states (~10 us each) and gives up as soon as a path reaches `max_len` tokens (no
backtracking out of a long dive: a completion that long does not fit the budgets it is for), so
a grammar it cannot close quickly is left as it is, at the cost of one dive (~5 ms for 256).
"""
from __future__ import annotations

FIRST = b'"}],: 0.1aA'
ORDER = FIRST + bytes(b for b in range(32, 127) if b not in FIRST)
CLOSERS = b'"}]'


class Closer:
    """The single-byte tokens of one vocabulary, in search order, and the search."""

    def __init__(self, tokenizer, max_nodes: int = 1000, branch: int = 3) -> None:
        """`tokenizer`: an llguidance LLTokenizer."""
        self.max_nodes = max_nodes
        self.branch = branch
        self.candidates: list[int] = []
        closers = set()
        for b in ORDER:
            ids = tokenizer.tokenize_bytes(bytes([b]))
            if len(ids) == 1:
                self.candidates.append(ids[0])
                if b in CLOSERS:
                    closers.add(ids[0])
        self.closers = frozenset(closers)

    def plan(self, matcher, max_len: int) -> list[int] | None:
        """Tokens that take `matcher` (left as it is) to an accepting state, at most `max_len`
        of them; None when none was found within the search's bounds."""
        m = matcher.deep_copy()
        path: list[int] = []
        nodes, give_up = 0, False

        def dfs() -> bool:
            nonlocal nodes, give_up
            if m.is_accepting():
                return True
            if len(path) >= max_len or nodes >= self.max_nodes:
                give_up = True
            if give_up or m.is_error():
                return False
            nodes += 1
            forced = m.compute_ff_tokens()
            if forced:
                if not m.consume_tokens(forced):
                    return False
                path.extend(forced)
                if dfs():
                    return True
                del path[len(path) - len(forced):]
                m.rollback(len(forced))
                return False
            prev = path[-1] if path else None
            tried = 0
            for t in self._order(prev):
                if tried >= self.branch:
                    break
                if m.validate_tokens([t]) != 1:
                    continue
                tried += 1
                m.consume_token(t)
                path.append(t)
                if dfs():
                    return True
                path.pop()
                m.rollback(1)
            return False

        return list(path) if dfs() else None

    def _order(self, prev: int | None) -> list[int]:
        if prev is None or prev in self.closers or prev not in self.candidates:
            return self.candidates
        return [t for t in self.candidates if t != prev] + [prev]
