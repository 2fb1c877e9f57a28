"""Placement: which backend gets which request. Pure policy, driven with a time argument by the
gateway (wall clock) and by the simulator (virtual clock) — the same objects in both.

The caller's loop::

    policy = create_placement(PlacementConfig(policy="prefix"))   # scheduler.placements
    policy.add_backend(b)                        # ids are the caller's small ints
    items = [PlacementItem(cost=prompt_len + max_tokens, prefix=prefix_hashes(ids, 16))]
    policy.place(items, now)                     # sets item.backend (-1: none accepts) and
                                                 # charges item.charged to that backend's load
    policy.release(item.backend, n)              # as work is done: prefill, each token, finish
    policy.report(b, hashes, now)                # facts from the backend's LoadReport
    policy.set_capacity(b, kv_tokens)            # its KV cache in tokens (0: unknown)
    policy.set_accepting(b, False)               # draining / at its in-flight cap / down

Policies (`PlacementConfig.policy`):

- ``least-tokens``: each request to the backend with the fewest outstanding tokens.
- ``prefix``: prefix affinity with a load bound. A request goes to the least-loaded backend that
  holds its longest sampled prefix (`scheduler.prefix_index`), unless that backend's load exceeds
  ``bound = min_load * load_factor + slack``; then to the least-loaded backend. A request whose
  prefix no backend holds (cold) goes to the next backend in turn (a round-robin over the
  backends, advanced by each cold request placed so) when that backend's load is within two
  requests (twice this one's cost, at most the slack below) of the least load, else to the
  least-loaded backend. Which backend a new tenant lands on thus depends on the order new
  prefixes arrive in, not on which backend finished a few tokens sooner: with least-loaded
  picks, near-ties decided it, so the live gateway and the simulator, whose step times differ
  by tens of percent on a shared CPU, assigned whole tenants differently (with one request as
  the tolerance, still so once: a tenant arriving while the next backend held one unprefilled
  new prompt and one more). Beyond that the load decides, so a faster backend in a mixed pool
  still gets more of the new prompts (with the slack as the tolerance, a vLLM + tidegate pool
  split unique prompts 48/48). (Not a hash of the prompt: the simulator's token ids are not the
  live trace's, only its prefix structure is.) The slack is
  ``load_slack_fraction`` of the least-loaded backend's KV capacity in tokens (as its LoadReports
  give it; ``load_slack_tokens`` when it reports none, or when set): a fixed number of tokens
  meant one thing on an H200 (8,192 = 4 % of a 6.7B model's 212k-token cache) and another on a
  CPU backend of 44k tokens, where it was never reached and one hot prefix stayed on one
  backend. The
  bound is what keeps one hot prefix from making one hot backend: the spill-over backend caches
  the prefix too and becomes a holder, so a hot prefix spreads over as many backends as its load
  needs. A request placed where its prefix is held is charged its cost minus the held tokens
  (they will not be prefilled again).
- ``window``: the whole flushed window at once, which only a batching gateway can do: requests
  sharing a prefix are placed one after the other (the first one's guess pulls the rest to the
  same backend, where they share one prefill in the same step), groups and then loners in order
  of decreasing token cost (longest-processing-time-first packing), each with the rule above.
- ``ttft``: each request where it is predicted to start soonest: queue, prefill of the part not
  cached there, decode load (`scheduler.ttft_placement`), windows placed as ``window`` does.

Sessions (issue 30, `scheduler.sessions`): an item may carry a `SessionInfo` (a session key,
its prompt's chain hashes, a pin). ``prefix`` and ``window`` then keep the request on its
session's backend, or the backend holding a pin or the whole earlier prompt it extends (a
sub-agent forked from its parent), while that backend is within the load bound above; otherwise
the rule above decides and the session has moved (`sessions.num_moves`).

Every pick is O(log backends): the least-loaded backend comes from a lazy heap (`LoadIndex`), and
a holder set is scanned only up to `max_holders_scanned` entries after the least-loaded backend
itself was checked.
"""
from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from scheduler.load_index import LoadIndex
from scheduler.prefix_index import DEPTHS, PrefixIndex, prefix_hashes
from scheduler.sessions import SessionAffinity, SessionInfo

POLICIES = ("least-tokens", "prefix", "window", "ttft")
TIE_BREAKS = ("load", "hash")

__all__ = ["DEPTHS", "POLICIES", "LeastTokensPlacement", "PlacementConfig", "PlacementItem",
           "PrefixAffinityPlacement", "WindowPlacement", "prefix_hashes"]


@dataclass(frozen=True)
class PlacementConfig:
    policy: str = "prefix"             # least-tokens | prefix | window
    block_size: int = 16               # tokens per KV block (the backends'): prefix hashing unit
    load_factor: float = 1.25          # a holder may carry this many times the least load ...
    # ... plus a slack before requests spill over: this fraction of the least-loaded backend's
    # KV capacity in tokens, or `load_slack_tokens` when its capacity is unknown (HTTP servers)
    load_slack_fraction: float = 0.04
    load_slack_tokens: int = 8192
    fixed_slack: bool = False          # True: always `load_slack_tokens` (`--placement-slack-tokens`)
    guess_ttl_s: float = 2.0           # see scheduler.prefix_index
    max_guesses: int = 4096            # per backend, when it reports no facts
    max_holders_scanned: int = 8       # bound on the work of one affinity lookup
    # ttft (scheduler.ttft_placement): predictions within this fraction of the best are ties
    ttft_tolerance: float = 0.1
    # ttft: how near-ties with equal cache holdings are broken: "load" (the least load in
    # tokens) or "hash" (a rendezvous hash of the request's cost, prompt length and its rank
    # among the window's requests of that cost: what the gateway and the simulator see alike)
    ttft_tie_break: str = "load"
    max_scanned_backends: int = 16     # ttft: past this many, a few candidates only

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown placement policy {self.policy!r}; one of {', '.join(POLICIES)}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if not self.load_factor >= 1.0:
            raise ValueError(f"load_factor must be >= 1, got {self.load_factor}")
        if self.load_slack_tokens < 0:
            raise ValueError(f"load_slack_tokens must be >= 0, got {self.load_slack_tokens}")
        if not 0.0 <= self.load_slack_fraction <= 1.0:
            raise ValueError(f"load_slack_fraction must be in [0, 1], got {self.load_slack_fraction}")
        if not self.ttft_tolerance >= 0.0 or self.max_scanned_backends < 1:
            raise ValueError("ttft_tolerance must be >= 0 and max_scanned_backends >= 1")
        if self.ttft_tie_break not in TIE_BREAKS:
            raise ValueError(f"ttft_tie_break must be one of {', '.join(TIE_BREAKS)}, "
                             f"got {self.ttft_tie_break!r}")

    @property
    def uses_prefixes(self) -> bool:
        return self.policy != "least-tokens"


class PlacementItem:
    """One request to place: its token cost and its prompt's prefix hashes (shallowest first)."""

    __slots__ = ("backend", "charged", "cost", "payload", "prefix", "prompt_len", "queue_class",
                 "session")

    def __init__(self, cost: int, prefix: Sequence[int] = (), payload: object = None,
                 session: SessionInfo | None = None, queue_class: int = 2,
                 prompt_len: int | None = None) -> None:
        self.cost = cost
        self.prefix = prefix
        self.payload = payload
        self.session = session  # scheduler.sessions; None: placed by its prefix alone
        self.queue_class = queue_class  # ttft: which requests count as ahead of it
        self.prompt_len = prompt_len    # ttft: its prefill (None: the cost)
        self.backend = -1       # set by place(); -1 = no backend accepts requests
        self.charged = 0        # tokens added to the backend's load by place()


class LeastTokensPlacement:
    """Each request to the accepting backend with the fewest outstanding tokens."""

    name = "least-tokens"

    def __init__(self, config: PlacementConfig = PlacementConfig()) -> None:
        self.config = config
        self.loads = LoadIndex()
        self.slack: list[int] = []  # by backend id: the load bound's slack when it is least loaded

    # ---- membership ------------------------------------------------------------------------
    def add_backend(self, b: int) -> None:
        self.loads.add(b)
        while len(self.slack) <= b:
            self.slack.append(self.config.load_slack_tokens)
        self.slack[b] = self.config.load_slack_tokens

    def set_capacity(self, b: int, kv_tokens: int) -> None:
        """`b`'s KV cache holds `kv_tokens` tokens (0: unknown): the slack of the load bound
        when `b` is the least-loaded backend scales with it."""
        cfg = self.config
        if b < len(self.slack) and not cfg.fixed_slack:
            self.slack[b] = (int(kv_tokens * cfg.load_slack_fraction) if kv_tokens > 0
                             else cfg.load_slack_tokens)

    def remove_backend(self, b: int) -> None:
        self.loads.remove(b)

    def set_accepting(self, b: int, accepting: bool) -> None:
        self.loads.set_accepting(b, accepting)

    # ---- load and facts --------------------------------------------------------------------
    def load(self, b: int) -> int:
        return self.loads.load[b]

    def charge(self, b: int, tokens: int) -> None:
        """`tokens` of work were given to `b` outside `place` (e.g. a retry after a failure)."""
        self.loads.add_load(b, tokens)

    def release(self, b: int, tokens: int) -> None:
        """`tokens` of work charged to `b` are done (or will never be done)."""
        self.loads.add_load(b, -tokens)

    def report(self, b: int, hashes: Iterable[int], now: float) -> None:
        """Facts from `b`'s LoadReport; least-tokens has no use for them."""

    # ---- decisions -------------------------------------------------------------------------
    def place(self, items: Sequence[PlacementItem], now: float) -> None:
        for it in items:
            it.backend, it.charged = self.place_one(it.cost, it.prefix, now)

    def place_one(self, cost: int, prefix: Sequence[int], now: float,
                  session: SessionInfo | None = None) -> tuple[int, int]:
        """`place` for a window of one request, without an item: (backend or -1, tokens
        charged to it). Least-tokens ignores sessions."""
        loads = self.loads
        b = loads.least()
        if b is None:
            return -1, 0
        loads.add_load(b, cost)
        return b, cost


class PrefixAffinityPlacement(LeastTokensPlacement):
    """Least-loaded holder of the longest prefix within the load bound, else least-loaded."""

    name = "prefix"

    def __init__(self, config: PlacementConfig = PlacementConfig(policy="prefix")) -> None:
        super().__init__(config)
        self.index = PrefixIndex(config.guess_ttl_s, config.max_guesses)
        self.num_affinity = 0       # placed on a holder of their prefix
        self.num_spilled = 0        # had a holder, all over the bound
        self.num_cold = 0           # no backend held any of their prefix
        self.num_home = 0           # of those, placed on the backend whose turn it was
        self._turn = 0              # the round-robin's cursor over `loads.backends`
        self.sessions = SessionAffinity()

    def add_backend(self, b: int) -> None:
        super().add_backend(b)
        self.index.add_backend(b)

    def remove_backend(self, b: int) -> None:
        super().remove_backend(b)
        self.index.remove_backend(b)
        self.sessions.remove_backend(b)

    def report(self, b: int, hashes: Iterable[int], now: float) -> None:
        self.index.report(b, hashes, now)

    def place(self, items: Sequence[PlacementItem], now: float) -> None:
        for it in items:
            it.backend, it.charged = self.place_one(it.cost, it.prefix, now, it.session)

    def _place_one(self, it: PlacementItem, now: float) -> None:
        it.backend, it.charged = self.place_one(it.cost, it.prefix, now, it.session)

    def place_one(self, cost: int, prefix: Sequence[int], now: float,
                  session: SessionInfo | None = None) -> tuple[int, int]:
        loads = self.loads
        least = loads.least()
        if least is None:
            return -1, 0
        if session is not None:
            b = self._session_pick(cost, prefix, now, session, least)
            if b is not None:
                return b
        b, depth = least, 0
        # a new keyed session shares at most a common prefix (a system prompt) with what is
        # placed: it is spread as a cold prefix is, or one shared system prompt would gather
        # every new session on its holder (charged what its backend holds of the prefix)
        new_session = session is not None and session.key is not None and session.home < 0
        if prefix:
            b, depth = (-1, 0) if new_session else self._holder(prefix, least)
            if b < 0:  # cold: the next in turn, unless that is two requests busier or more
                b = least
                ids = loads.backends
                turn = ids[self._turn % len(ids)]
                if turn == least or (loads.accepting[turn] and loads.load[turn] <
                                     loads.load[least] + min(2 * cost, self.slack[least])):
                    b = turn
                    self._turn += 1
                    self.num_home += 1
            if new_session:
                holds = self.index.holds
                depth = next((d + 1 for d in range(len(prefix) - 1, -1, -1)
                              if holds(b, prefix[d])), 0)
        held = 0
        if depth:
            held = min(cost - 1, DEPTHS[depth - 1] * self.config.block_size)
        charged = cost - held
        loads.add_load(b, charged)
        if prefix:
            self.index.guess(b, prefix, now)
        if session is not None:
            self.sessions.record(session, b, now)
        return b, charged

    def _session_pick(self, cost: int, prefix: Sequence[int], now: float, session: SessionInfo,
                      least: int) -> tuple[int, int] | None:
        """The session's backend within the load bound (scheduler.sessions), charged the cost
        less the blocks it holds; None: the prefix rule decides."""
        load = self.loads.load
        bound = load[least] * self.config.load_factor + self.slack[least]
        b, blocks = self.sessions.pick(session, load, self.loads.accepting, bound, now)
        if b < 0:
            return None
        charged = cost - min(cost - 1, blocks * self.config.block_size)
        self.loads.add_load(b, charged)
        if prefix:
            self.index.guess(b, prefix, now)
        self.sessions.record(session, b, now)
        return b, charged

    def _holder(self, prefix: Sequence[int], least: int) -> tuple[int, int]:
        """(backend, matched depth index + 1): the deepest prefix some accepting backend within
        the load bound holds; (least, 0) when holders exist but all are over the bound (spill:
        to the least-loaded), (-1, 0) when no backend holds any of it (cold)."""
        load, accepting = self.loads.load, self.loads.accepting
        cfg = self.config
        bound = load[least] * cfg.load_factor + self.slack[least]
        holders = self.index.holders
        spilled = False
        for d in range(len(prefix) - 1, -1, -1):
            s = holders.get(prefix[d])
            if not s:
                continue
            if least in s:
                self.num_affinity += 1
                return least, d + 1
            best, best_load = -1, 0
            for scanned, b in enumerate(s, 1):
                if accepting[b]:
                    lb = load[b]
                    if lb <= bound and (best < 0 or lb < best_load or (lb == best_load and b < best)):
                        best, best_load = b, lb
                if scanned >= cfg.max_holders_scanned:
                    break
            if best >= 0:
                self.num_affinity += 1
                return best, d + 1
            spilled = True
        if spilled:
            self.num_spilled += 1
            return least, 0
        self.num_cold += 1
        return -1, 0


class WindowPlacement(PrefixAffinityPlacement):
    """A flushed window at once: same-prefix groups together, larger costs first."""

    name = "window"

    def place(self, items: Sequence[PlacementItem], now: float) -> None:
        if len(items) == 1:
            self._place_one(items[0], now)
            return
        groups: dict[int, list[PlacementItem]] = {}
        loners: list[PlacementItem] = []
        for it in items:
            if it.prefix:
                # the shallowest hash: requests that share their first block go together; the
                # deeper ones decide where (the longest match) once the group is placed
                groups.setdefault(it.prefix[0], []).append(it)
            else:
                loners.append(it)
        ordered = sorted(groups.values(), key=lambda g: -sum(it.cost for it in g))
        for g in ordered:
            g.sort(key=lambda it: (-len(it.prefix), -it.cost))
            for it in g:
                self._place_one(it, now)
        loners.sort(key=lambda it: -it.cost)
        for it in loners:
            self._place_one(it, now)


def add_placement_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                            defaults: PlacementConfig = PlacementConfig()) -> None:
    """--placement, --placement-load-factor, --placement-slack-tokens (gateway and simulator)."""
    parser.add_argument("--placement", choices=POLICIES, default=defaults.policy,
                        help=f"which backend gets which request (default {defaults.policy}; "
                             "see scheduler.placement)")
    parser.add_argument("--placement-load-factor", type=float, default=defaults.load_factor,
                        help="prefix affinity yields once a holder's load passes this many times "
                             f"the least load plus the slack (default {defaults.load_factor})")
    parser.add_argument("--placement-slack-tokens", type=int, default=None,
                        help="the slack of that bound, in tokens, for every backend (default: "
                             f"{defaults.load_slack_fraction:g} of the least-loaded backend's KV "
                             f"tokens, {defaults.load_slack_tokens} when it reports none)")
    parser.add_argument("--placement-tie-break", choices=TIE_BREAKS,
                        default=defaults.ttft_tie_break,
                        help="ttft placement: near-ties (within 10%% of the best prediction, "
                             "equal cache holdings) go to the least load in tokens ('load') or "
                             "by a rendezvous hash of the request's cost and rank in its window "
                             "('hash': reproducible by the simulator; see "
                             f"scheduler.ttft_placement; default {defaults.ttft_tie_break})")
    parser.add_argument("--placement-ttft-tolerance", type=float, default=defaults.ttft_tolerance,
                        help="ttft placement: predictions within this fraction of the best are "
                             f"near-ties (default {defaults.ttft_tolerance:g})")


def placement_config_from_args(a: argparse.Namespace, block_size: int) -> PlacementConfig:
    fixed = a.placement_slack_tokens is not None
    return PlacementConfig(policy=a.placement, block_size=block_size,
                           load_factor=a.placement_load_factor,
                           ttft_tie_break=getattr(a, "placement_tie_break",
                                                  PlacementConfig.ttft_tie_break),
                           ttft_tolerance=getattr(a, "placement_ttft_tolerance",
                                                  PlacementConfig.ttft_tolerance),
                           load_slack_tokens=(a.placement_slack_tokens if fixed
                                              else PlacementConfig.load_slack_tokens),
                           fixed_slack=fixed)
