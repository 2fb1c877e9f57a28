"""Speculative decoding without a draft model: the proposers and the per-step policy.

Pure Python (numpy at most), like the rest of `scheduler/`, so that the engine, the simulator
and the tests run the same code.

Sources of draft tokens (each a `Proposer`; a draft model would be one more):

    prediction  the request's predicted output (OpenAI Predicted Outputs): kept aligned to the
                output as it grows; after a mismatch (an edited line) it re-synchronises by
                finding the output's last few tokens in the prediction again
    prompt      prompt lookup (n-gram): the output's last n tokens found earlier in the prompt or
                the output, the tokens that followed them there
    session     the earlier outputs of requests that shared this one's prompt prefix (a session,
                an editor's file): a suffix index over them, same lookup

Per request, `DraftState` keeps what the proposers need (token history, n-gram indexes, the
prediction's alignment) and the measured acceptance per source. Per step, `Speculator.load`
picks each decoding sequence's draft from its most trusted source that has one (per-request
measured acceptance alpha, the backend's mean per source as prior) and `SpeculationPolicy.plan`
decides how many of its tokens go in:

* a draft's i-th token is accepted with chance q = w * alpha^i (w: the class weight, Fast and
  Normal 1, Slow 0.8); capped by the request's `max_draft_tokens` (or the server's), its class's
  cap, the draft's length, and off for requests that turned it off;
* the load: the step cost model T(n) (measured, `StepCostModel`: piecewise linear over the
  step times the engine records; flat up to `knee_tokens` until measured) prices one more token;
  drafts go in best first while each raises the step's work per second (q * T > T' * work, the
  work being the step's scheduled tokens plus the accepted drafts expected). Below the knee a
  token is nearly free (a decode step reads the weights whatever its size): every draft with
  q >= min_draft_prob goes in. At saturation a token costs its share of the step (T' n >= T)
  and none does: speculation is turned off by the policy where it would cost throughput.

Verification (the engine): k drafts are fed with the sequence's last token as one chunk; the
target token at each position is sampled exactly as a plain decode would sample it (the
sampler's noise is a function of (seed, token index), so the target is what decoding without
speculation would produce); drafts are accepted while they equal the target, and the first
target that differs (or the one after the last draft) is appended too. Greedy output is
therefore identical, and sampled output keeps its distribution (accepting a deterministic draft
d with probability p(d) and otherwise sampling from p without d is the rejection rule of
speculative sampling for a one-hot draft distribution).
"""
from __future__ import annotations

import argparse
import itertools
import math
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from heapq import heapify, heappop, heappush
from typing import Protocol

from scheduler.classes import DEFAULT_CLASS_BOUNDS, class_index
from scheduler.prediction_usage import prediction_overlap

SOURCES = ("prediction", "prompt", "session")
# prior per-token acceptance of a source never measured (per request, then the backend's mean)
PRIOR_ACCEPTANCE = {"prediction": 0.85, "prompt": 0.5, "session": 0.5, "draft_model": 0.6}


# ---- configuration --------------------------------------------------------------------------
@dataclass(frozen=True)
class SpeculationConfig:
    """The server's default (`--speculation ...` flags)."""

    enabled: bool = True
    max_draft_tokens: int = 8  # per sequence per step (a request may ask for fewer)
    sources: tuple[str, ...] = SOURCES
    # step tokens below which a step costs about one decode step (where no measurement yet)
    knee_tokens: int = 128
    # relative cost of one more token in a step below the knee: draft i is proposed while its
    # acceptance chance alpha^i is at least this
    min_draft_prob: float = 0.15
    # per queue class (fast, normal, slow): the most draft tokens a sequence of that class gets,
    # and the weight of its drafts' acceptance chance (Fast and Normal speculate first)
    class_max: tuple[int, int, int] = (16, 16, 8)
    class_weight: tuple[float, float, float] = (1.0, 1.0, 0.8)
    class_bounds: tuple[int, int] = DEFAULT_CLASS_BOUNDS
    ngram_max: int = 4  # prompt / session lookup: longest and shortest suffix matched
    ngram_min: int = 2
    # prompt lookup: tokens indexed per step at most, over all requests (a batch of long new
    # prompts is indexed over a few steps instead of stalling one: PromptLookupProposer); 0: no
    # limit
    lookup_index_tokens_per_step: int = 4096
    resync_ngram: int = 3  # prediction: tokens of the output's suffix matched to re-align
    session_prefix_tokens: int = 64  # prompt tokens that name a session (its key)
    max_sessions: int = 256
    max_session_tokens: int = 1 << 16  # per session, earliest outputs dropped first
    # every sequence's acceptance estimate forgets at this rate per verify
    decay: float = 0.9

    def __post_init__(self) -> None:
        if self.max_draft_tokens < 0:
            raise ValueError("max_draft_tokens must be >= 0")
        if self.knee_tokens < 1:
            raise ValueError("knee_tokens must be >= 1")
        if not 0.0 < self.min_draft_prob <= 1.0:
            raise ValueError("min_draft_prob must be in (0, 1]")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError("need 1 <= ngram_min <= ngram_max")
        if self.resync_ngram < 1:
            raise ValueError("resync_ngram must be >= 1")
        if self.lookup_index_tokens_per_step < 0:
            raise ValueError("lookup_index_tokens_per_step must be >= 0")
        unknown = set(self.sources) - set(SOURCES)
        if unknown:
            raise ValueError(f"unknown speculation sources {sorted(unknown)}; known: {SOURCES}")


def add_speculation_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--speculation on|off, --speculation-max-draft-tokens, --speculation-sources,
    --speculation-knee-tokens, --speculation-index-tokens."""
    d = SpeculationConfig()
    parser.add_argument("--speculation", choices=("on", "off"), default="on",
                        help="speculative decoding from the request's prediction, prompt lookup "
                             "and the session's earlier outputs, under the load policy "
                             "(default on)")
    parser.add_argument("--speculation-max-draft-tokens", type=int, default=d.max_draft_tokens,
                        help=f"draft tokens per sequence per step at most (default "
                             f"{d.max_draft_tokens}); a request may ask for fewer")
    parser.add_argument("--speculation-sources", default=",".join(d.sources),
                        help=f"comma-separated draft sources (default {','.join(d.sources)})")
    parser.add_argument("--speculation-knee-tokens", type=int, default=d.knee_tokens,
                        help=f"step tokens below which a step costs about one decode step, until "
                             f"measured (default {d.knee_tokens})")
    parser.add_argument("--speculation-index-tokens", type=int,
                        default=d.lookup_index_tokens_per_step,
                        help=f"prompt lookup indexes at most this many tokens of new prompts per "
                             f"step, over all requests, so that a batch of long prompts does not "
                             f"stall one step (default {d.lookup_index_tokens_per_step}; 0: no "
                             f"limit)")


def speculation_config_from_args(args: argparse.Namespace) -> SpeculationConfig:
    sources = tuple(s.strip() for s in str(args.speculation_sources).split(",") if s.strip())
    return SpeculationConfig(enabled=args.speculation == "on",
                             max_draft_tokens=args.speculation_max_draft_tokens,
                             sources=sources, knee_tokens=args.speculation_knee_tokens,
                             lookup_index_tokens_per_step=getattr(
                                 args, "speculation_index_tokens",
                                 SpeculationConfig.lookup_index_tokens_per_step))


# ---- n-gram indexes ---------------------------------------------------------------------------
class NgramIndex:
    """The latest start of every n-gram (n in [n_min, n_max]) of a growing token list that has
    at least one token after it. `lookup(suffix_tokens)` -> where the longest matching n-gram's
    continuation starts, or -1. O(n_max - n_min + 1) dict operations per appended token.

    An n-gram's key is one int, its tokens as digits in base 2^32 (`key`): a table of ints to
    ints holds no object the cyclic GC tracks, so it is never scanned by a collection and
    building it allocates none that would trigger one (tuple keys did both: a batch of long
    prompts set off collections that then traversed every live table), and a table is built by
    one pass of list comprehensions per n over the new tokens (~0.9 ms for 3,000 tokens)."""

    __slots__ = ("n_max", "n_min", "tables", "tokens")
    BASE = 1 << 32  # above any token id

    def __init__(self, n_min: int, n_max: int, tokens: Iterable[int] = ()) -> None:
        self.n_min, self.n_max = n_min, n_max
        self.tokens: list[int] = []
        self.tables: list[dict[int, int]] = [{} for _ in range(n_max - n_min + 1)]
        self.extend(tokens)

    @classmethod
    def key(cls, gram: Sequence[int]) -> int:
        k = 0
        for t in gram:
            k = k * cls.BASE + t
        return k

    def extend(self, new: Iterable[int]) -> None:
        """Append tokens: the n-grams that end just before each new token now have one after
        them (their continuation starts there), in order, so that a later start overwrites an
        earlier one (the latest start is kept)."""
        tokens = self.tokens
        old = len(tokens)
        tokens.extend(map(int, new))
        total = len(tokens)
        if total == old:
            return
        n_min, base = self.n_min, self.BASE
        lo = max(0, old - self.n_max)  # the first start any table needs
        keys = tokens[lo:total - 1]  # the 1-grams' keys by start, lo..total-2
        for n in range(1, self.n_max + 1):
            if n > 1:  # the n-grams' keys by start (lo..total-1-n) from the (n-1)-grams'
                keys = [k * base + t for k, t in zip(keys, tokens[lo + n - 1:total - 1])]
            if n >= n_min:
                first = max(old - n, 0)  # the first start whose continuation is new
                self.tables[n - n_min].update(zip(keys[first - lo:], range(first + n, total)))

    def lookup(self, suffix: Sequence[int]) -> int:
        """Where the continuation of the longest n-gram that ends `suffix` starts, or -1."""
        for n in range(min(self.n_max, len(suffix)), self.n_min - 1, -1):
            pos = self.tables[n - self.n_min].get(self.key(suffix[len(suffix) - n:]))
            if pos is not None:
                return pos
        return -1


# ---- per-request state ----------------------------------------------------------------------
class Acceptance:
    """A decayed count of draft tokens tried and accepted (one source of one request)."""

    __slots__ = ("accepted", "tried")

    def __init__(self) -> None:
        self.tried = 0.0
        self.accepted = 0.0

    def observe(self, num_drafted: int, num_accepted: int, decay: float) -> None:
        # a verify of k drafts with a accepted is a accepted trials, plus one rejection if a < k
        trials = num_accepted + (1 if num_accepted < num_drafted else 0)
        self.tried = self.tried * decay + trials
        self.accepted = self.accepted * decay + num_accepted

    def rate(self, prior: float, weight: float = 2.0) -> float:
        return (self.accepted + prior * weight) / (self.tried + weight)


@dataclass
class DraftState:
    """What the proposers keep of one sequence. `prompt` and `output` are the sequence's tokens
    (the output grows through `append`)."""

    request_id: str
    prompt: Sequence[int]
    prediction: Sequence[int] | None = None
    max_draft_tokens: int = 0  # the request's cap; 0: the server's
    off: bool = False
    session_key: int | None = None
    output: list[int] = field(default_factory=list)
    # prediction alignment: index of the next predicted token, -1 when lost; the last index it
    # was aligned at (a re-synchronisation looks after it first)
    pred_pos: int = 0
    pred_anchor: int = 0
    pred_unmatched: int = 0  # output tokens since the last one counted as matched
    # prediction tokens before this index are accounted for (matched, or passed over): a
    # re-synchronisation that goes back to an earlier place (code repeats its n-grams) never
    # counts a prediction token twice
    pred_frontier: int = 0
    pred_index: NgramIndex | None = None
    history: NgramIndex | None = None  # prompt + output (prompt lookup)
    acceptance: dict[str, Acceptance] = field(default_factory=dict)
    # counters (cumulative, reported on the wire)
    num_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0
    num_prediction_drafted: int = 0
    num_accepted_prediction_tokens: int = 0  # drafted from the prediction and accepted
    num_rejected_prediction_tokens: int = 0  # drafted from the prediction and rejected so far
    # output tokens that followed the prediction (aligned, or the n-gram that re-aligned it),
    # each prediction token at most once: the running count of OpenAI's
    # accepted_prediction_tokens, whether or not they were drafted (`prediction_usage` at the end)
    num_matched_prediction_tokens: int = 0
    # the last proposal's source (what the verify's outcome is credited to)
    last_source: str = ""
    last_draft: list[int] = field(default_factory=list)
    # this step's choice (Speculator.load): the source and its draft, up to the caps
    pending_source: str = ""
    pending_draft: list[int] | None = None

    def prediction_unused(self) -> int:
        """Predicted tokens that did not make it into the output (OpenAI's
        rejected_prediction_tokens at the end of a request)."""
        if not self.prediction:
            return 0
        return max(0, len(self.prediction) - self.num_matched_prediction_tokens)

    def prediction_passed_over(self) -> int:
        """Predicted tokens the output has gone past without using them, so far (the running
        count of OpenAI's rejected_prediction_tokens)."""
        return self.pred_frontier - self.num_matched_prediction_tokens if self.prediction else 0

    def prediction_usage(self) -> tuple[int, int]:
        """OpenAI's (accepted, rejected) prediction tokens of the output: the prediction's
        tokens that appear, in order, in it, and the rest; the gateway's count
        (`scheduler.prediction_usage`), exactly. O(prediction + output): asked at the finish."""
        if not self.prediction:
            return 0, 0
        accepted = prediction_overlap(self.prediction, self.output)
        return accepted, len(self.prediction) - accepted


# ---- proposers --------------------------------------------------------------------------------
class Proposer(Protocol):
    """A source of draft tokens. `propose` returns up to `k` tokens that would follow the
    sequence's tokens (`state.prompt + state.output`). A draft model would implement
    `propose_batch` to run one forward pass for every sequence of a step."""

    source: str

    def propose(self, state: DraftState, k: int) -> list[int]: ...


class PredictionProposer:
    """Drafts from the request's prediction, aligned to the output as it grows.

    `state.pred_pos` is the index in the prediction of the token expected next. Each appended
    output token that equals the prediction there moves it on; one that differs loses the
    alignment, which is found again when the output's last `resync_ngram` tokens occur in the
    prediction (the first occurrence at or after the last aligned place, else the first
    anywhere): an edit rewrote a line, the output is back to the predicted text after it."""

    source = "prediction"

    def __init__(self, resync_ngram: int = 3) -> None:
        self.resync_ngram = resync_ngram

    def start(self, state: DraftState) -> None:
        if state.prediction is not None and len(state.prediction):
            state.pred_pos = 0  # (its n-gram index is built at the first mismatch: observe)
        else:
            state.pred_pos = -1

    def observe(self, state: DraftState, new_tokens: Sequence[int]) -> None:
        pred = state.prediction
        if not pred:
            return
        out = state.output  # already extended by new_tokens
        start = len(out) - len(new_tokens)
        pos = state.pred_pos
        last_good = state.pred_anchor
        frontier = state.pred_frontier
        matched, unmatched = 0, state.pred_unmatched
        for i, tok in enumerate(new_tokens):
            if pos >= 0 and pos < len(pred) and pred[pos] == tok:
                if pos >= frontier:  # (not if a re-synchronisation went back before it)
                    matched += 1
                    frontier = pos + 1
                pos += 1
                last_good = pos
                unmatched = 0
                continue
            # off the prediction: look for the output's suffix in it
            unmatched += 1
            pos = -1
            end = start + i + 1
            n = self.resync_ngram
            if end >= n:
                index = state.pred_index
                if index is None:  # O(prediction), once, off the admission path
                    index = state.pred_index = _PositionsIndex(pred, n)
                pos = index.find_after(tuple(out[end - n:end]), last_good)
                if pos >= 0:  # the n-gram is in the prediction: its uncounted tokens match
                    # the prediction's tokens before `pos` not counted yet (a monotone match)
                    matched += max(0, min(n, unmatched, pos - frontier))
                    frontier = max(frontier, pos)
                    unmatched = 0
                    last_good = pos
        state.pred_pos = pos
        state.pred_anchor = last_good
        state.pred_frontier = frontier
        state.pred_unmatched = unmatched
        state.num_matched_prediction_tokens = min(
            len(pred), state.num_matched_prediction_tokens + matched)

    def propose(self, state: DraftState, k: int) -> list[int]:
        pred, pos = state.prediction, state.pred_pos
        if not pred or pos < 0 or k <= 0:
            return []
        return list(pred[pos:pos + k])


class _PositionsIndex:
    """Every start of every n-gram of a fixed token list (the prediction), sorted."""

    __slots__ = ("n", "starts")

    def __init__(self, tokens: Sequence[int], n: int) -> None:
        self.n = n
        self.starts: dict[tuple[int, ...], list[int]] = {}
        starts = self.starts
        toks = [int(t) for t in tokens]
        num = len(toks) - n + 1
        if num <= 0:
            return
        for s, gram in enumerate(zip(*[toks[i:num + i] for i in range(n)])):
            at = starts.get(gram)
            if at is None:
                starts[gram] = [s]
            else:
                at.append(s)

    def find_after(self, gram: tuple[int, ...], at_least: int) -> int:
        """The index after the first occurrence of `gram` that ends past `at_least` (the output
        moved on from there), else after the last occurrence before it; -1 if it does not
        occur."""
        starts = self.starts.get(gram)
        if not starts:
            return -1
        n = self.n
        i = bisect_right(starts, at_least - n)
        return starts[i] + n if i < len(starts) else starts[-1] + n


def _index_more(h: NgramIndex, state: DraftState, take: int) -> None:
    """Index the next `take` of the sequence's tokens (its prompt, then its output)."""
    have, num_prompt = len(h.tokens), len(state.prompt)
    end = have + take
    if have < num_prompt:
        h.extend(state.prompt[have:min(end, num_prompt)])
    if end > num_prompt:
        h.extend(state.output[max(have, num_prompt) - num_prompt:end - num_prompt])


class PromptLookupProposer:
    """Prompt lookup: the output's last n tokens (longest first) found earlier in the prompt or
    the output; the draft is what followed them there. The index over the prompt and the output
    is built from the first time a draft is asked for (a request served while the backend is
    saturated never pays for it: ~3 dict entries per prompt token), then kept up to date.

    Building it is O(prompt) on the serving loop, and a batch of new requests asks for their
    first drafts in the same step: 12 prompts of 3,100 tokens held an H200 step's planning
    for ~150 ms (issue 28's c=32 edit run). So at most `tokens_per_step` tokens are indexed
    per step over all requests (`new_step` starts the next step's allowance); a request whose
    index is not caught up with its tokens yet gets no prompt-lookup draft in that step (its
    other sources still draft; an engine that pipelines its steps keeps asking for drafts while
    an index catches up: `DraftBackoff.hold`). None: no limit."""

    source = "prompt"

    def __init__(self, n_min: int = 2, n_max: int = 4,
                 tokens_per_step: int | None = None) -> None:
        self.n_min, self.n_max = n_min, n_max
        self.tokens_per_step = tokens_per_step
        self.budget = tokens_per_step  # tokens this step may still index
        self.starved = False  # this step left some index behind its tokens

    def new_step(self) -> None:
        self.budget = self.tokens_per_step
        self.starved = False

    def observe(self, state: DraftState, new_tokens: Sequence[int]) -> None:
        h = state.history
        # only an index that had caught up: otherwise its catch-up reads these from the output
        if h is not None and \
                len(h.tokens) + len(new_tokens) == len(state.prompt) + len(state.output):
            h.extend(new_tokens)

    def caught_up(self, state: DraftState) -> bool:
        """Index the sequence's tokens not indexed yet, within the step's allowance; whether
        the index now holds all of them."""
        h = state.history
        if h is None:
            h = state.history = NgramIndex(self.n_min, self.n_max)
        need = len(state.prompt) + len(state.output) - len(h.tokens)
        if need <= 0:
            return True
        take = need if self.budget is None else min(need, self.budget)
        if take < need:
            self.starved = True
        if take <= 0:
            return False
        if self.budget is not None:
            self.budget -= take
        _index_more(h, state, take)
        return take == need

    def index_ahead(self, states: Iterable[DraftState], budget: int | None) -> int:
        """Index up to `budget` tokens (None: all) of the sequences whose index has been started
        (a draft was asked for them) but is behind their tokens; returns how many. Separate from
        the step's allowance: an engine whose steps run on a device calls this (through
        `Speculator.index_ahead`) right after a launch, so that the catch-up runs while the
        device computes instead of in the next step's planning, which a drafting step waits for
        (issue 28's H200 edit runs at c = 32: ~4,096 tokens indexed in most steps' planning,
        ~1.5-2 ms of 31-34 ms steps). Indexes that were never asked for stay unbuilt: a request
        served at saturation still never pays for one."""
        done = 0
        for state in states:
            h = state.history
            if h is None or state.off:
                continue
            need = len(state.prompt) + len(state.output) - len(h.tokens)
            if need <= 0:
                continue
            take = need if budget is None else min(need, budget - done)
            if take <= 0:
                break
            _index_more(h, state, take)
            done += take
        return done

    def propose(self, state: DraftState, k: int) -> list[int]:
        if k <= 0 or not self.caught_up(state):
            return []
        h = state.history
        toks = h.tokens
        pos = h.lookup(toks[max(0, len(toks) - self.n_max):])
        if pos < 0:
            return []
        return toks[pos:pos + k]


class SessionStore:
    """Earlier outputs per session key (the hash of a prompt's first tokens), with one n-gram
    index each; bounded (least recently used sessions and the earliest tokens go first).

    An index cannot drop its earliest tokens in place, and re-indexing a session's latest tokens
    when it reaches `max_tokens` held the serving loop: cutting to the cap rebuilt a 65K-token
    index at every finish of a long session (34 ms each on a 2-core Xeon, against 0.26 ms below
    the cap). So once a session holds half its cap, a second index (the shadow) starts taking
    its new tokens too; when the next output would pass the cap, the shadow (>= max_tokens / 2
    of the latest tokens) replaces the index and a new shadow starts. Each token is indexed at
    most twice, no record rebuilds anything, and lookups always see the latest half cap at
    least, the whole cap at most."""

    def __init__(self, n_min: int = 2, n_max: int = 4, max_sessions: int = 256,
                 max_tokens: int = 1 << 16) -> None:
        self.n_min, self.n_max = n_min, n_max
        self.max_sessions, self.max_tokens = max_sessions, max_tokens
        self._sessions: OrderedDict[int, NgramIndex] = OrderedDict()
        self._shadows: dict[int, NgramIndex] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def clear(self) -> None:
        self._sessions.clear()
        self._shadows.clear()

    def record(self, key: int | None, output: Sequence[int]) -> None:
        """A finished output of session `key` becomes lookup material for its next requests."""
        if key is None or not len(output):
            return
        output = [int(t) for t in output[-self.max_tokens:]]
        index = self._sessions.pop(key, None)
        if index is None:
            index = NgramIndex(self.n_min, self.n_max)
        shadow = self._shadows.pop(key, None)
        if len(index.tokens) + len(output) > self.max_tokens:
            # the shadow holds the latest tokens since the index passed half its cap
            index = shadow if shadow is not None else NgramIndex(self.n_min, self.n_max)
            shadow = None
            if len(index.tokens) + len(output) > self.max_tokens:  # one output over half the cap
                index = NgramIndex(self.n_min, self.n_max)
        index.extend(output)
        if shadow is not None:
            shadow.extend(output)
        elif len(index.tokens) >= self.max_tokens // 2:
            # starts now, empty: from here the new tokens go to both
            shadow = NgramIndex(self.n_min, self.n_max)
        self._sessions[key] = index
        if shadow is not None:
            self._shadows[key] = shadow
        while len(self._sessions) > self.max_sessions:
            old, _ = self._sessions.popitem(last=False)
            self._shadows.pop(old, None)

    def get(self, key: int | None) -> NgramIndex | None:
        if key is None:
            return None
        index = self._sessions.get(key)
        if index is not None:
            self._sessions.move_to_end(key)
        return index


class SessionProposer:
    """Drafts from what earlier requests of the same session generated (a suffix index per
    session): the output's last n tokens found in those outputs, what followed them there."""

    source = "session"

    def __init__(self, store: SessionStore) -> None:
        self.store = store

    def propose(self, state: DraftState, k: int) -> list[int]:
        index = self.store.get(state.session_key)
        if index is None or k <= 0:
            return []
        n = self.store.n_max  # (the last n tokens, without copying the whole output)
        tail = state.output[-n:]
        if len(tail) < n:
            tail = (list(state.prompt[-n:]) + tail)[-n:]
        pos = index.lookup(tail)
        if pos < 0:
            return []
        return index.tokens[pos:pos + k]


def session_key(prompt: Sequence[int], num_tokens: int) -> int | None:
    """The session a prompt belongs to: the hash of its first `num_tokens` tokens (None when
    the prompt is shorter: too little to name one)."""
    if len(prompt) < num_tokens:
        return None
    return hash(tuple(int(t) for t in prompt[:num_tokens]))


# ---- the step cost (the knee) -------------------------------------------------------------------
class StepCostModel:
    """Measured step time by scheduled tokens (power-of-two buckets, a running mean each).
    `knee()`: the most tokens a step may carry for at most `slack` more time than the smallest
    measured step; None until two buckets are measured."""

    MIN_COUNT = 3  # steps a bucket needs before its mean is used

    def __init__(self, slack: float = 0.25, alpha: float = 0.2, prior_knee: int = 128) -> None:
        self.slack, self.alpha = slack, alpha
        # below the smallest measured bucket the time is scaled down from it by the prior's shape
        # (flat up to prior_knee tokens, proportional past it); the policy sets it to its
        # configured knee_tokens
        self.prior_knee = prior_knee
        self._mean: dict[int, float] = {}
        self._count: dict[int, int] = {}
        # the buckets measured MIN_COUNT times or more, sorted: `time` runs for every draft the
        # policy weighs (~250 calls a plan at 32 sequences), and sorting the buckets in each
        # call was a third of the plan's time
        self._ready: list[int] = []

    @staticmethod
    def bucket(num_tokens: int) -> int:
        return 1 << max(0, (max(1, num_tokens) - 1).bit_length())

    def observe(self, num_tokens: int, seconds: float) -> None:
        if num_tokens < 1 or not seconds > 0.0:
            return
        b = self.bucket(num_tokens)
        old = self._mean.get(b)
        self._mean[b] = seconds if old is None else old + self.alpha * (seconds - old)
        count = self._count[b] = self._count.get(b, 0) + 1
        if count == self.MIN_COUNT:
            self._ready = sorted(self._ready + [b])

    def knee(self, min_count: int = MIN_COUNT) -> int | None:
        """Between two measured buckets the time is taken as linear in the tokens (a step of
        9 tokens is rarely measured before drafting starts, a 512-token prefill often is)."""
        buckets = sorted(b for b, c in self._count.items() if c >= min_count)
        if len(buckets) < 2:
            return None
        base = self._mean[buckets[0]]
        limit = base * (1.0 + self.slack)
        knee = buckets[0]
        for lo, hi in itertools.pairwise(buckets):
            t_lo, t_hi = max(self._mean[lo], base), self._mean[hi]
            if t_hi <= limit:
                knee = hi
                continue
            if t_hi > t_lo:  # where the line from lo to hi crosses the limit
                knee = max(knee, lo + int((limit - t_lo) / (t_hi - t_lo) * (hi - lo)))
            break
        return knee

    def time(self, num_tokens: int, min_count: int = MIN_COUNT) -> float | None:
        """T(num_tokens): piecewise linear between the measured buckets (at least `min_count`
        steps each), flat below the first; past the last, its segment's slope or proportional to
        the tokens, whichever is more; None with fewer than two buckets measured."""
        buckets = self._ready if min_count == self.MIN_COUNT else \
            [b for b in sorted(self._count) if self._count[b] >= min_count]
        if len(buckets) < 2:
            return None
        mean = self._mean
        if num_tokens <= buckets[0]:
            # not flat from the smallest measured step down: a server's first steps are often
            # whole prompts (a 4,096-token prefill measured, no 256-token step yet), and "a
            # 256-token step costs what a 4,096-token one does" made every draft look free
            # (the H200's cold 512/128 x 400 run speculated at 256 decodes: 3.2x slower)
            k = self.prior_knee
            return mean[buckets[0]] * max(num_tokens, k) / max(buckets[0], k)
        for lo, hi in itertools.pairwise(buckets):
            if num_tokens <= hi:
                t_lo, t_hi = mean[lo], max(mean[hi], mean[lo])
                return t_lo + (t_hi - t_lo) * (num_tokens - lo) / (hi - lo)
        lo, hi = buckets[-2], buckets[-1]
        slope = max(0.0, (mean[hi] - mean[lo]) / (hi - lo))
        # past what was measured: the last segment's slope, or the prior's shape scaled from the
        # last bucket (flat up to prior_knee, proportional past it), whichever is more. Taking
        # it proportional from any bucket made a step past the largest one measured (verifies
        # of 16 tokens) look compute-bound, and the policy never tried a larger one
        k = self.prior_knee
        return max(mean[hi] + slope * (num_tokens - hi), mean[hi] * max(num_tokens, k) / max(hi, k))

    def table(self) -> dict[int, float]:
        return dict(sorted(self._mean.items()))


# ---- the policy ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SeqLoad:
    """What the policy reads of one decoding sequence."""

    request_id: str
    remaining: int  # tokens it may still generate
    alpha: float  # its measured per-token acceptance (best source)
    max_draft_tokens: int  # its own cap (0: the server's); -1: speculation off
    rank: tuple = ()  # service order within a class (priority, arrival, admission)


def drafts_worth(alpha: float, cap: int, min_prob: float) -> int:
    """The most drafts i <= cap with alpha^i >= min_prob."""
    if cap <= 0 or alpha <= 0.0 or alpha < min_prob:
        return 0
    if alpha >= 1.0:
        return cap
    return max(0, min(cap, int(math.log(min_prob) / math.log(alpha) + 1e-9)))


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens a verify of k drafts yields on average (the accepted ones and the one after)."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class SpeculationPolicy:
    """How many draft tokens each decoding sequence gets this step.

    The step's useful work is its scheduled tokens (decodes and prefill tokens, each one token
    of work) plus the expected accepted drafts; its time comes from the step cost model T(n)
    (measured, else flat up to `knee_tokens` and proportional past it). Drafts are added best
    first — the i-th draft of a sequence is accepted with chance q = alpha^i, weighted by the
    sequence's class (`class_weight`) — while each raises work per second:
    ``q * T(n) > (T(n + 1) - T(n)) * work``. Below the knee a token costs almost nothing and
    every draft with q >= min_draft_prob goes in; at saturation a token costs its share of the
    step (T' * n / T = 1) and no q <= 1 passes: the policy, not the user, turns speculation off
    where it would cost throughput. `fixed_s`: a speculating step's extra time whatever its
    drafts (the engine's async scheduling lost for that step); the whole plan is dropped when it
    does not pay for it."""

    def __init__(self, config: SpeculationConfig | None = None,
                 cost: StepCostModel | None = None) -> None:
        self.config = config or SpeculationConfig()
        self.cost = cost
        if cost is not None:
            cost.prior_knee = self.config.knee_tokens
        self.num_steps_off_by_load = 0  # steps where load turned drafting off (metrics)

    def knee(self) -> int:
        """Step tokens below which a step costs about one decode step (measured, else
        configured); the engine's O(1) test for "drafting cannot pay" at saturation."""
        measured = self.cost.knee() if self.cost is not None else None
        return measured if measured is not None else self.config.knee_tokens

    def step_time(self, num_tokens: int) -> float:
        """T(n): measured (piecewise linear), else the configured knee's model (1 up to the
        knee, n / knee past it)."""
        t = self.cost.time(num_tokens) if self.cost is not None else None
        if t is not None:
            return t
        knee = self.config.knee_tokens
        return 1.0 if num_tokens <= knee else num_tokens / knee

    def saturated(self, num_tokens: int) -> bool:
        """A step of `num_tokens` past which no draft can raise work per second (even a
        certain one): T' * n >= T."""
        t = self.step_time(num_tokens)
        return (self.step_time(num_tokens + 1) - t) * num_tokens >= t

    def plan(self, seqs: Sequence[SeqLoad], num_decodes: int, num_prefill_tokens: int,
             max_rows: int | None = None, fixed_s: float = 0.0) -> dict[str, int]:
        """Draft tokens per sequence id (sequences that get none are absent).

        `num_decodes`: decoding sequences this step (each feeds one token anyway);
        `num_prefill_tokens`: prefill tokens the step will carry (the backlog, up to the
        budget); `max_rows`: most draft tokens in the step (the runner's logit rows)."""
        cfg = self.config
        if not cfg.enabled or not seqs:
            return {}
        n0 = num_decodes + num_prefill_tokens
        if max_rows is not None and max_rows <= 0:
            return {}
        # (-q of its next draft, class, rank, id, alpha, which draft, cap): q = weight * alpha^i
        heap: list[tuple[float, int, tuple, str, float, int, int]] = []
        for s in seqs:
            if s.max_draft_tokens < 0:
                continue
            cls = class_index(s.remaining, cfg.class_bounds)
            cap = min(cfg.max_draft_tokens, cfg.class_max[cls], s.remaining - 1)
            if s.max_draft_tokens > 0:
                cap = min(cap, s.max_draft_tokens)
            q = s.alpha * cfg.class_weight[cls]
            if cap > 0 and q >= cfg.min_draft_prob:
                heap.append((-q, cls, s.rank, s.request_id, s.alpha, 1, cap))
        if not heap:
            return {}
        heapify(heap)
        n, t = n0, self.step_time(n0)
        work = float(n0)
        t0, work0 = t, work
        rows = max_rows if max_rows is not None else 1 << 30
        out: dict[str, int] = {}
        while heap and rows > 0:
            neg_q, cls, rank, rid, alpha, i, cap = heap[0]
            q = -neg_q
            dt = self.step_time(n + 1) - t
            if q < cfg.min_draft_prob or q * t <= dt * work:
                break
            heappop(heap)
            out[rid] = i
            n += 1
            t += dt
            work += q
            rows -= 1
            if i < cap:
                heappush(heap, (-(q * alpha), cls, rank, rid, alpha, i + 1, cap))
        if not out or work / (t + fixed_s) <= work0 / t0:
            self.num_steps_off_by_load += 1
            return {}
        return out


# ---- the engine's side: states, proposals, outcomes -----------------------------------------------
@dataclass(frozen=True, slots=True)
class SourceCounters:
    """One draft source's speculative decoding so far (vLLM's spec-decode counters)."""

    source: str
    num_drafts: int  # verifies (one sequence's draft tokens in one step)
    num_draft_tokens: int  # draft tokens verified
    num_accepted_tokens: int  # of which accepted (output tokens)
    num_accepted_tokens_per_pos: tuple[int, ...] = ()  # accepted at draft position 0, 1, ...


class DraftBackoff:
    """When an engine that pipelines its steps (async scheduling: step k+1 planned before step
    k is read back) asks for drafts. Drafts follow the real tokens, so a step that may carry
    them is planned after a read-back, which costs the device a wait; after an ask that drafted
    nothing, the next 1, 3, 7, 15, then `limit` turns stay pipelined without asking.

    A prediction that finds its place (a request that brings one, or one that re-synchronises
    after an edited line: `Speculator.append` sees it) ends the wait: drafts are likely from
    there. Without that reset the back-off ran on past an edited line's end, into the lines the
    prediction had right (the simulator: TPOT 0.67 of off at 50% of lines kept vs 0.58)."""

    __slots__ = ("backoff", "hold", "limit", "reset_on_align", "wait")

    def __init__(self, limit: int = 16, reset_on_align: bool = True) -> None:
        self.limit = limit
        self.reset_on_align = reset_on_align
        self.backoff = self.wait = 0
        # set for one ask (by `Speculator.plan`) when prompt lookup ran out of its indexing
        # allowance: the missing drafts are the index's, not the text's; no back-off
        self.hold = False

    def skip(self) -> bool:
        """True: this turn stays pipelined (do not ask)."""
        if self.wait > 0:
            self.wait -= 1
            return True
        return False

    def asked(self, drafted: bool) -> None:
        self.backoff = 0 if drafted or self.hold else min(self.limit, 2 * self.backoff + 1)
        self.wait = self.backoff
        self.hold = False

    def aligned(self) -> None:
        """A prediction has a draft to give again."""
        if self.reset_on_align:
            self.backoff = self.wait = 0


class Speculator:
    """Per-request draft states and the proposers, for one engine. The engine calls:

        add(request_id, prompt, prediction, max_draft_tokens, off)   at admission
        loads(...) -> policy.plan(...) -> propose(request_id, k)      each step
        verified(request_id, num_drafted, num_accepted)               after a verify
        append(request_id, tokens)                                    every new output token
        finish(request_id)                                            at the end (session store)
    """

    def __init__(self, config: SpeculationConfig | None = None,
                 cost: StepCostModel | None = None,
                 extra: Sequence[Proposer] = ()) -> None:
        self.config = cfg = config or SpeculationConfig()
        self.policy = SpeculationPolicy(cfg, cost)
        self.sessions = SessionStore(cfg.ngram_min, cfg.ngram_max, cfg.max_sessions,
                                     cfg.max_session_tokens)
        self.prediction = PredictionProposer(cfg.resync_ngram)
        self.prompt = PromptLookupProposer(cfg.ngram_min, cfg.ngram_max,
                                           cfg.lookup_index_tokens_per_step or None)
        self.session = SessionProposer(self.sessions)
        self.proposers: list = [p for p in (self.prediction, self.prompt, self.session)
                                if p.source in cfg.sources] + list(extra)
        self.states: dict[str, DraftState] = {}
        # the backend's mean acceptance per source: the prior of a request's first verifies
        self.source_acceptance: dict[str, Acceptance] = {}
        # counters per source (the metrics): drafted, accepted; verifies, accepted by position
        self.num_drafted: dict[str, int] = dict.fromkeys(SOURCES, 0)
        self.num_accepted: dict[str, int] = dict.fromkeys(SOURCES, 0)
        self.num_drafts: dict[str, int] = dict.fromkeys(SOURCES, 0)
        self.num_accepted_per_pos: dict[str, list[int]] = {s: [] for s in SOURCES}
        self.num_verifies = 0
        self.backoff = DraftBackoff()  # the asking turns of an engine that pipelines its steps

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    def add(self, request_id: str, prompt: Sequence[int], prediction: Sequence[int] | None = None,
            max_draft_tokens: int = 0, off: bool = False) -> DraftState:
        cfg = self.config
        pred = [int(t) for t in prediction] if prediction is not None and len(prediction) else None
        state = DraftState(request_id, prompt, pred, max_draft_tokens, off or not cfg.enabled,
                           session_key(prompt, cfg.session_prefix_tokens))
        if "prediction" in cfg.sources:
            self.prediction.start(state)
            if state.pred_pos >= 0 and not state.off:
                self.backoff.aligned()
        self.states[request_id] = state
        return state

    def get(self, request_id: str) -> DraftState | None:
        return self.states.get(request_id)

    def rate(self, state: DraftState, source: str) -> float:
        """The sequence's measured per-token acceptance of `source`; before it has any, the
        backend's mean for the source, before that a prior."""
        prior = PRIOR_ACCEPTANCE.get(source, 0.5)
        mean = self.source_acceptance.get(source)
        if mean is not None:
            prior = mean.rate(prior)
        acc = state.acceptance.get(source)
        return prior if acc is None else acc.rate(prior)

    def alpha(self, state: DraftState) -> float:
        """The best per-token acceptance among the sources (measured, else the priors)."""
        return max((self.rate(state, p.source) for p in self.proposers
                    if not (p.source == "prediction" and state.pred_pos < 0)), default=0.0)

    def load(self, request_id: str, remaining: int, rank: tuple = ()) -> SeqLoad | None:
        """What the policy weighs of one decoding sequence: the draft of its most trusted source
        that has one (kept for `propose`) and that source's acceptance; None without a draft."""
        state = self.states.get(request_id)
        if state is None or state.off:
            return None
        k = min(self.config.max_draft_tokens, remaining - 1)
        if state.max_draft_tokens > 0:
            k = min(k, state.max_draft_tokens)
        best, best_rate, best_draft = "", -1.0, None
        if k > 0:
            for p in self.proposers:
                rate = self.rate(state, p.source)
                # a source trusted no more than the best draft so far is not asked: its draft
                # could not be chosen, and asking costs (prompt lookup indexes and searches;
                # ~15 us a sequence a step while a prediction leads)
                if rate <= best_rate:
                    continue
                draft = p.propose(state, k)
                if draft:
                    best, best_rate, best_draft = p.source, rate, draft
        state.pending_source, state.pending_draft = best, best_draft
        if best_draft is None:
            return None
        return SeqLoad(request_id, remaining, best_rate, len(best_draft), rank)

    def propose(self, request_id: str, k: int) -> list[int]:
        """Up to k draft tokens: the one `load` chose this step, else the first source that has
        some (prediction, then prompt lookup, then the session); remembers the source for
        `verified`."""
        state = self.states.get(request_id)
        if state is None or state.off or k <= 0:
            return []
        if state.pending_draft:
            draft, src = state.pending_draft[:k], state.pending_source
            state.pending_draft = None
            state.last_source, state.last_draft = src, list(draft)
            return list(draft)
        for p in self.proposers:
            draft = p.propose(state, k)
            if draft:
                state.last_source = p.source
                state.last_draft = list(draft)
                return list(draft)
        state.last_source = ""
        state.last_draft = []
        return []

    def verified(self, request_id: str, num_drafted: int, num_accepted: int) -> None:
        """The outcome of a verify of `num_drafted` drafts from the last proposal."""
        state = self.states.get(request_id)
        if state is None or num_drafted <= 0:
            return
        src = state.last_source or "prompt"
        decay = self.config.decay
        state.acceptance.setdefault(src, Acceptance()).observe(num_drafted, num_accepted, decay)
        self.source_acceptance.setdefault(src, Acceptance()).observe(num_drafted, num_accepted,
                                                                     0.99)
        state.num_draft_tokens += num_drafted
        state.num_accepted_draft_tokens += num_accepted
        self.num_drafted[src] = self.num_drafted.get(src, 0) + num_drafted
        self.num_accepted[src] = self.num_accepted.get(src, 0) + num_accepted
        self.num_drafts[src] = self.num_drafts.get(src, 0) + 1
        per_pos = self.num_accepted_per_pos.setdefault(src, [])
        if len(per_pos) < num_drafted:
            per_pos.extend([0] * (num_drafted - len(per_pos)))
        for i in range(num_accepted):  # drafts are accepted as a prefix
            per_pos[i] += 1
        self.num_verifies += 1
        if src == "prediction":
            state.num_prediction_drafted += num_drafted
            state.num_accepted_prediction_tokens += num_accepted
            state.num_rejected_prediction_tokens += num_drafted - num_accepted

    def append(self, request_id: str, tokens: Sequence[int]) -> None:
        """New output tokens of the sequence (accepted drafts and sampled tokens alike)."""
        state = self.states.get(request_id)
        if state is None or not len(tokens):
            return
        state.output.extend(int(t) for t in tokens)
        if state.prediction:
            lost = state.pred_pos < 0
            self.prediction.observe(state, tokens)
            if lost and state.pred_pos >= 0 and not state.off:  # re-synchronised
                self.backoff.aligned()
        if state.history is not None:
            self.prompt.observe(state, tokens)

    def finish(self, request_id: str, record: bool = True) -> DraftState | None:
        state = self.states.pop(request_id, None)
        if state is not None and record and "session" in self.config.sources:
            self.sessions.record(state.session_key, state.output)
        return state

    def plan(self, loads: Sequence[SeqLoad], num_decodes: int, num_prefill_tokens: int,
             max_rows: int | None = None, fixed_s: float = 0.0) -> dict[str, list[int]]:
        """The policy's counts, then the proposals: request id -> draft tokens (non-empty)."""
        counts = self.policy.plan(loads, num_decodes, num_prefill_tokens, max_rows, fixed_s)
        drafts: dict[str, list[int]] = {}
        for rid, k in counts.items():
            d = self.propose(rid, k)
            if d:
                drafts[rid] = d
        if self.prompt.starved:  # (the engine's ask that follows must not back off)
            self.backoff.hold = True
        self.prompt.new_step()  # the next step's allowance of prompt-lookup indexing
        return drafts

    def index_ahead(self) -> int:
        """Catch the started prompt-lookup indexes up with their tokens, at most the configured
        allowance per step (`lookup_index_tokens_per_step`) — in the device's shadow: the CUDA
        engine calls this after each launch, and the simulator of it at the same point, so that
        their drafting decisions stay the same. Returns the tokens indexed."""
        if self.prompt not in self.proposers:
            return 0
        return self.prompt.index_ahead(self.states.values(), self.prompt.tokens_per_step)

    def stats(self) -> Mapping[str, dict[str, int]]:
        return {"drafted": dict(self.num_drafted), "accepted": dict(self.num_accepted)}

    def source_counters(self) -> tuple[SourceCounters, ...]:
        """Each configured source's counters so far (zeros included): what the engine reports
        (LoadReport.spec_decode, the gateway's vllm:spec_decode_* by source)."""
        return tuple(SourceCounters(p.source, self.num_drafts.get(p.source, 0),
                                    self.num_drafted.get(p.source, 0),
                                    self.num_accepted.get(p.source, 0),
                                    tuple(self.num_accepted_per_pos.get(p.source, ())))
                     for p in self.proposers)


def accept_drafts(draft: Sequence[int], targets: Sequence[int]) -> int:
    """How many leading drafts equal their targets (`targets[i]` is the token sampled at the
    position of draft i; len(targets) == len(draft) + 1)."""
    a = 0
    for d, t in zip(draft, targets):
        if d != t:
            break
        a += 1
    return a
