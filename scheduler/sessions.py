"""Agent sessions in placement (issue 30): session affinity, sub-agents, and pinned prefixes.

Coding-agent traffic is a stream of turns whose prompts extend the previous turn's prompt; what
makes a turn cheap is the backend that still holds that prompt's KV. The sampled prefix hashes
of `scheduler.prefix_index` stop at 32 blocks (512 tokens), so with one system prompt shared by
every session they cannot tell sessions apart. This module adds three facts the placement policy
(`PrefixAffinityPlacement`) reads before its prefix rule:

    homes   explicit session key -> the backend that served its last turn. The key is whatever
            the caller had: OpenAI's ``prompt_cache_key``, a coding agent's session header
            (Claude Code ``x-claude-code-session-id``, Codex ``session_id``/``conversation_id``,
            OpenCode ``x-session-affinity``), else ``user`` (`gateway.sessions` picks it).
    tails   the chain hash of the last full block of every placed prompt -> its backend. A
            prompt that contains a placed prompt whole (a follow-up turn, or a sub-agent forked
            from its parent's context) continues that session: the session *from the prefix*,
            when no key was sent, and how a sub-agent with a key of its own finds its parent.
            Sharing only a system prompt is not containing a whole earlier prompt, so sessions
            that share one are not glued together.
    pins    chain hash of a pinned prefix's last block -> {backend: until}: those backends
            keep the prefix's blocks (scheduler.block_manager pins) until then.

`pick` returns the candidate (home, tail holder, pin holders) holding the most of the prompt —
pinned breaking ties, then the home, then the lower load — among those that accept requests
and are within the policy's load bound (``least * load_factor + slack``: the session stays while
its backend has slack). When the session had a home and lands elsewhere, that is a *move*
(`num_moves`, the gateway's ``tidegate_session_moves_total``).

Chain hashes are the block manager's (`chain_hashes`): full block i of a prompt has key
``(parent, tokens)``, the same 64-bit number in the gateway, the backend and the simulator.
Work per request is O(prompt blocks) dict lookups; tables are LRUs bounded by `max_entries`
and forget entries idle for `ttl_s`.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from scheduler.block_manager import ROOT_HASH
from scheduler.prefix_index import DEPTHS

__all__ = ["SessionAffinity", "SessionConfig", "SessionInfo", "chain_hashes", "sampled_prefix"]


def chain_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """The chain hash of each full block of the prompt that can be a cache hit (at least one
    prompt token left to compute, as `BlockManager.match_prefix`)."""
    out = []
    parent = ROOT_HASH
    for i in range((len(token_ids) - 1) // block_size):
        parent = hash((parent, tuple(token_ids[i * block_size:(i + 1) * block_size])))
        out.append(parent)
    return out


def sampled_prefix(chain: Sequence[int]) -> tuple[int, ...]:
    """The placement's sampled prefix hashes from a chain: `prefix_index.prefix_hashes`."""
    n = len(chain)
    return tuple(chain[d - 1] for d in DEPTHS if d <= n)


class SessionInfo:
    """What placement knows of one request's session: an explicit key (None: none sent), its
    prompt's chain hashes, and the pin it asks for (leading blocks, until when; 0: none)."""

    __slots__ = ("chain", "home", "key", "pin_blocks", "pin_until")

    def __init__(self, key: Hashable | None, chain: Sequence[int], pin_blocks: int = 0,
                 pin_until: float = 0.0) -> None:
        self.key = key
        self.chain = chain
        self.pin_blocks = min(pin_blocks, len(chain))
        self.pin_until = pin_until
        self.home = -1  # set by pick: where the session was before this request (-1: new)


@dataclass(frozen=True)
class SessionConfig:
    ttl_s: float = 900.0          # a session (key or tail) idle this long is forgotten
    max_entries: int = 200_000    # per table (homes, tails), least recently used dropped


class SessionAffinity:
    """The session tables and the pick; see the module docstring."""

    def __init__(self, config: SessionConfig = SessionConfig()) -> None:
        self.config = config
        self.homes: OrderedDict[Hashable, list] = OrderedDict()   # key -> [backend, last]
        self.tails: OrderedDict[int, list] = OrderedDict()        # hash -> [backend, last]
        self.pins: dict[int, dict[int, float]] = {}               # hash -> {backend: until}
        self.num_requests = 0    # requests with a session (a key, or a tail found)
        self.num_stays = 0       # placed on their session's backend
        self.num_moves = 0       # had a backend, placed on another (it had no slack, or left)
        self.num_from_prefix = 0  # sessions found from the prompt alone (no key)
        self.num_pin_hits = 0    # placed on a backend holding a pin of their prefix

    # ---- reading -------------------------------------------------------------------------------
    def _fresh(self, entry: list | None, now: float) -> bool:
        return entry is not None and now - entry[1] <= self.config.ttl_s

    def _tail(self, chain: Sequence[int], now: float) -> tuple[int, int]:
        """(backend, blocks) of the longest placed prompt this one contains; (-1, 0) if none."""
        tails = self.tails
        for i in range(len(chain) - 1, -1, -1):
            e = tails.get(chain[i])
            if e is not None and self._fresh(e, now):
                return e[0], i + 1
        return -1, 0

    def _pinned(self, chain: Sequence[int], now: float) -> tuple[dict[int, float], int]:
        """({backend: until}, blocks) of the deepest live pin this prompt starts with."""
        pins = self.pins
        if not pins:
            return {}, 0
        for i in range(len(chain) - 1, -1, -1):
            holders = pins.get(chain[i])
            if holders:
                live = {b: u for b, u in holders.items() if u > now}
                if len(live) != len(holders):
                    if live:
                        pins[chain[i]] = live
                    else:
                        del pins[chain[i]]
                if live:
                    return live, i + 1
        return {}, 0

    def pick(self, s: SessionInfo, load: Sequence[int], accepting: Sequence[bool],
             bound: float, now: float) -> tuple[int, int]:
        """(backend, blocks it is expected to hold) for the request, or (-1, 0): no session
        candidate within the bound (the placement's prefix rule decides). Sets `s.home`."""
        home, home_blocks = -1, 0
        if s.key is not None:
            e = self.homes.get(s.key)
            if self._fresh(e, now):
                home = e[0]
        tail_b, tail_blocks = self._tail(s.chain, now)
        if home < 0 and tail_b >= 0:
            home = tail_b
            if s.key is None:
                self.num_from_prefix += 1
        if home >= 0:
            self.num_requests += 1
            home_blocks = tail_blocks if tail_b == home else 0
        s.home = home
        pinned, pin_blocks = self._pinned(s.chain, now)
        cands: dict[int, tuple[int, bool, bool]] = {}  # backend -> (blocks, pinned, home)
        if home >= 0:
            cands[home] = (home_blocks, home in pinned and pin_blocks >= home_blocks, True)
        if tail_b >= 0 and tail_b != home:
            cands[tail_b] = (tail_blocks, False, False)
        for b in pinned:
            blocks, _, is_home = cands.get(b, (0, False, False))
            cands[b] = (max(blocks, pin_blocks), pin_blocks >= blocks, is_home)
        best, best_key = -1, None
        for b, (blocks, is_pinned, is_home) in cands.items():
            if b >= len(load) or not accepting[b] or load[b] > bound:
                continue
            k = (blocks, is_pinned, is_home, -load[b], -b)
            if best_key is None or k > best_key:
                best, best_key = b, k
        if best < 0:
            return -1, 0
        if best_key[1]:
            self.num_pin_hits += 1
        return best, best_key[0]

    # ---- writing -------------------------------------------------------------------------------
    def record(self, s: SessionInfo, b: int, now: float) -> None:
        """`s`'s request was placed on `b`: it is the session's backend now."""
        if b < 0:
            return
        if s.home >= 0:
            if b == s.home:
                self.num_stays += 1
            else:
                self.num_moves += 1
        cap = self.config.max_entries
        if s.key is not None:
            _touch(self.homes, s.key, [b, now], cap)
        if s.chain:
            _touch(self.tails, s.chain[-1], [b, now], cap)
        if s.pin_blocks > 0 and s.pin_until > now:
            h = s.chain[s.pin_blocks - 1]
            holders = self.pins.setdefault(h, {})
            holders[b] = max(holders.get(b, 0.0), s.pin_until)

    def drop_pin(self, s: SessionInfo, b: int) -> None:
        """`b` served the request without its pin (over its budget): it holds none."""
        if s.pin_blocks > 0:
            holders = self.pins.get(s.chain[s.pin_blocks - 1])
            if holders is not None:
                holders.pop(b, None)

    def remove_backend(self, b: int) -> None:
        for table in (self.homes, self.tails):
            for k in [k for k, e in table.items() if e[0] == b]:
                del table[k]
        for holders in self.pins.values():
            holders.pop(b, None)

    def stats(self) -> dict:
        return {"session_requests": self.num_requests, "session_stays": self.num_stays,
                "session_moves": self.num_moves, "sessions_from_prefix": self.num_from_prefix,
                "pin_hits": self.num_pin_hits, "sessions_known": len(self.homes),
                "tails_known": len(self.tails),
                "pinned_prefixes": sum(1 for h in self.pins.values() if h)}


def _touch(table: OrderedDict, key: Hashable, value: list, cap: int) -> None:
    if key in table:
        table.move_to_end(key)
    table[key] = value
    while len(table) > cap:
        table.popitem(last=False)
