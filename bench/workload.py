"""Request schedules for the load generator: arrival offsets, prompt and output lengths, prompts.

Synthetic schedules draw from one `np.random.default_rng(seed)` in the same order and with the same
calls as `sims.workload.generate` (inter-arrivals, then prompt lengths, then output lengths, then the
shared-prefix draws), so `tidegate bench serve` and `tidegate sim run` given the same seed, rate,
length specs and request count send the same lengths at the same relative times (a test checks it;
bench does not import sims). Offsets are relative to the first arrival, which is sent at t = 0.

  arrivals   Poisson at --rate, or gamma inter-arrivals with vLLM's --burstiness K (shape K,
             coefficient of variation 1/sqrt(K)); rate inf sends everything at once.
  lengths    N | uniform:LO:HI (inclusive) | lognormal:MEDIAN:SIGMA, clipped to >= 1.
  trace      JSONL, one request a line, the format sims/workload.py reads:
             {"arrival_time": s, "prompt_tokens": n, "output_tokens": n, ...} with the aliases
             timestamp/time, input_len/prompt_len/num_prompt_tokens, output_len/max_tokens.
             More requests than lines cycle the trace, as the simulator does.
  prompts    random token ids in [LO, HI) from a second generator seeded (seed, 1), so prompt
             content never shifts the schedule; shared prefixes come from (seed, 2, group).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

_ARRIVAL_KEYS = ("arrival_time", "timestamp", "time")
_PROMPT_KEYS = ("prompt_tokens", "input_len", "prompt_len", "num_prompt_tokens")
_OUTPUT_KEYS = ("output_tokens", "output_len", "max_tokens")


@dataclass(frozen=True)
class LengthSpec:
    kind: str = "fixed"          # fixed | uniform | lognormal
    value: float = 128
    low: int = 1
    high: int = 1
    sigma: float = 0.5

    @classmethod
    def parse(cls, text: str | int) -> LengthSpec:
        parts = str(text).split(":")
        try:
            if len(parts) == 1:
                return cls("fixed", value=int(parts[0]))
            if parts[0] == "uniform" and len(parts) == 3:
                return cls("uniform", low=int(parts[1]), high=int(parts[2]))
            if parts[0] == "lognormal" and len(parts) == 3:
                return cls("lognormal", value=float(parts[1]), sigma=float(parts[2]))
        except ValueError:
            pass
        raise ValueError(f"bad length {text!r}: N | uniform:LO:HI | lognormal:MEDIAN:SIGMA")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            out = np.full(n, int(self.value), dtype=np.int64)
        elif self.kind == "uniform":
            out = rng.integers(self.low, self.high + 1, size=n, dtype=np.int64)
        else:
            out = np.rint(rng.lognormal(np.log(self.value), self.sigma, size=n)).astype(np.int64)
        return np.clip(out, 1, 1 << 20)


@dataclass(frozen=True)
class ScheduleConfig:
    num_requests: int = 100
    rate: float = math.inf           # requests/s
    burstiness: float = 1.0          # gamma shape; 1.0 = Poisson
    input_len: LengthSpec = LengthSpec("fixed", 512)
    output_len: LengthSpec = LengthSpec("fixed", 128)
    shared_prefix_fraction: float = 0.0
    shared_prefix_len: int = 0
    num_prefix_groups: int = 1
    seed: int = 0


@dataclass
class Schedule:
    """Request i is sent offset[i] s after the start with prompt_len[i] prompt tokens (of which the
    first prefix_len[i] are shared prefix `prefix_group[i]` when that is >= 0), asking for
    output_len[i] tokens."""
    offset: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    prefix_group: np.ndarray
    prefix_len: np.ndarray

    def __len__(self) -> int:
        return len(self.offset)


def inter_arrivals(rng: np.random.Generator, n: int, rate: float, burstiness: float) -> np.ndarray:
    if not rate > 0:
        raise ValueError(f"rate must be positive, got {rate}")
    if burstiness == 1.0:
        return rng.exponential(1.0 / rate, size=n)
    if not burstiness > 0:
        raise ValueError(f"burstiness must be positive, got {burstiness}")
    return rng.gamma(burstiness, 1.0 / (rate * burstiness), size=n)


def make_schedule(config: ScheduleConfig) -> Schedule:
    rng = np.random.default_rng(config.seed)
    n = config.num_requests
    if n < 1:
        raise ValueError("num_requests must be >= 1")
    arrival = np.cumsum(inter_arrivals(rng, n, config.rate, config.burstiness))
    prompt = config.input_len.sample(rng, n)
    output = config.output_len.sample(rng, n)
    group = np.full(n, -1, dtype=np.int32)
    plen = np.zeros(n, dtype=np.int64)
    if config.shared_prefix_fraction > 0 and config.shared_prefix_len > 0:
        shared = rng.random(n) < config.shared_prefix_fraction
        group[shared] = rng.integers(0, max(1, config.num_prefix_groups), size=int(shared.sum()))
        plen[shared] = config.shared_prefix_len
        prompt = np.where(shared, np.maximum(prompt, config.shared_prefix_len + 1), prompt)
    offset = np.nan_to_num(arrival - arrival[0], nan=0.0)     # rate inf: all zeros
    return Schedule(offset, prompt, output, group, plen)


def load_trace(path: str, num_requests: int | None = None) -> Schedule:
    """A schedule from a JSONL trace; num_requests beyond its length cycles it like sims does."""
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
                raise ValueError(f"{path}:{lineno}: not a trace line ({exc.__class__.__name__})") \
                    from None
            rows.append((t, p, o))
    if not rows:
        raise ValueError(f"{path}: empty trace")
    rows.sort(key=lambda r: r[0])
    a = np.array(rows, dtype=np.float64)
    m = len(rows)
    n = m if num_requests is None else num_requests
    idx = np.arange(n) % m
    duration = a[-1, 0] - a[0, 0]
    span = duration + duration / max(m - 1, 1)
    offset = a[idx, 0] - a[0, 0] + (np.arange(n) // m) * span
    return Schedule(offset, a[idx, 1].astype(np.int64), a[idx, 2].astype(np.int64),
                    np.full(n, -1, dtype=np.int32), np.zeros(n, dtype=np.int64))


def make_prompts(schedule: Schedule, seed: int, token_range: tuple[int, int]) -> list[list[int]]:
    """Random token-id prompts of exactly schedule.prompt_len[i] tokens."""
    lo, hi = token_range
    if not 0 <= lo < hi:
        raise ValueError(f"bad token id range {lo}:{hi}")
    rng = np.random.default_rng([seed, 1])
    prefixes: dict[int, np.ndarray] = {}
    prompts = []
    for i in range(len(schedule)):
        n, g, k = int(schedule.prompt_len[i]), int(schedule.prefix_group[i]), 0
        head = np.empty(0, dtype=np.int64)
        if g >= 0:
            k = int(schedule.prefix_len[i])
            if g not in prefixes:
                prefixes[g] = np.random.default_rng([seed, 2, g]).integers(lo, hi, size=k)
            head = prefixes[g][:k]
        prompts.append(np.concatenate([head, rng.integers(lo, hi, size=n - len(head))]).tolist())
    return prompts
