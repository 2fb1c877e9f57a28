"""Which backends hold which prompt prefixes: the placement policy's picture of the caches.

Prefix hashes are the block manager's own chain hashes (`scheduler.block_manager`): block i of a
prompt has the key ``(parent, tuple(its block_size tokens))``, ``parent`` = hash of block i-1's
key (``ROOT_HASH`` for block 0), and the *prefix hash at depth d* is the hash of block d-1's key —
the same 64-bit number in the gateway, the backend and the simulator, for the same tokens.

Only a few depths are sampled (`DEPTHS`: 1, 2, 4, ... 32 blocks): enough to tell "shares the
first block" from "shares the first 512 tokens", and a backend's summary stays small (a handful
of hashes per distinct prompt head instead of one per cached block). The longest match is found
at sampled depths, so it is rounded down to a power of two blocks.

Two sources, kept apart:

    facts    the hashes a backend reported holding (its last LoadReport): replaced per report
    guesses  what the policy itself sent there since: the report lags, and a backend that
             reports nothing (an HTTP server) has only guesses. A guess older than `guess_ttl_s`
             is dropped at the backend's next report (by then a fact or evicted); without
             reports, each backend keeps its `max_guesses` most recent guesses (an LRU, a
             stand-in for the cache's own eviction).

``holders[h]`` is the set of backends with h as a fact or a guess; a lookup is O(depths).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

from scheduler.block_manager import ROOT_HASH, BlockKey

DEPTHS = (1, 2, 4, 8, 16, 32)


def prefix_keys(token_ids: Sequence[int], block_size: int,
                depths: Sequence[int] = DEPTHS) -> list[tuple[int, BlockKey]]:
    """``(chain hash, block key)`` of the prompt at each sampled depth it reaches, shallowest
    first. A depth counts only if its blocks can be a cache hit: at least one prompt token must
    be left to compute (as in `BlockManager.match_prefix`)."""
    num_full = (len(token_ids) - 1) // block_size
    out = []
    parent = ROOT_HASH
    want = iter(depths)
    d = next(want, None)
    for i in range(min(num_full, depths[-1] if depths else 0)):
        key = (parent, tuple(token_ids[i * block_size:(i + 1) * block_size]))
        parent = hash(key)
        if i + 1 == d:
            out.append((parent, key))
            d = next(want, None)
    return out


def prefix_hashes(token_ids: Sequence[int], block_size: int,
                  depths: Sequence[int] = DEPTHS) -> tuple[int, ...]:
    """The prompt's chain hashes at the sampled depths it reaches, shallowest first."""
    return tuple(h for h, _ in prefix_keys(token_ids, block_size, depths))


class PrefixSummary:
    """The backend's side: which sampled-depth prefixes of the prompts it was given are still in
    its prefix cache — what a LoadReport carries (`snapshot`). Keeps the `max_entries` most
    recently admitted; a key found evicted is forgotten (it only returns with a new prompt).

    A prompt's blocks are cached only once it is prefilled, which on a busy backend can be many
    steps after it was admitted. Until then its keys are *pending* and reported as held (they
    will be) for up to `pending_snapshots` reports: otherwise the first report after admission
    would forget them, the gateway's guess would lapse with its TTL, and the next request of
    the same prefix would go elsewhere — a split that depended on how slow the steps were, so
    the simulator and the live system placed alike only when their step times matched."""

    __slots__ = ("_keys", "_pending", "block_size", "max_entries", "pending_snapshots")

    def __init__(self, block_size: int, max_entries: int = 1024,
                 pending_snapshots: int = 64) -> None:
        self.block_size = block_size
        self.max_entries = max_entries
        self.pending_snapshots = pending_snapshots
        self._keys: OrderedDict[int, BlockKey] = OrderedDict()  # hash -> key, oldest first
        self._pending: dict[int, int] = {}  # hash -> reports it may still be uncached

    def add_prompt(self, token_ids: Sequence[int]) -> None:
        keys, pending = self._keys, self._pending
        for h, key in prefix_keys(token_ids, self.block_size):
            if h in keys:
                keys.move_to_end(h)
            else:
                keys[h] = key
            pending[h] = self.pending_snapshots
        while len(keys) > self.max_entries:
            h, _ = keys.popitem(last=False)
            pending.pop(h, None)

    def snapshot(self, is_cached: Callable[[BlockKey], bool]) -> list[int]:
        """Hashes of the recorded prefixes whose block is still cached (`is_cached`: the block
        manager's `is_cached`) or whose prompt is not prefilled yet, most recent first."""
        keys, pending = self._keys, self._pending
        gone = []
        for h, key in keys.items():
            if is_cached(key):
                if pending:
                    pending.pop(h, None)
                continue
            left = pending.get(h, 0)
            if left > 1:
                pending[h] = left - 1
            elif left == 1:
                del pending[h]
            else:
                gone.append(h)
        for h in gone:
            del keys[h]
        return list(reversed(keys))


class PrefixIndex:
    """Facts and guesses of which backend holds which sampled-depth prefix hash."""

    __slots__ = ("_facts", "_guesses", "_reports", "guess_ttl_s", "holders", "max_guesses")

    def __init__(self, guess_ttl_s: float = 2.0, max_guesses: int = 4096) -> None:
        self.guess_ttl_s = guess_ttl_s
        self.max_guesses = max_guesses
        self.holders: dict[int, set[int]] = {}
        self._facts: dict[int, set[int]] = {}
        self._guesses: dict[int, OrderedDict[int, float]] = {}  # oldest first
        self._reports: set[int] = set()       # backends that have reported facts

    def add_backend(self, b: int) -> None:
        self._facts.setdefault(b, set())
        self._guesses.setdefault(b, OrderedDict())

    def remove_backend(self, b: int) -> None:
        for h in self._facts.pop(b, ()):
            self._drop(h, b)
        for h in self._guesses.pop(b, ()):
            self._drop(h, b)
        self._reports.discard(b)

    def holds(self, b: int, h: int) -> bool:
        s = self.holders.get(h)
        return s is not None and b in s

    def held_before(self, b: int, h: int, now: float) -> bool:
        """Whether `b` held `h` before `now`: a fact, or a guess older than `now` (not the
        guess of a request placed at `now`, which is only on its way there)."""
        if h in self._facts.get(b, ()):
            return True
        g = self._guesses.get(b)
        return g is not None and g.get(h, now) < now

    # ---- updates -----------------------------------------------------------------------------
    def guess(self, b: int, hashes: Sequence[int], now: float) -> None:
        """`b` was just sent a prompt with these prefix hashes: it will hold them."""
        g = self._guesses.get(b)
        if g is None:
            return
        holders = self.holders
        for h in hashes:
            if h in g:
                g.move_to_end(h)
            s = holders.get(h)
            if s is None:
                holders[h] = {b}
            else:
                s.add(b)
            g[h] = now
        while len(g) > self.max_guesses:
            h, _ = g.popitem(last=False)
            if h not in self._facts[b]:
                self._drop(h, b)

    def report(self, b: int, hashes: Iterable[int], now: float) -> None:
        """`b` holds exactly these sampled-depth hashes (a snapshot from its LoadReport)."""
        old = self._facts.get(b)
        if old is None:
            return
        new = set(hashes)
        self._reports.add(b)
        g = self._guesses[b]
        holders = self.holders
        for h in new - old:
            s = holders.get(h)
            if s is None:
                holders[h] = {b}
            else:
                s.add(b)
        self._facts[b] = new
        for h in old - new:
            if h not in g:
                self._drop(h, b)
        # guesses older than the TTL are either facts by now or not worth keeping
        horizon = now - self.guess_ttl_s
        while g:
            h, t = next(iter(g.items()))
            if t > horizon:
                break
            del g[h]
            if h not in new:
                self._drop(h, b)

    def _drop(self, h: int, b: int) -> None:
        s = self.holders.get(h)
        if s is not None:
            s.discard(b)
            if not s:
                del self.holders[h]

    # ---- reading -----------------------------------------------------------------------------
    def num_facts(self, b: int) -> int:
        return len(self._facts.get(b, ()))

    def num_guesses(self, b: int) -> int:
        return len(self._guesses.get(b, ()))
