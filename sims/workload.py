"""Workloads: arrival times and prompt/output lengths as numpy arrays, deterministic by seed,
for the simulator (`WorkloadConfig` -> `Workload`) and the live load generator (`bench`:
`ScheduleConfig` -> `Schedule` of send offsets, `make_prompts`). Both draw from one
`np.random.default_rng(seed)` through the same helpers in the same order (inter-arrivals, prompt
lengths, output lengths, shared-prefix draws), so `tidegate bench serve` and `tidegate sim run`
given the same seed, rate, length specs and request count use the same lengths at the same
relative times. bench's --burstiness K is the gamma shape (coefficient of variation 1/sqrt(K)).

Arrivals: Poisson at rate R, gamma inter-arrivals with coefficient of variation `cv` (cv=1 is Poisson,
cv>1 burstier), or the times of a JSONL trace. Lengths: `LengthSpec` — fixed, uniform, lognormal, or
resampled from a trace. A `shared_prefix_fraction` of requests start with one of
`num_prefix_groups` common prefixes of `shared_prefix_len` tokens (for the prefix cache).

Trace lines (JSONL): {"arrival_time": s, "prompt_tokens": n, "output_tokens": n,
"class": "fast"|"normal"|"slow"|0..2 (optional), "priority": int (optional)}; `timestamp`,
`input_len`/`prompt_len`, `output_len`/`max_tokens` are accepted as aliases.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

_ARRIVAL_KEYS = ("arrival_time", "timestamp", "time")
_PROMPT_KEYS = ("prompt_tokens", "input_len", "prompt_len", "num_prompt_tokens")
_OUTPUT_KEYS = ("output_tokens", "output_len", "max_tokens")
_CLASS_NAMES = {"fast": 0, "normal": 1, "slow": 2}


@dataclass(frozen=True)
class LengthSpec:
    """kind: fixed(value) | uniform(low, high inclusive) | lognormal(value=median, sigma) | trace."""
    kind: str = "fixed"
    value: float = 512
    low: int = 1
    high: int = 1
    sigma: float = 0.5
    trace: tuple[int, ...] = ()
    max_len: int = 1 << 20

    @classmethod
    def parse(cls, text: str | int, trace_lengths: tuple[int, ...] = ()) -> LengthSpec:
        """'512' | 'uniform:256:768' | 'lognormal:512:0.5' (median, sigma) | 'lognormal:512:0.8:2820'
        (median, sigma, the draws capped at 2,820 tokens: what `sim validate` ran live, 4x the mean)
        | 'trace'."""
        if isinstance(text, (int, float)):
            return cls("fixed", value=int(text))
        parts = str(text).split(":")
        kind = parts[0]
        if kind.isdigit():
            return cls("fixed", value=int(kind))
        if kind == "uniform" and len(parts) == 3:
            return cls("uniform", low=int(parts[1]), high=int(parts[2]))
        if kind == "lognormal" and len(parts) in (3, 4):
            if len(parts) == 4 and not (parts[3].isdigit() and int(parts[3]) >= 1):
                raise ValueError(f"bad length spec {text!r}: the cap after the sigma is a length >= 1")
            cap = {"max_len": int(parts[3])} if len(parts) == 4 else {}
            return cls("lognormal", value=float(parts[1]), sigma=float(parts[2]), **cap)
        if kind == "trace":
            if not trace_lengths:
                raise ValueError("length 'trace' needs a trace (--trace FILE)")
            return cls("trace", trace=tuple(trace_lengths))
        raise ValueError(f"bad length spec {text!r}: N | uniform:LO:HI | lognormal:MEDIAN:SIGMA[:MAX] | trace")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            out = np.full(n, int(self.value), dtype=np.int64)
        elif self.kind == "uniform":
            out = rng.integers(self.low, self.high + 1, size=n, dtype=np.int64)
        elif self.kind == "lognormal":
            out = np.rint(rng.lognormal(np.log(self.value), self.sigma, size=n)).astype(np.int64)
        elif self.kind == "trace":
            out = rng.choice(np.asarray(self.trace, dtype=np.int64), size=n)
        else:
            raise ValueError(f"unknown length kind {self.kind!r}")
        return np.clip(out, 1, self.max_len)


@dataclass(frozen=True)
class WorkloadConfig:
    num_requests: int = 1000
    rate: float = 10.0                 # requests/s (ignored when a trace gives arrival times)
    arrival: str = "poisson"           # poisson | gamma | trace
    cv: float = 1.0                    # gamma inter-arrival coefficient of variation
    input_len: LengthSpec = field(default_factory=lambda: LengthSpec("fixed", 512))
    output_len: LengthSpec = field(default_factory=lambda: LengthSpec("fixed", 128))
    shared_prefix_fraction: float = 0.0
    shared_prefix_len: int = 0
    num_prefix_groups: int = 1
    seed: int = 0


@dataclass
class Workload:
    """Request i arrives at arrival_time[i] (sorted) with prompt_len[i] prompt tokens, asks for
    output_len[i] tokens; prefix_group[i] >= 0 marks a shared prefix of prefix_len[i] tokens;
    queue_class[i] / priority[i] are -1 / 0 unless a trace set them."""
    arrival_time: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    prefix_group: np.ndarray
    prefix_len: np.ndarray
    queue_class: np.ndarray
    priority: np.ndarray
    # agent traces (sims.agent_trace): request i's prompt token ids (None: made from the lengths
    # and prefix groups), its session key (None: none sent), its pin (tokens, ttl_s)
    prompt_ids: Callable[[int], list[int]] | None = None
    session_keys: list | None = None
    pins: list[tuple[int, float]] | None = None
    # request i's own TTFT target (ms; the request's `slo_ttft_ms` field), None where it gave
    # none: the replay of a live log whose probes carried one (sims.decision_replay)
    ttft_override_ms: list[float | None] | None = None
    # the live gateway's admission decisions to follow (True: refused), the simulator's own
    # still recorded: `sims.decision_replay`'s forced replay (inputs apart from the cascade)
    forced_refused: list[bool] | None = None
    # the live gateway's placement to follow (request i's backend; -1: the policy's own): the
    # forced replay's other input (`sims.decision_replay`), so that each admission decision
    # is taken on the backends' states the live placement made (issue 31, ninth session)
    forced_backend: list[int] | None = None

    def __len__(self) -> int:
        return len(self.arrival_time)

    @property
    def duration(self) -> float:
        return float(self.arrival_time[-1] - self.arrival_time[0]) if len(self) > 1 else 0.0


def inter_arrivals(rng: np.random.Generator, n: int, rate: float, arrival: str,
                   cv: float = 1.0, shape: float | None = None) -> np.ndarray:
    """Gaps between arrivals; gamma takes its shape, or 1 / cv**2 when no shape is given."""
    if not rate > 0:
        raise ValueError(f"rate must be positive, got {rate}")
    if arrival == "poisson":
        return rng.exponential(1.0 / rate, size=n)
    if arrival == "gamma":
        if shape is None:
            if cv <= 0:
                raise ValueError(f"cv must be positive, got {cv}")
            shape = 1.0 / (cv * cv)
        elif not shape > 0:
            raise ValueError(f"burstiness must be positive, got {shape}")
        return rng.gamma(shape, 1.0 / (rate * shape), size=n)
    raise ValueError(f"unknown arrival process {arrival!r} (poisson | gamma | trace)")


def _lengths_and_prefixes(rng: np.random.Generator, n: int, config: WorkloadConfig | ScheduleConfig):
    """Prompt lengths, output lengths, then the shared-prefix draws: (prompt, output, group, len)."""
    prompt = config.input_len.sample(rng, n)
    output = config.output_len.sample(rng, n)
    group = np.full(n, -1, dtype=np.int32)
    plen = np.zeros(n, dtype=np.int64)
    if config.shared_prefix_fraction > 0 and config.shared_prefix_len > 0:
        shared = rng.random(n) < config.shared_prefix_fraction
        group[shared] = rng.integers(0, max(1, config.num_prefix_groups), size=int(shared.sum()))
        plen[shared] = config.shared_prefix_len
        prompt = np.where(shared, np.maximum(prompt, config.shared_prefix_len + 1), prompt)
    return prompt, output, group, plen


def generate(config: WorkloadConfig, trace: Workload | None = None) -> Workload:
    """A workload from `config`; with `trace` and arrival='trace', its arrival times (and classes,
    priorities) are reused, cycling the trace when num_requests exceeds it."""
    rng = np.random.default_rng(config.seed)
    n = config.num_requests
    qclass = np.full(n, -1, dtype=np.int8)
    prio = np.zeros(n, dtype=np.int32)
    if config.arrival == "trace":
        if trace is None or not len(trace):
            raise ValueError("arrival 'trace' needs a non-empty trace")
        idx = np.arange(n) % len(trace)
        span = trace.duration + (trace.duration / max(len(trace) - 1, 1))
        arrival = trace.arrival_time[idx] - trace.arrival_time[0] + (np.arange(n) // len(trace)) * span
        qclass, prio = trace.queue_class[idx].copy(), trace.priority[idx].copy()
    else:
        arrival = np.cumsum(inter_arrivals(rng, n, config.rate, config.arrival, config.cv))
    prompt, output, group, plen = _lengths_and_prefixes(rng, n, config)
    return Workload(arrival.astype(np.float64), prompt, output, group, plen, qclass, prio)


def load_trace(path: str | Path) -> Workload:
    rows = []
    with open(path) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                t = next(float(row[k]) for k in _ARRIVAL_KEYS if k in row)
                p = next(int(row[k]) for k in _PROMPT_KEYS if k in row)
                o = next(int(row[k]) for k in _OUTPUT_KEYS if k in row)
            except (ValueError, TypeError, StopIteration) as exc:
                raise ValueError(f"{path}:{lineno}: not a trace line ({exc.__class__.__name__})") from None
            c = row.get("class", row.get("queue_class", -1))
            c = _CLASS_NAMES.get(str(c).lower(), c) if isinstance(c, str) else int(c)
            rows.append((t, p, o, int(c), int(row.get("priority", 0))))
    if not rows:
        raise ValueError(f"{path}: empty trace")
    rows.sort(key=lambda r: r[0])
    a = np.array(rows, dtype=np.float64)
    n = len(rows)
    return Workload(a[:, 0], a[:, 1].astype(np.int64), a[:, 2].astype(np.int64),
                    np.full(n, -1, dtype=np.int32), np.zeros(n, dtype=np.int64),
                    a[:, 3].astype(np.int8), a[:, 4].astype(np.int32))


def write_trace(workload: Workload, path: str | Path) -> None:
    with open(path, "w") as fh:
        for i in range(len(workload)):
            row = {"arrival_time": float(workload.arrival_time[i]),
                   "prompt_tokens": int(workload.prompt_len[i]),
                   "output_tokens": int(workload.output_len[i])}
            if workload.queue_class[i] >= 0:
                row["class"] = int(workload.queue_class[i])
            if workload.priority[i]:
                row["priority"] = int(workload.priority[i])
            fh.write(json.dumps(row) + "\n")


# ---- the live load generator's schedule (bench) ---------------------------------------------------
@dataclass(frozen=True)
class ScheduleConfig:
    num_requests: int = 100
    rate: float = math.inf           # requests/s; inf sends everything at once
    burstiness: float = 1.0          # gamma shape K (vLLM's --burstiness); 1.0 = Poisson
    input_len: LengthSpec = field(default_factory=lambda: LengthSpec("fixed", 512))
    output_len: LengthSpec = field(default_factory=lambda: LengthSpec("fixed", 128))
    shared_prefix_fraction: float = 0.0
    shared_prefix_len: int = 0
    num_prefix_groups: int = 1
    seed: int = 0


@dataclass
class Schedule:
    """Request i is sent offset[i] s after the start (the first at 0) with prompt_len[i] prompt
    tokens (of which the first prefix_len[i] are shared prefix `prefix_group[i]` when that is
    >= 0), asking for output_len[i] tokens."""
    offset: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    prefix_group: np.ndarray
    prefix_len: np.ndarray

    def __len__(self) -> int:
        return len(self.offset)


def make_schedule(config: ScheduleConfig) -> Schedule:
    rng = np.random.default_rng(config.seed)
    n = config.num_requests
    if n < 1:
        raise ValueError("num_requests must be >= 1")
    k = config.burstiness
    gaps = inter_arrivals(rng, n, config.rate, "poisson" if k == 1.0 else "gamma", shape=k)
    arrival = np.cumsum(gaps)
    prompt, output, group, plen = _lengths_and_prefixes(rng, n, config)
    offset = np.nan_to_num(arrival - arrival[0], nan=0.0)     # rate inf: all zeros
    return Schedule(offset, prompt, output, group, plen)


def trace_schedule(path: str | Path, num_requests: int | None = None) -> Schedule:
    """A schedule replaying a JSONL trace's arrivals and lengths in order; more requests than
    lines cycle it, as the simulator's arrival='trace' does."""
    w = load_trace(path)
    m = len(w)
    n = m if num_requests is None else num_requests
    idx = np.arange(n) % m
    t = w.arrival_time
    duration = t[-1] - t[0]
    span = duration + duration / max(m - 1, 1)
    offset = t[idx] - t[0] + (np.arange(n) // m) * span
    return Schedule(offset, w.prompt_len[idx], w.output_len[idx],
                    np.full(n, -1, dtype=np.int32), np.zeros(n, dtype=np.int64))


def make_prompts(schedule: Schedule | Workload, seed: int,
                 token_range: tuple[int, int]) -> list[list[int]]:
    """Random token-id prompts of exactly prompt_len[i] tokens; the generator is seeded
    (seed, 1), so prompt content never shifts the schedule; shared prefixes come from
    (seed, 2, group)."""
    lo, hi = token_range
    if not 0 <= lo < hi:
        raise ValueError(f"bad token id range {lo}:{hi}")
    rng = np.random.default_rng([seed, 1])
    prefixes: dict[int, np.ndarray] = {}
    prompts = []
    for i in range(len(schedule)):
        n, g = int(schedule.prompt_len[i]), int(schedule.prefix_group[i])
        head = np.empty(0, dtype=np.int64)
        if g >= 0:
            k = int(schedule.prefix_len[i])
            if g not in prefixes:
                prefixes[g] = np.random.default_rng([seed, 2, g]).integers(lo, hi, size=k)
            head = prefixes[g][:k]
        prompts.append(np.concatenate([head, rng.integers(lo, hi, size=n - len(head))]).tolist())
    return prompts
