"""Placement by predicted time to first token (`PlacementConfig(policy="ttft")`, `--placement ttft`).

Each request goes to the backend where it is predicted to start soonest. For backend b, with
the request of class c and prompt length p (`scheduler.admission.WaitPredictor.backend_ttft`):

    ttft_b =  ahead_b(c) * gap_b          the requests of class <= c sent to b and not started,
                                          one start every gap_b (the backend's measured pace)
            + service_b(c)                its class's measured dispatch -> first token beyond the
                                          queue: the step in progress and its own ...
            + k_u,b * (u_b - mean u)      ... corrected for its own prefill: u_b = p - what b is
                                          expected to hold of the prompt (the prefix index's
                                          facts and guesses, a session's blocks) ...
            + k_d,b * (d_b - mean d)      ... and for b's decode load now: d_b sequences decoding
                                          (slopes: `scheduler.service_fit`, fitted per backend)

The backends within `ttft_tolerance` (a fraction) of the best prediction are near-ties: among
them the request goes where most of its prompt is held (then the session's backend, then the
least load in tokens, then the lower id), so cache affinity decides what the prediction cannot
tell apart. The backend is charged the request's cost less what it holds, as `prefix` charges.

Issue 31 (tenth session): the least load in tokens, as the last tie-break, is decided by
milliseconds of timing (a finish heard 1 ms sooner releases its tokens), so a simulator replaying
a live run, whose step ends and reads carry that jitter, picks differently among near-ties, and
every later window inherits the difference. `ttft_tie_break="hash"` (`--placement-tie-break
hash`) breaks those ties instead by rendezvous hashing: each backend's score is a hash of the
backend id and the request's key, (cost, prompt length, its rank among the requests of that
cost and length placed before it in the same window), all of which the gateway and a replay of
its trace see alike; the highest score wins. A backend entering or leaving the near-tie set at
its edge changes the pick only when it has the highest score (not, as an index into the set
would, whenever the set changes).

Until every accepting backend has measured a start (a fresh gateway, a backend just added),
the prefix rule decides (`PrefixAffinityPlacement`): a prediction of 0 for an unmeasured backend
would send it every request until its first token. A whole window is placed as `window` places
it (same-prefix groups together, larger costs first), each request by the rule above, the
predictor's queue counts growing as each one is placed (`note_placed`).

The gateway (its dispatcher's predictor) and the simulator (its gateway adapter's) attach the
same `WaitPredictor` that admission uses, fed by the same events (dispatch, first token, gone):
the same decisions on the same event sequence (`tests/test_ttft_placement.py` drives both).

Cost: O(accepting backends) per request, up to `max_scanned_backends`; past that the candidates
are the least-loaded backend, the holders of the prompt's deepest held prefix, the session's
backend and the next in turn (O(1) each).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from scheduler.admission import WaitPredictor
from scheduler.placement import DEPTHS, PlacementConfig, PlacementItem, WindowPlacement
from scheduler.sessions import SessionInfo

LAST_CLASS = 2
_TTFT = PlacementConfig(policy="ttft")


def _mix(x: int) -> int:
    """splitmix64's finalizer: a deterministic 64-bit hash of an integer (the same in every
    process, unlike hash() of str)."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


class TTFTPlacement(WindowPlacement):
    """The backend with the smallest predicted TTFT (module doc)."""

    name = "ttft"

    def __init__(self, config: PlacementConfig = _TTFT) -> None:
        super().__init__(config)
        self.predictor: WaitPredictor | None = None  # attached by the owner
        self.num_predicted = 0   # placed by prediction (the rest: by the prefix rule)
        self.num_near_ties = 0   # of those, with more than one backend within the tolerance
        # requests placed so far in the window being placed, per backend and class: ahead of
        # the later ones there, before the owner dispatches (and counts) them
        self._window: dict[int, list[int]] | None = None
        self._hash_ties = config.ttft_tie_break == "hash"
        self._ranks: dict[tuple[int, int], int] = {}  # hash ties: (cost, prompt) -> placed so far

    def place(self, items: Sequence[PlacementItem], now: float) -> None:
        self._window = {} if len(items) > 1 else None
        self._ranks = {}
        try:
            super().place(items, now)
        finally:
            self._window = None

    def _place_one(self, it: PlacementItem, now: float) -> None:
        it.backend, it.charged = self.place_one(it.cost, it.prefix, now, it.session,
                                                it.queue_class, it.prompt_len)

    def place_one(self, cost: int, prefix: Sequence[int], now: float,
                  session: SessionInfo | None = None, queue_class: int = LAST_CLASS,
                  prompt_len: int | None = None) -> tuple[int, int]:
        pred = self.predictor
        cands = self._candidates(prefix) if pred is not None else None
        if not cands:
            b, charged = super().place_one(cost, prefix, now, session)
            self.note_placed(b, queue_class)
            return b, charged
        loads = self.loads
        sess_b, sess_blocks = -1, 0
        if session is not None:
            sess_b, sess_blocks = self.sessions.pick(session, loads.load, loads.accepting,
                                                     math.inf, now)
        p = cost if prompt_len is None else prompt_len
        bs = self.config.block_size
        held_at = self._held(prefix, cands)
        rows = []  # (ttft, backend, tokens held there)
        for b in cands:
            held = held_at.get(b, 0)
            if b == sess_b:
                held = max(held, sess_blocks * bs)
            held = min(held, cost - 1, max(0, p - 1))
            extra = 0
            if self._window:
                placed = self._window.get(b)
                extra = sum(placed[: queue_class + 1]) if placed else 0
            rows.append((pred.backend_ttft(b, queue_class, p - held, extra), b, held))
        best_t = min(r[0] for r in rows)
        limit = best_t * (1.0 + self.config.ttft_tolerance)
        near = [r for r in rows if r[0] <= limit]
        if len(near) > 1:
            self.num_near_ties += 1
        if self._hash_ties:  # the rank advances whatever the near set: both sides alike
            k = (cost, p)
            rank = self._ranks.get(k, 0)
            self._ranks[k] = rank + 1
        if self._hash_ties and len(near) > 1:
            key = _mix((cost << 40) ^ (p << 20) ^ rank)
            _, b, held = max(near, key=lambda r: (r[2], r[1] == sess_b, _mix(key ^ r[1])))
        else:
            load = loads.load
            _, b, held = max(near, key=lambda r: (r[2], r[1] == sess_b, -load[r[1]], -r[1]))
        self.num_predicted += 1
        charged = cost - held
        loads.add_load(b, charged)
        if prefix:
            self.index.guess(b, prefix, now)
        if session is not None:
            self.sessions.record(session, b, now)
        self.note_placed(b, queue_class)
        return b, charged

    def note_placed(self, b: int, queue_class: int) -> None:
        """Within one window, later requests see the earlier ones as queued where they went;
        the owner's `dispatched` call, once the message is sent, counts them for good."""
        if self._window is not None and b >= 0:
            placed = self._window.get(b)
            if placed is None:
                placed = self._window[b] = [0] * (LAST_CLASS + 1)
            placed[queue_class] += 1

    def _candidates(self, prefix: Sequence[int]) -> list[int] | None:
        """The accepting backends to compare, or None when one of them has no measured start."""
        loads, pred = self.loads, self.predictor
        acc = loads.accepting
        ids = [b for b in loads.backends if acc[b]]
        if len(ids) > self.config.max_scanned_backends:
            least = loads.least()
            picked = {least, ids[self._turn % len(ids)]}
            holders = self.index.holders
            for d in range(len(prefix) - 1, -1, -1):
                s = holders.get(prefix[d])
                if s:
                    for scanned, b in enumerate(s, 1):
                        if acc[b]:
                            picked.add(b)
                        if scanned >= self.config.max_holders_scanned:
                            break
                    break
            ids = sorted(b for b in picked if b is not None)
        backends = pred.backends
        for b in ids:
            be = backends.get(b)
            if be is None or not be.service:
                return None
        return ids

    def _held(self, prefix: Sequence[int], cands: list[int]) -> dict[int, int]:
        """Per candidate holding some of the prompt: the tokens of its deepest sampled prefix
        (the holder sets read once per depth, not once per backend and depth)."""
        holders = self.index.holders
        sets = [(s, DEPTHS[d] * self.config.block_size)
                for d in range(len(prefix) - 1, -1, -1) if (s := holders.get(prefix[d]))]
        out: dict[int, int] = {}
        if sets:
            for b in cands:
                for s, tokens in sets:
                    if b in s:
                        out[b] = tokens
                        break
        return out
