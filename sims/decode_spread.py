"""Decode steps whose sequences have unequal contexts: the attention launch's critical path.

Why (issue 35): a profile measures decode steps whose d sequences all have the same context c,
and the cost model charges a live step by its total context, i.e. as if every sequence had the
mean. Live they do not: with mixed prompt and output lengths (lognormal, session 18, on an H100)
a decode-only step's model/live fell from 0.98 at max/mean context 1 to 0.88 at 3+, and those
steps held 81% of the part's error (bench/results/fidelity_spread_s19).

The decode attention kernel (backend/kernels/paged_attention.py) runs one program per (sequence,
kv head, context split), launched sequence-fastest, at most R resident at once (R = resident
programs per SM x SMs: the launch plan sizes its splits to fill one wave of them). Each program
streams its own slice of one sequence's keys and values, so a short sequence's programs finish
early and a long one's are still running. Model of one launch (`launch_time`): processor
sharing of the memory bandwidth. Work is in context tokens of one head, the whole bandwidth moves
one such token per time unit, the n programs running share it equally, and none runs faster than
`kappa` times its share in a full wave (kappa / R): a lone program cannot pull the bandwidth of a
full GPU. When R programs wait, a finishing one's slot is taken by the next in launch order. With
equal contexts and a full wave every program gets 1 / n <= kappa / R throughout, so the launch
takes its total work, which is what the profile's uniform points measured: only the spread adds
time. `spread_factor` is the launch's time over the same launch with every context at the mean,
and the cost model charges the step at its total context times that factor (`ProfileCost`).

kappa is measured, not fitted: profiles since session 19 carry "spread" decode points (d - 1
sequences at c and the last at 4c, `backend profile --decode-spread-points`), and `solve_kappa`
finds the kappa at which this model gives each point's measured time; the profile's
`decode_attention` names the launch plan per decode bucket (splits, resident programs, kv heads,
tile tokens). Profiles without the plan get `legacy_plan` (the kernel's constants as of session
18, the model's kv heads).
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# The decode kernel's launch constants up to session 18 (backend/kernels/paged_attention.py), for
# profiles written before they named their plan: bf16 pages, 64-token tiles, 4 resident programs
# per SM, splits sized to one wave, >= 128 tokens a split, <= 64 splits; 132 SMs (H100 SXM, H200).
LEGACY_SM_COUNT = 132
LEGACY_RESIDENT_PER_SM = 4
LEGACY_BLOCK_N = 64
LEGACY_MIN_TOKENS_PER_SPLIT = 128
LEGACY_MAX_SPLITS = 64


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class DecodeLaunchPlan:
    """How the engine launches a decode step's attention, per decode graph bucket."""
    num_kv_heads: int
    block_n: int
    buckets: tuple[int, ...]      # ascending; a step of d sequences runs the smallest >= d
    splits: tuple[int, ...]       # context splits of that bucket's launch
    resident: tuple[int, ...]     # programs resident at once in that launch

    @classmethod
    def from_profile(cls, doc: dict) -> DecodeLaunchPlan | None:
        """The profile's `decode_attention` (backend profile, session 19), or None where there is
        none or its attention is not the Triton kernel this module models (the CPU's, torch's)."""
        plan = doc.get("decode_attention")
        if not plan or not plan.get("buckets") or plan.get("kernel", "triton") != "triton":
            return None
        rows = sorted((int(b), int(v["splits"]), int(v["resident_programs"]))
                      for b, v in plan["buckets"].items())
        return cls(int(plan["num_kv_heads"]), int(plan["block_n"]), tuple(r[0] for r in rows),
                   tuple(r[1] for r in rows), tuple(r[2] for r in rows))

    @classmethod
    def legacy(cls, num_kv_heads: int, buckets: Sequence[int], split_context_len: int) -> DecodeLaunchPlan:
        """The plan the engine used before profiles named it (module constants above): bf16
        pages; a CUDA-graph decode launch splits for `split_context_len` (max_model_len)."""
        resident = LEGACY_RESIDENT_PER_SM * LEGACY_SM_COUNT
        splits = []
        for b in buckets:
            wanted = resident // max(1, b * num_kv_heads)
            s = max(1, min(wanted, _cdiv(max(1, split_context_len), LEGACY_MIN_TOKENS_PER_SPLIT),
                           LEGACY_MAX_SPLITS))
            per = _cdiv(_cdiv(split_context_len, s), LEGACY_BLOCK_N) * LEGACY_BLOCK_N
            splits.append(_cdiv(split_context_len, per))
        bs = tuple(int(b) for b in buckets)
        return cls(num_kv_heads, LEGACY_BLOCK_N, bs, tuple(splits), (resident,) * len(bs))

    def launch(self, d: int) -> tuple[int, int, int]:
        """(bucket, splits, resident programs) of a decode step of d sequences; past the last
        bucket, d rows at the last bucket's splits (eager)."""
        i = int(np.searchsorted(self.buckets, d))
        if i >= len(self.buckets):
            return d, self.splits[-1], self.resident[-1]
        return self.buckets[i], self.splits[i], self.resident[i]


def program_works(contexts: Sequence[int], bucket: int, num_kv_heads: int, splits: int,
                  block_n: int) -> np.ndarray:
    """Tokens each program of the launch reads, in launch order (split, then kv head, then
    sequence fastest: the kernel's grid). A sequence's split holds whole tiles of
    ceil(ceil(c / splits) / block_n) tiles (the last one what is left); padding rows read one."""
    c = np.ones(bucket, dtype=np.int64)
    c[:len(contexts)] = contexts
    per = np.maximum(_cdiv_np(_cdiv_np(c, splits), block_n) * block_n, 1)
    w = np.clip(c[None, :] - np.arange(splits)[:, None] * per[None, :], 0, per[None, :])
    return np.broadcast_to(w[:, None, :], (splits, num_kv_heads, bucket)).reshape(-1).astype(np.float64)


def _cdiv_np(a: np.ndarray, b: int) -> np.ndarray:
    return -(-a // b)


def launch_time(works: np.ndarray, resident: int, kappa: float) -> float:
    """Time of a launch of programs with these works (launch order) under processor sharing
    (module doc): one unit of work per unit time in all, n running programs at
    min(kappa / resident, 1 / n) each, at most `resident` running."""
    if kappa < 1.0:
        raise ValueError(f"kappa {kappa}: a lone program streams at least its share of a full wave (>= 1)")
    n_all = len(works)
    if n_all == 0:
        return 0.0
    if n_all <= resident:  # one wave: all start at once
        return _drain(np.asarray(works, dtype=np.float64), resident, kappa)
    # Several waves. While programs wait, `resident` run, each at 1 / resident (kappa >= 1): every
    # running program advances alike, so list scheduling on the common progress v — a waiting
    # program starts when the running one with the least work left ends (the heap's head) — and
    # the time is v * resident. Once the last has started, the running ones drain.
    heap = works[:resident].tolist()
    heapq.heapify(heap)
    replace = heapq.heapreplace
    v = 0.0
    for w in works[resident:].tolist():
        v = heap[0]  # the progress at which this program starts
        replace(heap, v + w)
    return v * resident + _drain(np.asarray(heap, dtype=np.float64) - v, resident, kappa)


def _drain(left: np.ndarray, resident: int, kappa: float) -> float:
    """Time for programs all running, with `left` work each, to end (the closed form over the
    sorted works: between two finishes the n still running share alike)."""
    w = np.sort(left)
    steps = np.diff(w, prepend=0.0)
    active = np.arange(len(w), 0, -1, dtype=np.float64)
    return float(np.sum(steps / np.minimum(kappa / resident, 1.0 / active)))


def spread_factor(contexts: Sequence[int], plan: DecodeLaunchPlan, kappa: float,
                  even_memo: dict | None = None) -> float:
    """The launch's time with these contexts over its time with every context at their mean
    (>= about 1; exactly 1 for equal contexts). `even_memo`: a dict the caller keeps, holding
    the even launches' times by (d, mean, kappa) (a launch of several waves costs ~1 ms here)."""
    d = len(contexts)
    if d < 2 or math.isinf(kappa):
        return 1.0
    bucket, s, r = plan.launch(d)
    het = launch_time(program_works(contexts, bucket, plan.num_kv_heads, s, plan.block_n), r, kappa)
    mean = max(1, round(sum(contexts) / d))
    key = (d, mean, kappa)
    uni = None if even_memo is None else even_memo.get(key)
    if uni is None:
        uni = launch_time(program_works([mean] * d, bucket, plan.num_kv_heads, s, plan.block_n), r, kappa)
        if even_memo is not None:
            even_memo[key] = uni
    return het / uni if uni > 0 else 1.0


def solve_kappa(contexts: Sequence[int], plan: DecodeLaunchPlan, factor: float,
                lo: float = 1.0, hi: float = 64.0, iters: int = 40) -> float:
    """The kappa at which `spread_factor(contexts)` equals a measured `factor` (the point's
    time read as its total context's multiple). The factor falls as kappa grows; a factor at or
    below the one at `hi` gives inf (no cap seen), at or above the one at `lo` gives `lo`."""
    if factor <= spread_factor(contexts, plan, hi):
        return math.inf
    if factor >= spread_factor(contexts, plan, lo):
        return lo
    for _ in range(iters):  # bisection in log kappa
        mid = math.sqrt(lo * hi)
        if spread_factor(contexts, plan, mid) > factor:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


def expand_context_lens(runs: Sequence[Sequence[int]]) -> list[int]:
    """A profile point's `decode_context_lens` ([count, context] pairs) as a list."""
    out: list[int] = []
    for n, c in runs:
        out.extend([int(c)] * int(n))
    return out
