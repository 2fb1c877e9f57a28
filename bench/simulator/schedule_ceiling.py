"""How alike two runs of one workload can be: the ceiling on the simulator's same-chunks figure.

The fidelity grid scores the simulator's prefill steps against the live ones (`decision_fidelity.
compare_steps`: the share of prefill steps whose chunks, request x tokens x position, occur on the
other side). A deterministic model cannot reach 100% there even with every step time right,
because the live engine is not deterministic either. Two of its noises decide schedules:

- **The gateway -> engine delay varies from message to message.** A request reaching the engine
  just before a step's plan joins that step; just after, the next. A constant delay would not
  matter: it shifts a busy engine's whole timeline with its arrivals. Its variation does
  (`EngineConfig.network_jitter_s`). It is measured on the requests flushed while the engine was
  idle (`fidelity_steps.idle_dispatch_delays`, 9-13 a grid part, ~0.1-0.5 ms between p5 and p95).
- **Step times scatter at one shape.** Back-to-back decode-only steps at one decode count differ
  by a robust 0.15-0.36% on the H100 / H200 grid parts, with a heavy tail (sd 0.4-3.6%): a
  stall now and then. Each step time is multiplied by exp(r), r drawn from those back-to-back log
  ratios over sqrt 2 (both steps of a pair scatter). Steps that carry prefill scatter more: 0.4-0.8%
  robust at one shape in the profile's sustained runs (the pause check's back-to-back 256-token,
  mixed and packed steps), against 0.15-0.4% for decode-only steps on the same parts (session 23,
  `bench/results/fidelity_race_s23`), and live prefill steps against the last of exactly their shape
  0.3-0.7% on the 6.7B and 33B FP8, 1.4-1.9% on the 33B bf16. Prefill steps draw from that live
  sample where it has >= 100 pairs (equal prompts), else from the sustained runs' (mixed lengths),
  else from the decode steps' (`noise_of`'s `prefill_source`).

With mixed prompt lengths the first is what parts schedules: a prompt's last chunk leaves part of
the 256-token budget to whichever prompt has arrived. With equal prompts every chunk is a whole
256 tokens, and the second is (issue 35, sessions 18 and 22).

`ceiling_draws` re-runs one replay `draws` times with these noises drawn (the model and every
input as they were) and compares each draw's prefill steps with the undrawn replay's: the share
the simulator keeps against itself: the same-chunks figure a model exact in every mean timing
would reach against one live run, if the engine's noise is what is drawn (two live runs, each
with its own draw, share about as much or less). A live / simulated figure near it is as good as the noise lets
any model of the mean timings be. The same draws move the latency figures: `noise_half_widths`
turns that into the half-width of an n-seed interval the noise alone makes.
"""
from __future__ import annotations

import math
from dataclasses import replace
from itertools import pairwise

import numpy as np

NOISES = ("both", "delays", "scatter")


def step_scatter(rows: list[dict]) -> np.ndarray:
    """Log ratios of back-to-back decode-only step times at one decode count (drafting steps
    left out) over sqrt 2: a sample of one step's own scatter at its shape (the contexts of the
    pair differ by one token a sequence)."""
    r = [math.log(float(b["ms"]) / float(a["ms"])) for a, b in pairwise(rows)
         if not a["prefill"] and not b["prefill"] and a["decodes"] == b["decodes"] and a["decodes"] > 0
         and not a.get("drafts") and not b.get("drafts") and float(a["ms"]) > 0 and float(b["ms"]) > 0]
    return np.asarray(r, dtype=float) / math.sqrt(2.0)


def _shape(row: dict) -> tuple:
    """A step's shape without its request ids: its decode count and its chunks' (tokens, position)."""
    return row["decodes"], tuple(sorted((int(c[1]), int(c[2])) for c in row["prefill"]))


def prefill_step_scatter(rows: list[dict], within: int = 4) -> np.ndarray:
    """Log ratios over sqrt 2 of live prefill steps against the last step of exactly their shape
    (the same decode count, the same chunks' tokens and positions; other requests') at most
    `within` steps before. With equal prompts a prompt's chunks at positions 0 and 256 alternate,
    so a shape recurs every other step, never back to back; with mixed lengths shapes rarely
    recur (a few dozen pairs a part) and the sample is too small to use."""
    r = []
    for i, b in enumerate(rows):
        if not b["prefill"] or b.get("drafts") or float(b["ms"]) <= 0:
            continue
        for a in rows[max(0, i - within):i][::-1]:
            if a["prefill"] and _shape(a) == _shape(b):
                if not a.get("drafts") and float(a["ms"]) > 0:
                    r.append(math.log(float(b["ms"]) / float(a["ms"])))
                break
    return np.asarray(r, dtype=float) / math.sqrt(2.0)


def sustained_prefill_scatter(profile: dict) -> np.ndarray:
    """Log ratios of back-to-back step times over sqrt 2 from the profile's pause-check runs that
    repeat one prefill shape without pauses (`sustained`, `sustained_mixed`, `sustained_packed`:
    each a trace of ~10-270 steps), pooled, each run's centred on its median (the power cap's slow
    drift leaves a small bias in back-to-back ratios). Empty where the profile has none."""
    out = []
    for run in (profile.get("pause_check") or {}).get("runs", []):
        ms = np.asarray(run.get("trace_ms") or [], dtype=float)
        if run.get("run", "").startswith("sustained") and len(ms) > 2 and (ms > 0).all():
            r = np.diff(np.log(ms)) / math.sqrt(2.0)
            out.append(r - np.median(r))
    return np.concatenate(out) if out else np.zeros(0)


class ScatteredCost:
    """A cost model with each step time multiplied by exp(r), r drawn from `log_factors` (one draw
    a step; `decode_times` one a step of the stretch), or from `prefill_log_factors` for a step
    that carries prefill tokens, where given."""

    def __init__(self, inner, log_factors: np.ndarray, seed: int, prefill_log_factors=None):
        if not len(log_factors):
            raise ValueError("ScatteredCost needs at least one log factor")
        self.inner, self.log_factors = inner, np.asarray(log_factors, dtype=float)
        self.prefill_log_factors = (np.asarray(prefill_log_factors, dtype=float)
                                    if prefill_log_factors is not None and len(prefill_log_factors)
                                    else self.log_factors)
        self.rng = np.random.default_rng(seed)
        self.accepts_prefill_chunks = getattr(inner, "accepts_prefill_chunks", False)

    def step_time(self, *args, **kwargs) -> float:
        p = kwargs["num_prefill_tokens"] if "num_prefill_tokens" in kwargs else (args[1] if len(args) > 1 else 0)
        lf = self.prefill_log_factors if p else self.log_factors
        f = math.exp(lf[self.rng.integers(len(lf))])
        return f * self.inner.step_time(*args, **kwargs)

    def decode_times(self, num_decode_seqs: int, num_context_tokens: int, k: int) -> np.ndarray:
        t = self.inner.decode_times(num_decode_seqs, num_context_tokens, k)
        return t * np.exp(self.log_factors[self.rng.integers(len(self.log_factors), size=len(t))])

    def __getattr__(self, name):
        # the inner model's other terms (launch, the power cap), as ScaledCost keeps them
        if name == "inner" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.inner, name)


PREFILL_SOURCES = ("auto", "live", "sustained", "decode")
MIN_PREFILL_PAIRS = 100  # below this, a live same-shape sample's tail is not read: the next source


def noise_of(step_rows: list[dict], batches, profile: dict | None = None,
             prefill_source: str = "auto") -> dict:
    """The session's two noises as measured: the delays' centred sample and the step scatter:
    decode-only steps' from the step log; prefill steps' (`prefill_source`) from the log's
    same-shape prefill steps ("live"), the profile's sustained runs ("sustained"), the decode
    steps' sample ("decode"), or "auto": the first of those with enough pairs."""
    from bench.simulator.fidelity_steps import idle_dispatch_delays
    if prefill_source not in PREFILL_SOURCES:
        raise ValueError(f"prefill_source must be one of {PREFILL_SOURCES}, not {prefill_source!r}")
    d = idle_dispatch_delays(step_rows, batches)
    scatter = step_scatter(step_rows)
    pre, src = np.zeros(0), "decode"
    if prefill_source in ("auto", "live"):
        pre, src = prefill_step_scatter(step_rows), "live"
        if prefill_source == "auto" and len(pre) < MIN_PREFILL_PAIRS:
            pre = np.zeros(0)
    if prefill_source == "sustained" or (prefill_source == "auto" and not len(pre)):
        pre, src = sustained_prefill_scatter(profile or {}), "sustained"
    if not len(pre):
        src = "decode"
    return {"delays_s": d - np.median(d) if len(d) else np.zeros(0),
            "num_delays": len(d),
            "delay_p5_p95_ms": ([float(1e3 * np.percentile(d, q)) for q in (5, 95)] if len(d) else None),
            "scatter": scatter, "num_scatter": len(scatter),
            "scatter_robust_sd": robust_sd(scatter),
            "prefill_scatter": pre, "num_prefill_scatter": len(pre), "prefill_scatter_source": src,
            "prefill_scatter_robust_sd": robust_sd(pre)}


def robust_sd(v: np.ndarray) -> float | None:
    """1.4826 x the median absolute deviation (the sd of a normal core, blind to the tail); None
    for an empty sample."""
    return float(1.4826 * np.median(np.abs(v - np.median(v)))) if len(v) else None


def ceiling_draws(arrivals, spec_scheduler, engine, build_cost, base_steps, noise: dict,
                  draws: int, which: str = "both", seed: int = 0) -> dict:
    """Re-run one replay `draws` times with the noises drawn and compare each draw's prefill steps
    with `base_steps` (the undrawn replay's, every step recorded). `build_cost()`: a fresh cost
    model as the undrawn replay had it (a live-timed one keeps state). `which`: "both", "delays"
    or "scatter". Returns the mean share and each draw's."""
    from bench.simulator.decision_fidelity import compare_steps
    from bench.simulator.validate import prefill_steps_of
    from sims.decision_replay import replay_run, step_records
    from sims.report import summarize

    if which not in NOISES:
        raise ValueError(f"noise must be one of {NOISES}, not {which!r}")
    ids = {a.request_id for a in arrivals}
    base = prefill_steps_of(base_steps, ids)
    use_delays = which in ("both", "delays") and len(noise["delays_s"])
    use_scatter = which in ("both", "scatter") and len(noise["scatter"])
    shares, summaries = [], []
    for k in range(draws):
        eng = engine
        if use_delays:
            eng = replace(eng, network_jitter_s=tuple(float(x) for x in noise["delays_s"]),
                          jitter_seed=seed * 1000 + k)
        cost = build_cost()
        if use_scatter:
            cost = ScatteredCost(cost, noise["scatter"], seed * 1000 + k + 500,
                                 prefill_log_factors=noise.get("prefill_scatter"))
        res, _ = replay_run(arrivals, spec_scheduler, cost, eng, record_steps=True)
        drawn = prefill_steps_of(step_records(res, arrivals), ids)
        shares.append(compare_steps(base, drawn)["same_prefill_step_share"])
        summaries.append(summarize(res))
    return {"same_prefill_step_share": float(np.mean(shares)) if shares else 1.0,
            "draws": [float(x) for x in shares], "noise": which,
            "delays": bool(use_delays), "scatter": bool(use_scatter), "summaries": summaries}


def noise_half_widths(moves: dict[str, list[float]], num_runs: int, confidence: float = 0.95) -> dict:
    """Per figure: the half-width of a `num_runs`-seed interval that the noise alone makes, from
    `moves[figure]`, each draw's figure over its run's undrawn one - 1 (every run's draws): the
    sd of one run's figure under the noise, times t / sqrt(n). An interval of the grid's errors
    (one per seed) is at least about this wide however right the model is, so a figure whose mean
    is inside the bound but nearer it than this is bounded by the seed count, not the model."""
    from scipy import stats
    out = {}
    for name, v in moves.items():
        v = np.asarray([x for x in v if math.isfinite(x)], dtype=float)
        if len(v) < 2 or num_runs < 2:
            out[name] = math.nan
            continue
        t = float(stats.t.ppf(0.5 + confidence / 2, num_runs - 1))
        out[name] = t * float(v.std(ddof=1)) / math.sqrt(num_runs)
    return out


def runs_half_widths(ceilings: list[dict], confidence: float = 0.95) -> dict:
    """`noise_half_widths` of a load's runs, from each run's ceiling (`ceiling_draws` with its
    "figure_moves"): every run's draws pooled per figure, the interval of len(ceilings) seeds."""
    return noise_half_widths({k: [x for c in ceilings for x in c["figure_moves"][k]]
                              for k in ceilings[0]["figure_moves"]}, len(ceilings), confidence)
