"""Agent-session traces (issue 30): the format, a generator, their figures, and a `Workload`.

A coding agent's session is a chain of turns: each turn's prompt is the previous turn's prompt,
that turn's output, a tool's result and perhaps the user's words — so nearly all of a turn's
input was the input of the turn before. Sessions share one system prompt; a sub-agent starts
from its parent's context (a fork) and runs turns of its own. Between turns the agent runs a
tool. Published figures (issue 30): in 219 Claude Code sessions the median request carried
195K input and 317 output tokens, input was 98.6% of all tokens, and 96% of turns reused at
least 90% of their input.

Format: JSON lines, one request each, sorted by time::

    {"t": 12.5, "session": "s3", "parent": null, "turn": 4,
     "segments": [["sys", 0, 3000], ["s3", 0, 2711]], "output_tokens": 301,
     "pin_tokens": 0, "pin_ttl_s": 0}

The prompt is the concatenation of its segments ``[stream, start, length]``: token positions
of a named token stream (``sys`` is the shared system prompt; each session and sub-agent has
its own stream, which grows turn by turn). Two prompts share a prefix exactly where their
segment lists agree, so a replay can make the token ids (`prompt_tokens`: distinct ranges in
the simulator, seeded random ids of a vocabulary live) and the prefix structure is the same.
``pin_tokens``/``pin_ttl_s``: the request pins its first that-many tokens for that long (an
Anthropic ``cache_control`` breakpoint with its ``ttl``; 0: no pin).

Arrival times are open-loop: a session's next turn comes at its previous turn's time plus a
nominal service time (``output_tokens x nominal_tpot_s`` + ``nominal_prefill_s``) plus the
tool's latency, so the simulator and the live replay send the same requests at the same
times; a system slower than the nominal time sees the next turn while the previous one runs.

The generator follows the published figures scaled to the model's context (`max_context`; the
33B preset has 16K where the recorded sessions ran to 200K): outputs keep the published median
(317), the system prompt, first message and per-turn growth are sized so that sessions grow to
the context, and most turns reuse >= 90% of their input. `trace_figures` reports what a trace
has, beside the published figures, so a user can see how close the scaled trace is.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from sims.workload import Workload

PUBLISHED = {"median_input_tokens": 195_000, "median_output_tokens": 317,
             "input_share": 0.986, "turns_reusing_90pct": 0.96}

_STRIDE = 1 << 24  # simulator token ids: stream k's positions are k * _STRIDE + position


@dataclass(frozen=True)
class AgentTraceConfig:
    num_sessions: int = 64
    session_rate: float = 0.2          # new top-level sessions per second (Poisson)
    max_context: int = 16384           # the model's context: a session ends before passing it
    system_prompt_tokens: int = 5000   # one system prompt (and tools) shared by every session
    first_message_tokens: float = 1500 # median of the first user message (lognormal)
    first_message_sigma: float = 0.6
    output_tokens: float = 317         # median output per turn (published), lognormal
    output_sigma: float = 0.7
    max_output_tokens: int = 1024
    new_tokens: float = 100            # median tool result + user text added per turn
    new_sigma: float = 0.8
    tool_latency_s: float = 2.0        # median tool time between turns (lognormal)
    tool_latency_sigma: float = 1.0
    max_turns: int = 40
    subagent_prob: float = 0.08        # per turn: the turn forks a sub-agent from its context
    subagent_turns: tuple[int, int] = (2, 6)
    subagent_task_tokens: int = 300
    pin_fraction: float = 0.0          # sessions whose turns pin their whole prompt
    pin_ttl_s: float = 300.0           # Anthropic's default cache_control ttl ("5m")
    nominal_tpot_s: float = 0.03       # open-loop turn time: output x this + the prefill time
    nominal_prefill_s: float = 0.5
    seed: int = 0


@dataclass
class AgentRequest:
    t: float
    session: str
    parent: str | None
    turn: int
    segments: list[tuple[str, int, int]]
    output_tokens: int
    pin_tokens: int = 0
    pin_ttl_s: float = 0.0

    @property
    def prompt_len(self) -> int:
        return sum(n for _, _, n in self.segments)


@dataclass
class AgentTrace:
    requests: list[AgentRequest]
    config: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.requests)


# ---- the generator -------------------------------------------------------------------------------
def generate(cfg: AgentTraceConfig) -> AgentTrace:
    rng = np.random.default_rng(cfg.seed)
    reqs: list[AgentRequest] = []
    starts = np.cumsum(rng.exponential(1.0 / cfg.session_rate, size=cfg.num_sessions))
    starts -= starts[0]
    sys_len = cfg.system_prompt_tokens
    limit = cfg.max_context

    def lognormal(median: float, sigma: float) -> int:
        return max(1, round(float(rng.lognormal(np.log(median), sigma))))

    def output() -> int:
        return min(cfg.max_output_tokens, lognormal(cfg.output_tokens, cfg.output_sigma))

    def run(name: str, parent: str | None, head: list[tuple[str, int, int]], own: int, t: float,
            max_turns: int, pinned: bool, may_fork: bool) -> None:
        """Turns of one session (or sub-agent) whose prompt is `head` + its own stream."""
        forks = 0
        for turn in range(max_turns):
            out = output()
            segs = [*head, (name, 0, own)]
            plen = sum(n for _, _, n in segs)
            if plen + out > limit:
                break
            reqs.append(AgentRequest(float(t), name, parent, turn, segs, out,
                                     plen if pinned else 0, cfg.pin_ttl_s if pinned else 0.0))
            if may_fork and rng.random() < cfg.subagent_prob:
                forks += 1
                lo, hi = cfg.subagent_turns
                run(f"{name}.a{forks}", name, segs, cfg.subagent_task_tokens, t + 0.5,
                    int(rng.integers(lo, hi + 1)), pinned, False)
            t += out * cfg.nominal_tpot_s + cfg.nominal_prefill_s + \
                rng.lognormal(np.log(cfg.tool_latency_s), cfg.tool_latency_sigma)
            own += out + lognormal(cfg.new_tokens, cfg.new_sigma)

    for s, start in enumerate(starts):
        pinned = rng.random() < cfg.pin_fraction
        run(f"s{s}", None, [("sys", 0, sys_len)],
            lognormal(cfg.first_message_tokens, cfg.first_message_sigma), float(start),
            cfg.max_turns, pinned, True)
    reqs.sort(key=lambda r: (r.t, r.session))
    return AgentTrace(reqs, asdict(cfg))


def rescale(trace: AgentTrace, factor: float) -> AgentTrace:
    """The same sessions arriving `factor` times as often (each session's start time divided by
    it); the times within a session (turns, tools) are kept."""
    first: dict[str, float] = {}
    for r in trace.requests:
        root = r.session.split(".")[0]
        first.setdefault(root, r.t)
    out = []
    for r in trace.requests:
        s0 = first[r.session.split(".")[0]]
        out.append(AgentRequest(s0 / factor + (r.t - s0), r.session, r.parent, r.turn,
                                list(r.segments), r.output_tokens, r.pin_tokens, r.pin_ttl_s))
    out.sort(key=lambda r: (r.t, r.session))
    return AgentTrace(out, {**trace.config, "rescaled": factor})


# ---- files -----------------------------------------------------------------------------------------
def write(trace: AgentTrace, path: str | Path) -> None:
    with open(path, "w") as fh:
        fh.writelines(json.dumps({"t": round(r.t, 6), "session": r.session, "parent": r.parent,
                                  "turn": r.turn, "segments": [list(s) for s in r.segments],
                                  "output_tokens": r.output_tokens, "pin_tokens": r.pin_tokens,
                                  "pin_ttl_s": r.pin_ttl_s}) + "\n" for r in trace.requests)


def load(path: str | Path) -> AgentTrace:
    reqs = []
    with open(path) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                segs = [(str(s), int(a), int(n)) for s, a, n in d["segments"]]
                if not segs or any(a < 0 or n < 1 for _, a, n in segs):
                    raise ValueError("empty or negative segment")
                reqs.append(AgentRequest(float(d["t"]), str(d["session"]), d.get("parent"),
                                         int(d.get("turn", 0)), segs, int(d["output_tokens"]),
                                         int(d.get("pin_tokens", 0)),
                                         float(d.get("pin_ttl_s", 0.0))))
            except (KeyError, ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: not an agent trace line ({exc})") from None
    if not reqs:
        raise ValueError(f"{path}: empty trace")
    reqs.sort(key=lambda r: (r.t, r.session))
    return AgentTrace(reqs)


# ---- token ids ----------------------------------------------------------------------------------------
class StreamTokens:
    """Token ids of a trace's streams: in the simulator distinct integer ranges (`vocab` None),
    live seeded random ids in [lo, hi) of the model's vocabulary."""

    def __init__(self, vocab: tuple[int, int] | None = None, seed: int = 0) -> None:
        self.vocab, self.seed = vocab, seed
        self._ids: dict[str, int] = {}
        self._live: dict[str, np.ndarray] = {}

    def stream(self, name: str, start: int, n: int) -> list[int]:
        k = self._ids.setdefault(name, len(self._ids))
        if self.vocab is None:
            base = (k + 1) * _STRIDE
            return list(range(base + start, base + start + n))
        arr = self._live.get(name)
        if arr is None or len(arr) < start + n:
            lo, hi = self.vocab
            size = max(start + n, 2 * (len(arr) if arr is not None else 0))
            # a prefix of a longer draw with the same seed: a stream's ids never change as it grows
            arr = self._live[name] = np.random.default_rng(
                [self.seed, _name_seed(name)]).integers(lo, hi, size=size)
        return arr[start:start + n].tolist()

    def prompt(self, r: AgentRequest) -> list[int]:
        out: list[int] = []
        for name, start, n in r.segments:
            out += self.stream(name, start, n)
        return out


def _name_seed(name: str) -> int:
    h = 1469598103934665603
    for ch in name.encode():
        h = ((h ^ ch) * 1099511628211) & ((1 << 63) - 1)
    return h


# ---- figures -----------------------------------------------------------------------------------------
def shared_prefix(a: list[tuple[str, int, int]], b: list[tuple[str, int, int]]) -> int:
    """Tokens two prompts share at their start, from their segments."""
    n = 0
    for (sa, xa, la), (sb, xb, lb) in zip(a, b):
        if sa != sb or xa != xb:
            break
        m = min(la, lb)
        n += m
        if la != lb:
            break
    return n


def available_reuse(trace: AgentTrace) -> list[int]:
    """Per request, the tokens of its prompt some earlier request's prompt shares (the most a
    prefix cache with room for everything could serve): prompts of the same session, its parent
    (a fork), and the shared system prompt."""
    last: dict[str, list] = {}      # session -> its latest segments
    sys_seen: set[tuple[str, int]] = set()
    out = []
    for r in trace.requests:
        best = 0
        for s in (r.session, r.parent):
            if s is not None and s in last:
                best = max(best, shared_prefix(last[s], r.segments))
        first = r.segments[0]
        if (first[0], first[2]) in sys_seen:
            best = max(best, first[2])
        sys_seen.add((first[0], first[2]))
        out.append(min(best, r.prompt_len - 1))
        last[r.session] = r.segments
    return out


def trace_figures(trace: AgentTrace) -> dict:
    """The trace's figures beside the published ones (`PUBLISHED`)."""
    inp = np.array([r.prompt_len for r in trace.requests], dtype=np.int64)
    out = np.array([r.output_tokens for r in trace.requests], dtype=np.int64)
    reuse = np.array(available_reuse(trace), dtype=np.int64)
    follow = np.array([r.turn > 0 or r.parent is not None for r in trace.requests])
    frac = reuse / np.maximum(inp, 1)
    sessions = {r.session for r in trace.requests}
    span = trace.requests[-1].t - trace.requests[0].t if trace.requests else 0.0
    return {
        "requests": len(trace), "sessions": len({s.split(".")[0] for s in sessions}),
        "subagents": sum(1 for s in sessions if "." in s),
        "median_input_tokens": float(np.median(inp)), "median_output_tokens": float(np.median(out)),
        "input_share": float(inp.sum() / (inp.sum() + out.sum())),
        "turns_reusing_90pct": float((frac[follow] >= 0.9).mean()) if follow.any() else 0.0,
        "available_reuse_share": float(reuse.sum() / inp.sum()),
        "pinned_requests": sum(1 for r in trace.requests if r.pin_tokens),
        "duration_s": float(span), "published": PUBLISHED,
    }


# ---- the simulator's workload ------------------------------------------------------------------------------
def to_workload(trace: AgentTrace, session_keys: bool = True) -> Workload:
    """A `Workload` whose requests carry their prompt's token ids (distinct ranges per stream),
    their session key (the session's name; None with `session_keys` off: found from the prefix)
    and their pin (tokens, TTL)."""
    reqs = trace.requests
    n = len(reqs)
    toks = StreamTokens()
    w = Workload(np.array([r.t for r in reqs], dtype=np.float64) - (reqs[0].t if n else 0.0),
                 np.array([r.prompt_len for r in reqs], dtype=np.int64),
                 np.array([r.output_tokens for r in reqs], dtype=np.int64),
                 np.zeros(n, dtype=np.int32),  # group 0: "has shared prefixes" (caching on)
                 np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int8),
                 np.zeros(n, dtype=np.int32))
    w.prompt_ids = lambda i: toks.prompt(reqs[i])
    w.session_keys = [r.session if session_keys else None for r in reqs]
    w.pins = [(r.pin_tokens, r.pin_ttl_s) for r in reqs]
    return w
