"""Step-level fidelity of a `sim validate` session (issue 35): the cost model at the live steps,
and where the live and simulated schedules part.

Two questions, both answered from the committed logs without device time:

1. *Is the cost model right at the steps the engine ran?* `live_steps` rebuilds every live step's
   composition from the backend's `--step-log` and the gateway's decision log — decodes and their
   context tokens (a request decodes from the step after its last prefill chunk, one token a step,
   until it has `max_tokens`; checked against the logged decode count of every step), prefill
   chunks — and `step_cost_table` sets the model's time for that composition beside the live
   duration, by kind (decode-only after decode-only, after a prefill step, after an idle spell;
   steps with prefill by size and by the prefill-busy share of the `window_s` before them), by
   decode batch size and by context length. A factor that is the same in every bin is a clock;
   one that moves with a bin is a term of the model.

2. *Where do the schedules part?* `first_divergence` walks a run's live and simulated prefill
   steps in order to the first whose chunks differ and says why: for the request that moved, its
   flush (the gateway's decision log), and on each side the plan time of the step it joined
   (the async loop plans step k+1 `lead` before step k ends, at step k's start when step k
   carries prefill on the engine before the prefill launch deadline), and the drift — simulated
   minus live start of the last prefill step both sides shared. A request delivered between the
   two sides' plan times parted by timing; one delivered before both by a rule (a tie-break, a
   budget).

    python -m bench.simulator.fidelity_steps VALIDATE.json DECISIONS.jsonl[.gz] STEPS.jsonl[.gz] \\
        PROFILE.json [--hide-launch] [--power-cap] [--async-plan-lead-ms 2.06] [--delivery-ms D]
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from bench.simulator.decision_fidelity import compare_steps
from scheduler.decisions import StepRecord, step_from_json


def read_steps(path: str | Path) -> list[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def live_steps(rows: list[dict], max_tokens: dict[str, int]) -> tuple[list[dict], int]:
    """Every live step with its decodes' context tokens rebuilt (module doc, 1). `max_tokens`:
    request id -> its max_tokens (the decision log's arrivals). Returns the steps (dicts with
    d, ctx (Σ decode context + 1 each, as the simulator counts it), ctxs (those contexts in join
    order), p, chunks [(tokens, start)],
    start, end (s, the step log's monotonic clock), ms, prefill_before (the step before carried
    prefill), idle_before (the engine was idle before it)) and how many steps' rebuilt decode count
    differ from the logged one (0: the rebuild is exact)."""
    last = {}
    for i, s in enumerate(rows):
        for rid, _n, _st in s["prefill"]:
            last[rid] = i
    running: dict[str, list[int]] = {}  # id -> [context, generated]
    joining: dict[int, list[tuple[str, int]]] = {}
    out, bad, prev_end = [], 0, None
    for i, s in enumerate(rows):
        for rid, ctx in joining.pop(i, ()):
            running[rid] = [ctx, 1]  # the prefill step sampled its first token
        d = len(running)
        bad += d != s["decodes"]
        start = float(s["mono"])
        end = start + float(s["ms"]) / 1e3
        ctxs = [c + 1 for c, _ in running.values()]
        out.append({"d": s["decodes"], "ctx": sum(ctxs), "ctxs": ctxs,
                    "p": int(s["prefill_tokens"]), "chunks": [(int(n), int(st)) for _, n, st in s["prefill"]],
                    "start": start, "end": end, "ms": float(s["ms"]),
                    "prefill_before": bool(i and rows[i - 1]["prefill_tokens"]),
                    "idle_before": prev_end is None or start - prev_end > 5e-4})
        prev_end = end
        for rid, st in list(running.items()):
            st[0] += 1
            st[1] += 1
            if st[1] >= max_tokens.get(rid, 1 << 30):
                del running[rid]
        for rid, n, pos in s["prefill"]:
            if last[rid] == i:  # its last chunk: decodes from the next step
                joining.setdefault(i + 1, []).append((rid, int(pos) + int(n)))
    return out, bad


def part_live_steps(part: str | Path) -> tuple[Path, dict, list[dict]]:
    """A grid part's folder (`scripts/gpu_fidelity_grid_run.sh`: profile_<tag>.json, decisions_<tag>.jsonl.gz,
    steps_<tag>.jsonl.gz, <tag> the folder's name): its profile's path and document, and its live steps
    (`live_steps`, the decode counts rebuilt from the decisions' max_tokens)."""
    from scheduler.decisions import read_log

    part = Path(part)
    tag = part.name
    prof = part / f"profile_{tag}.json"
    arr, _ = read_log(part / f"decisions_{tag}.jsonl.gz")
    steps, _bad = live_steps(read_steps(part / f"steps_{tag}.jsonl.gz"), {a.request_id: a.max_tokens for a in arr})
    return prof, json.loads(prof.read_text()), steps


def validate_run_labels(part: str | Path) -> list[tuple[str, int]]:
    """(load label, seed) of each run, in the order a part's validate log ran them."""
    import re

    part = Path(part)
    text = (part / f"validate_{part.name}.log").read_text()
    return [(m.group(1), int(m.group(2))) for m in re.finditer(r"load (\S+) rate \S+ seed (\d+)", text)]


def runs_at_gaps(steps: list[dict], gap_s: float = 1.0) -> list[list[int]]:
    """The steps' indices cut into runs wherever the engine idled over `gap_s` (a validate's runs lie 2-4 s
    apart, while inside a run the engine idles under a second)."""
    runs: list[list[int]] = []
    for i, s in enumerate(steps):
        if runs and s["start"] - steps[runs[-1][-1]]["end"] <= gap_s:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def labelled_runs(part: str | Path, steps: list[dict], gap_s: float = 1.0) -> list[tuple[str, list[int]]]:
    """`runs_at_gaps` named for the reader: "<load> seed <n>" from the part's validate log where it ran as many
    runs as the gaps cut, else "run <k>" (an interrupted part's log names runs the steps did not finish)."""
    runs = runs_at_gaps(steps, gap_s)
    logged = validate_run_labels(part)
    if len(logged) != len(runs):
        return [(f"run {k}", idx) for k, idx in enumerate(runs)]
    return [(f"{load} seed {seed}", idx) for (load, seed), idx in zip(logged, runs)]


def dispatch_delay(rows: list[dict], batches) -> tuple[float, int]:
    """Seconds from the gateway's flush to the backend's plan of the step that prefills the
    request, median over the requests flushed while the engine was idle (their step starts at
    once: the wire, the worker's receive and its planning; `EngineConfig.network_delay_s`), and
    how many such requests there were (0: none, delay 0). `rows`: step-log records (their
    monotonic `mono` start and `ms`); `batches`: the decision log's windows (the same clock)."""
    delays = idle_dispatch_delays(rows, batches)
    return (float(np.median(delays)) if len(delays) else 0.0), len(delays)


def idle_dispatch_delays(rows: list[dict], batches) -> np.ndarray:
    """Every flush -> plan delay (seconds) of a request flushed while the engine was idle: the
    sample `dispatch_delay` takes the median of, and whose spread is the delay's variation
    (`EngineConfig.network_jitter_s`, bench.simulator.schedule_ceiling)."""
    flush = {rid: b.t for b in batches for rid in b.request_ids}
    first, ends = {}, []
    for k, s in enumerate(rows):
        ends.append(float(s["mono"]) + float(s["ms"]) / 1e3)
        for rid, _n, _st in s["prefill"]:
            first.setdefault(str(rid), k)
    return np.array([float(rows[k]["mono"]) - flush[rid] for rid, k in first.items()
                     if rid in flush and (k == 0 or ends[k - 1] < flush[rid])], dtype=float)


def busy_shares(steps: list[dict], k: int, window_s: float, tau_s: float | None = None,
                weights: dict[int, float] | None = None) -> tuple[float, float]:
    """Shares of the `window_s` before step k's start that ran steps carrying prefill, and
    decode-only steps (the power-cap model's f and g). `tau_s` (a profile with a sustained trace,
    `ProfileCost.power_cap_tau_s`): exponential averages with that time constant instead, over
    the steps that ended in the `window_s` before (the simulator's event loop alike). `weights`
    (step index -> its kind's weight, `ProfileCost.cap_weight`; a step not in it weighs 1): each
    prefill step's span counts at its weight, as the event loop's `prefill_spans` do with the
    power-by-kind cap (before session 25 the scorer counted every one at 1)."""
    t = steps[k]["start"]
    t0, busy, dec, j = t - window_s, 0.0, 0.0, k - 1
    while j >= 0 and steps[j]["end"] > t0:
        if tau_s is not None:
            span = np.exp((min(steps[j]["end"], t) - t) / tau_s) - np.exp((steps[j]["start"] - t) / tau_s)
        else:
            span = min(steps[j]["end"], t) - max(steps[j]["start"], t0)
        if steps[j]["p"]:
            busy += span if weights is None else span * weights.get(j, 1.0)
        else:
            dec += span
        j -= 1
    if tau_s is not None:
        return float(busy), float(dec)
    return busy / window_s, dec / window_s


def model_step_ms(cost, steps: list[dict], window_s: float = 0.1) -> list[tuple[int, float, float]]:
    """The model's time at each live step's composition: (index into `steps`, model ms, the
    prefill-busy share of the `window_s` before it), empty steps left out. A step after an idle
    spell is charged the model's idle launch (`launch_time`) where it hides launches, a step (with
    the compute-share cap: every step) its power-cap slowdown (`prefill_slowdown`) where the model
    has one."""
    idle_launch = cost.launch_time if getattr(cost, "hides_launch", False) else None
    spread = cost.decode_context_multiple if getattr(cost, "charges_decode_spread", False) else None
    mixed = cost.mixed_context_multiple if getattr(cost, "charges_mixed_spread", False) else None
    tau = getattr(cost, "power_cap_tau_s", None)
    if tau is not None:  # exponential shares over the model's own horizon (6 tau)
        window_s = max(window_s, cost.power_cap_window_s)
    # the limiter's fast onset: a second share at its own time constant (sims.profile_cost, "The
    # limiter's onset"), over its own horizon
    tau_fast = getattr(cost, "power_cap_tau_fast_s", None) if tau is not None else None
    # the power-by-kind cap: each prefill step's span weighs its kind's power in the later steps'
    # busy share, as in the event loop (sims.profile_cost, "Power by step kind")
    weights = {} if getattr(cost, "weights_cap_by_power", False) else None
    # the limiter's slow sag (sims.profile_cost, "The slow sag"): a weighted share at its time
    # constant, folded step by step (its horizon, seconds, holds too many steps to sum each time)
    tau_sag = getattr(cost, "power_cap_tau_sag_s", None) if tau is not None else None
    sag_acc, sag_t, sag_next = 0.0, None, 0  # its value at sag_t, the next step to fold in
    # the delayed onset (sims.profile_cost, "The delayed onset"): the start of the run of steps with prefill
    # back to back that the step belongs to (a decode-only step or an idle spell ends one)
    delay = cost.delay_factor if getattr(cost, "cap_delay", None) else None
    run_start = None
    out = []
    for k, s in enumerate(steps):
        fs = None
        if tau_sag is not None:
            while sag_next < k:  # the steps before k, ended by its start (the live steps follow each other)
                j = steps[sag_next]
                if j["p"]:
                    a, b = j["start"], min(j["end"], s["start"])
                    w = 1.0 if weights is None else weights.get(sag_next, 1.0)
                    sag_acc = (sag_acc * math.exp((sag_t - b) / tau_sag) if sag_t is not None else 0.0) \
                        - w * math.expm1((a - b) / tau_sag)
                    sag_t = b
                sag_next += 1
            fs = 0.0 if sag_t is None else sag_acc * math.exp((sag_t - s["start"]) / tau_sag)
        if not s["d"] and not s["p"]:
            continue
        chunks = s["chunks"] or None
        ctx = s["ctx"] + sum(n + st for n, st in s["chunks"])
        if spread is not None and not s["p"] and s.get("ctxs"):  # the contexts' spread (sims.decode_spread)
            ctx = int(ctx * spread(s["ctxs"]))
        elif mixed is not None and s["p"] and s.get("ctxs"):  # beside a chunk
            ctx += int(sum(s["ctxs"]) * (mixed(s["ctxs"]) - 1.0))
        t = cost.step_time(s["d"], s["p"], ctx, chunks)
        by_compute = getattr(cost, "caps_by_compute", False)
        f, g = busy_shares(steps, k, window_s, tau, weights) if s["p"] or by_compute else (0.0, 0.0)
        ff = (busy_shares(steps, k, 8.0 * tau_fast, tau_fast, weights)[0]
              if tau_fast is not None and (s["p"] or by_compute) else None)
        if s["p"] and weights is not None:
            weights[k] = cost.cap_weight(s["d"], s["p"], ctx, chunks)
        if s["p"] and weights is not None and getattr(cost, "counts_decode_spells", True):
            # decode spells at its kind's weight (sims.profile_cost, "Decode spells")
            f += weights[k] * g
        if by_compute:  # every step, decode-only ones too, by its compute share
            t *= cost.prefill_slowdown(f, g, cost.compute_share(s["d"], s["p"], ctx, chunks), ff, fs)
        elif s["p"]:
            t *= cost.prefill_slowdown(f, g, None, ff, fs)  # 1.0 unless the model has the power cap on
        if delay is not None:
            if s["p"]:
                if run_start is None or s["idle_before"]:
                    run_start = s["start"]
                t *= delay(s["d"], s["p"], ctx, chunks, s["start"] - run_start, t, not s["idle_before"])
            else:
                run_start = None
        if s["p"] and not s["idle_before"] and getattr(cost, "busy_level", None) is not None \
                and getattr(cost, "power_cap_window_s", None) is not None:
            t *= cost.busy_level  # a step launched behind another (sims.profile_cost, "The busy level")
        if idle_launch is not None and s["idle_before"]:
            t += idle_launch(s["d"], s["p"])
        out.append((k, 1e3 * t, f))
    return out


def step_cost_table(cost, steps: list[dict], window_s: float = 0.1) -> list[dict]:
    """The model's time (ms) at each live step's composition against the live duration, per bin
    (module doc, 1): rows of {bin, n, live_ms, model_ms, ratio (model total / live total)}
    (`model_step_ms`)."""
    rec = [(steps[k], t, f) for k, t, f in model_step_ms(cost, steps, window_s)]
    bins: dict[str, list] = {}

    def put(name, s, t):
        bins.setdefault(name, []).append((s["ms"], t))

    for s, t, f in rec:
        if not s["p"]:
            kind = ("decode-only, after idle" if s["idle_before"] else
                    "decode-only, after a prefill step" if s["prefill_before"] else
                    "decode-only, after decode-only")
            put(kind, s, t)
            if kind.endswith("after decode-only"):
                d = s["d"]
                lo = 1 << (d.bit_length() - 1)
                put(f"  decodes {lo}-{2 * lo - 1}", s, t)
                c = s["ctx"] / d
                put(f"  context {int(c // 64 * 64)}-{int(c // 64 * 64) + 63}", s, t)
        else:
            size = "<= 512" if s["p"] <= 512 else "> 512"
            if s["idle_before"]:
                put(f"prefill {size}, after idle", s, t)
            else:
                share = "0" if f < 0.01 else "0.01-0.5" if f < 0.5 else ">= 0.5"
                put(f"prefill {size}, busy, prefill share {share}", s, t)
    out = []
    for name in sorted(bins, key=_bin_order):
        a = np.array(bins[name])
        # the ratio of the totals: what the simulated time line gains or loses over these steps
        out.append({"bin": name, "n": len(a), "live_ms": float(a[:, 0].mean()),
                    "model_ms": float(a[:, 1].mean()), "ratio": float(a[:, 1].sum() / a[:, 0].sum())})
    return out


def _bin_order(name: str):
    head = ("decode-only, after decode-only", "  decodes", "  context", "decode-only, after a",
            "decode-only, after idle", "prefill <=", "prefill >")
    i = next((j for j, h in enumerate(head) if name.startswith(h)), len(head))
    num = [int(x) for x in name.replace("-", " ").split() if x.isdigit()]
    return (i, num, name)


def format_cost_table(rows: list[dict]) -> str:
    lines = [f"{'step kind':<46}{'n':>6}{'live ms':>10}{'model ms':>10}{'model/live':>12}"]  # of totals
    lines += [f"{r['bin']:<46}{r['n']:>6}{r['live_ms']:>10.2f}{r['model_ms']:>10.2f}{r['ratio']:>12.4f}"
              for r in rows]
    return "\n".join(lines)


class LiveTimedCost:
    """A diagnostic, not a model: the live step times fed back. A step with prefill whose chunks
    (request, tokens, position) are a live step's is charged that step's live duration; the j-th
    decode-only step after such a step the live j-th one's (while the schedules agree, the same
    step), otherwise the live median at its decode count; anything else the inner model. The
    simulator calls `step_time` once per step in start order (one backend, stretches off). If the
    schedules then agree, what parted them was the step times alone (module doc, 2)."""

    accepts_prefill_chunks = True

    def __init__(self, inner, live_ids: list[str], rows: list[dict]):
        self.inner, self.ids = inner, live_ids
        self.prefill, self.after = {}, {}
        by_d: dict[int, list[float]] = {}
        key, j = None, 0
        for row in rows:
            if row["prefill"]:
                key, j = frozenset((str(r), int(n), int(st)) for r, n, st in row["prefill"]), 0
                self.prefill[key] = row["ms"] / 1e3
            elif row["decodes"]:
                j += 1
                self.after[(key, j, int(row["decodes"]))] = row["ms"] / 1e3
                by_d.setdefault(int(row["decodes"]), []).append(row["ms"] / 1e3)
        self.decode = {d: float(np.median(v)) for d, v in by_d.items()}
        self.num_matched = self.num_model = 0
        self._key, self._j, self._matched = None, 0, False

    def step_time(self, num_decode_seqs: int, num_prefill_tokens: int, num_context_tokens: int,
                  prefill_chunks=None) -> float:
        t = None
        if num_prefill_tokens and prefill_chunks is not None:
            self._key = frozenset((self.ids[int(c.request_id)], len(c.token_ids), int(c.start_pos))
                                  for c in prefill_chunks)
            self._j = 0
            t = self.prefill.get(self._key)
        elif not num_prefill_tokens:
            self._j += 1
            t = self.after.get((self._key, self._j, num_decode_seqs), self.decode.get(num_decode_seqs))
        self._matched = t is not None
        if t is not None:
            self.num_matched += 1
            return t
        self.num_model += 1
        args = (num_decode_seqs, num_prefill_tokens, num_context_tokens)
        return self.inner.step_time(*args, prefill_chunks) if prefill_chunks is not None else \
            self.inner.step_time(*args)

    # a live duration already holds what the model adds to its own step times (the event loop
    # calls these right after `step_time`): the power cap's slowdown, the launch after an idle
    # spell. Charging them again slowed every matched prefill step by the cap's factor
    def prefill_slowdown(self, busy_share: float, decode_share: float = 0.0, *share) -> float:
        return 1.0 if self._matched else self.inner.prefill_slowdown(busy_share, decode_share, *share)

    def launch_time(self, num_decode_seqs: int, num_prefill_tokens: int) -> float:
        return 0.0 if self._matched else self.inner.launch_time(num_decode_seqs, num_prefill_tokens)

    def __getattr__(self, name):
        if name == "inner" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.inner, name)


def plan_time(steps: list, k: int, lead_s: float, prefill_deadline: bool, end_of) -> float:
    """When the step at index k was planned: `lead_s` before its predecessor's end; at the
    predecessor's start when that carried prefill and the engine had no prefill launch deadline;
    at its own start after an idle spell."""
    if k == 0:
        return steps[0].t
    prev, start = steps[k - 1], steps[k].t
    end = end_of(k - 1)
    if start - end > 5e-4:
        return start
    if prev.prefill and not prefill_deadline:
        return prev.t
    return end - lead_s


def first_divergence(live: list[StepRecord], sim: list[StepRecord], flush: dict[str, float],
                     lead_s: float, prefill_deadline: bool = False, delay_s: float = 0.0) -> dict | None:
    """The first prefill step (in order) whose chunks differ between the two sides, explained
    (module doc, 2); None when every prefill step agrees. `live`/`sim`: all steps of one backend
    (with `ms`), in order; `flush`: request id -> flush time (the same clock); `delay_s`: flush ->
    the backend (a request planned before it arrives misses the step: by timing)."""
    def ends(steps):
        return lambda k: steps[k].t + (steps[k].ms or 0.0) / 1e3

    lp = [k for k, s in enumerate(live) if s.prefill]
    sp = [k for k, s in enumerate(sim) if s.prefill]
    last_common = None
    for i in range(min(len(lp), len(sp))):
        a, b = live[lp[i]], sim[sp[i]]
        if frozenset(a.prefill) == frozenset(b.prefill):
            last_common = (a.t, b.t)
            continue
        # the earliest-flushed request of the two steps whose step-mates differ between the sides
        step_of = ({c[0]: k for k in lp for c in live[k].prefill}, {c[0]: k for k in sp for c in sim[k].prefill})

        def mates(side, steps, r, step_of=step_of):
            k = step_of[side].get(r)
            return None if k is None else frozenset(c[0] for c in steps[k].prefill)

        cands = {c[0] for c in a.prefill + b.prefill}
        moved = [r for r in cands if mates(0, live, r) != mates(1, sim, r)] or sorted(cands)
        rid = min(moved, key=lambda r: flush.get(r, np.inf))
        if rid not in step_of[0] or rid not in step_of[1]:
            return {"index": i, "request": rid, "by_timing": False, "one_side_only": True,
                    "cause": "one side only"}
        ka, kb = step_of[0][rid], step_of[1][rid]
        t = flush.get(rid, np.nan)
        pa = plan_time(live, ka, lead_s, prefill_deadline, ends(live))
        pb = plan_time(sim, kb, lead_s, prefill_deadline, ends(sim))
        # the plan time of the step before the one it joined: it missed that step
        pa0 = plan_time(live, ka - 1, lead_s, prefill_deadline, ends(live)) if ka else -np.inf
        pb0 = plan_time(sim, kb - 1, lead_s, prefill_deadline, ends(sim)) if kb else -np.inf
        later = "live" if live[ka].t > sim[kb].t else "sim"
        # by timing: it reached the backend (flush + delay) after the plan of the step it missed
        # on the later side
        missed = pa0 if later == "live" else pb0
        by_timing = bool(missed < t + delay_s)
        # else, another request reaching the backend between the two sides' plans of the parting
        # step changed what the plan saw (the prefill cap reads the backlog: one request more
        # and the step takes the whole budget), or the two steps carry different decode counts
        # (the token budget left to the chunks)
        qa = plan_time(live, lp[i], lead_s, prefill_deadline, ends(live))
        qb = plan_time(sim, sp[i], lead_s, prefill_deadline, ends(sim))
        lo, hi = min(qa, qb), max(qa, qb)
        between = sorted((ft, r) for r, ft in flush.items() if lo < ft + delay_s <= hi)
        cause = ("timing" if by_timing else "arrival" if between else
                 "decodes" if a.num_decodes != b.num_decodes else "rule")
        return {"index": i, "request": rid, "flush": t, "later_side": later, "cause": cause,
                "arrival_between_plans": between[0][1] if between else None,
                "plans_ms_apart": 1e3 * (hi - lo), "decodes": [a.num_decodes, b.num_decodes],
                "live_step_start": live[ka].t, "sim_step_start": sim[kb].t,
                "live_plan_ms_after_flush": 1e3 * (pa - t), "sim_plan_ms_after_flush": 1e3 * (pb - t),
                "missed_plan_ms_after_flush": 1e3 * (missed - t),
                "by_timing": by_timing,
                "drift_ms": None if last_common is None else 1e3 * (last_common[1] - last_common[0]),
                "sim_minus_live_start_ms": 1e3 * (sim[kb].t - live[ka].t)}
    return None


def schedule_report(result: dict, validate: dict, arrivals, batches, rows: list[dict], lead_s: float,
                    prefill_deadline: bool = False, delay_s: float = 0.0) -> list[dict]:
    """Per load: each run's same-prefill-step share (`compare_steps`) and first divergence."""
    from bench.simulator.fidelity_resim import prompt_identity

    # the step log's monotonic start (the decision log's clock), not its wall-clock "t"
    live_all = [step_from_json(r | {"t": r["mono"]}) for r in rows]
    sim_all = result["steps"]
    arrivals = sorted(arrivals, key=lambda a: a.t)
    _, runs = prompt_identity(validate["config"], len(arrivals))
    flush = {rid: b.t for b in batches for rid in b.request_ids}
    out = []
    for li, ld in enumerate(validate["loads"]):
        per = []
        for si in range(len(ld["runs"])):
            ids = {a.request_id for a, r in zip(arrivals, runs, strict=True) if r == (si, li)}
            lo, hi = _span(live_all, ids)
            slo, shi = _span(sim_all, ids)
            lv = [s for s in live_all if lo <= s.t <= hi]
            sv = [s for s in sim_all if slo <= s.t <= shi]
            cmp_ = compare_steps([s for s in lv if s.prefill], [s for s in sv if s.prefill])
            div = first_divergence(lv, sv, flush, lead_s, prefill_deadline, delay_s)
            # windows: live from the decision log, simulated as requests sharing a dispatch time
            live_w = sum(1 for b in batches if b.request_ids and b.request_ids[0] in ids)
            sim_w = len({result["dispatch_time"][r] for r in ids}) if "dispatch_time" in result else 0
            per.append({"seed": ld["runs"][si]["seed"], "same_prefill_step_share": cmp_["same_prefill_step_share"],
                        "num_prefill_steps": cmp_["num_prefill_steps"], "first_divergence": div,
                        "num_requests": len(ids), "num_windows": [live_w, sim_w]})
        out.append({"load_label": ld["load_label"], "runs": per,
                    "same_prefill_step_share": float(np.mean([r["same_prefill_step_share"] for r in per]))})
    return out


def _span(steps, ids) -> tuple[float, float]:
    ts = [s.t for s in steps if any(c[0] in ids for c in s.prefill)]
    return (min(ts), max(ts)) if ts else (np.inf, -np.inf)


def main(argv: list[str] | None = None) -> int:
    from bench.simulator.fidelity_resim import format_table, resimulate, session_prefill_cap
    from scheduler.decisions import read_log
    from sims.profile_cost import ProfileCost

    p = argparse.ArgumentParser(prog="python -m bench.simulator.fidelity_steps", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("validate")
    p.add_argument("decisions")
    p.add_argument("steps")
    p.add_argument("profile")
    p.add_argument("--hide-launch", action="store_true")
    p.add_argument("--power-cap", action="store_true")
    p.add_argument("--power-cap-alike", action="store_true",
                   help="with --power-cap: every step with prefill slowed alike (the model before "
                        "the compute share, ProfileCost(cap_by_compute=False))")
    p.add_argument("--async-plan-lead-ms", type=float, default=None)
    p.add_argument("--prefill-launch-deadline", action="store_true",
                   help="the engine had the prefill launch deadline (runs recorded after ea1ebf1)")
    p.add_argument("--delivery-ms", type=float, default=0.0)
    p.add_argument("--delivery-per-stream-ms", type=float, default=0.0,
                   help="the delivery path's growth per stream of a token's step "
                        "(EngineConfig.delivery_per_stream_s; 0: --delivery-ms alone)")
    p.add_argument("--network-delay-ms", default="0",
                   help="gateway flush -> backend plan (EngineConfig.network_delay_s) in ms, or "
                        "'auto': measured from these logs (dispatch_delay)")
    p.add_argument("--prefill-cap", default="auto",
                   help="the live engine's prefill cap while decoding: auto (recorded, or the "
                        "engine's default for sessions after it came in), live, off, or tokens "
                        "(fidelity_resim.session_prefill_cap)")
    p.add_argument("--no-schedule", action="store_true", help="the step-cost table only")
    p.add_argument("--live-times", action="store_true",
                   help="diagnostic: re-simulate with the live step times fed back (LiveTimedCost)")
    p.add_argument("--json", dest="json_out")
    a = p.parse_args(argv)
    validate = json.loads(Path(a.validate).read_text())
    arrivals, batches = read_log(a.decisions)
    rows = read_steps(a.steps)
    steps, bad = live_steps(rows, {x.request_id: x.max_tokens for x in arrivals})
    power_cap = "alike" if a.power_cap and a.power_cap_alike else a.power_cap
    cost = ProfileCost.from_json(a.profile, hide_launch=a.hide_launch, power_cap=a.power_cap,
                                 cap_by_compute=not a.power_cap_alike)
    delay_s, num_idle = dispatch_delay(rows, batches)
    print(f"flush -> plan on an idle engine: median {1e3 * delay_s:.2f} ms over {num_idle} requests")
    net_s = delay_s if a.network_delay_ms == "auto" else float(a.network_delay_ms) / 1e3
    table = step_cost_table(cost, steps)
    print(f"live steps {len(steps)}, decode counts rebuilt wrong in {bad}")
    print(format_cost_table(table))
    doc = {"step_cost": table, "rebuild_mismatches": bad,
           "dispatch_delay_ms": {"median": 1e3 * delay_s, "num_requests": num_idle}}
    if not a.no_schedule:
        lead = None if a.async_plan_lead_ms is None else a.async_plan_lead_ms / 1e3
        oracle = []

        def wrap(cost, ids):
            oracle.append(LiveTimedCost(cost, ids, rows))
            return oracle[-1]

        cap = session_prefill_cap(validate, a.prefill_cap)
        print(f"prefill cap while decoding: {'off' if cap is None else cap}")
        res = resimulate(validate, arrivals, a.profile, False, a.delivery_ms / 1e3, lead,
                         a.hide_launch, power_cap, a.prefill_launch_deadline, record_steps=True,
                         wrap_cost=wrap if a.live_times else None,
                         network_delay_s=net_s, prefill_cap=cap,
                         delivery_per_stream_s=a.delivery_per_stream_ms / 1e3)
        res["model_terms"]["live_step_times"] = bool(oracle)
        if oracle:
            print(f"live step times fed back: {oracle[0].num_matched} steps matched a live one, "
                  f"{oracle[0].num_model} charged by the model")
        print(format_table(res))
        sched = schedule_report(res, validate, arrivals, batches, rows, lead or 0.0, a.prefill_launch_deadline,
                                net_s)
        why = Counter()
        for ld in sched:
            print(f"{ld['load_label']}: same prefill chunks {100 * ld['same_prefill_step_share']:.1f}%")
            for r in ld["runs"]:
                d = r["first_divergence"]
                if d is None:
                    print(f"   seed {r['seed']}: identical")
                    continue
                why[d["cause"]] += 1
                if d.get("one_side_only"):
                    print(f"   seed {r['seed']}: first parts at prefill step {d['index']}: "
                          f"{d['request'][-6:]} on one side only")
                    continue
                drift = "-" if d["drift_ms"] is None else f"{d['drift_ms']:+.1f}"
                other = d["arrival_between_plans"]
                print(f"   seed {r['seed']}: first parts at prefill step {d['index']}: {d['request'][-6:]} "
                      f"later on the {d['later_side']} side; plans after its flush: live "
                      f"{d['live_plan_ms_after_flush']:+.2f} ms, sim {d['sim_plan_ms_after_flush']:+.2f} ms "
                      f"(missed plan {d['missed_plan_ms_after_flush']:+.2f}); drift before {drift} ms; "
                      f"{d['cause']}" + (f" ({other[-6:]} between the plans, "
                                         f"{d['plans_ms_apart']:.1f} ms apart)" if other else "")
                      + f"; decodes live/sim {d['decodes'][0]}/{d['decodes'][1]}")
        print("first divergences by the request's own arrival (timing) / another's arrival between "
              "the two plans (arrival) / the decode count (decodes) / a rule: "
              f"{why['timing']} / {why['arrival']} / {why['decodes']} / {why['rule']}")
        doc |= {"resim": {k: v for k, v in res.items() if k != "steps"}, "schedule": sched}
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(doc, indent=2, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
