"""Issue 35, session 18 (H35G): which live steps with prefill lie outside the profile's measured hull,
their share of the busy time, and the model's time at them against live.

"Outside the hull" is the cost model's own test: `ProfileCost` interpolates the fit's residuals of
the steps with prefill piecewise linearly inside the convex hull of the measured prefill points, in
its residual space (d, p, ctx[, Σp_i² when the profile packs][, Σp_i·s_i when it has cached-prefix
points], each scaled by its span), and takes the nearest point's residual outside it (the regression
extrapolating). A live step is outside when that space's Delaunay triangulation has no simplex
holding it. Reasons (a step can have several):
  d>dmax      more decodes than the largest decode batch of any prefill point (64 in these
              profiles; today's grid measures prefill beside 128)
  packed      more than 1,024 prefill tokens beside decodes (the budget-filling packed steps: the
              profile's p > 1,024 points all have d 0, since d + p must fit the token budget)
  k>4         more prompts than the grid packs
  prefix+k    a cached-prefix chunk among several (the grid's prefix points are single chunks)
  prefix1     one cached-prefix chunk beside 1..d_max decodes (the grid measures prefix chunks at
              d 0 and d_max only, at the first context: beside d decodes of a longer context the
              step sits just past that face of the hull)
  other       none of these (a corner of the hull: context, Σp_i² or Σp_i·s_i)

The model is built as `validate_replay` builds it in the form each part is scored in (the part's
profile, the validate's recorded terms; the 33B FP8 s17 with `--cap-by-power`) and charged at each
live step's composition with the power cap's busy shares weighted as the event loop weighs them
(`fidelity_cost_s16/step_table.shares`, each prefill span by `cap_weight`: 1 without cap_by_power)
and the idle launch.

    python hull.py            # both parts -> hull.txt, hull_keys_<part>.json.gz (the steps' chunk keys)
"""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import numpy as np
from scipy.spatial import Delaunay

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from bench.simulator.fidelity_steps import live_steps, read_steps
from bench.simulator.session_records import run_arrivals
from scheduler.decisions import read_log
from sims.profile_cost import ProfileCost

R = HERE.parent
PARTS = {"6.7b-fp8_s16": R / "fidelity_grid_h200_s16" / "6.7b-fp8",
         "33b-fp8_s17": R / "fidelity_grid_h200_s17" / "33b-fp8"}
CAP_BY_POWER = {"6.7b-fp8_s16": False, "33b-fp8_s17": True}  # each part's scored form (the brief)
REASONS = ("d>dmax", "packed", "k>4", "prefix+k", "prefix1", "other")


def part_files(part: Path) -> dict:
    tag = part.name
    return {k: part / f"{k}_{tag}.{ext}" for k, ext in
            (("validate", "json"), ("decisions", "jsonl.gz"), ("steps", "jsonl.gz"), ("profile", "json"))}


class Hull:
    """The cost model's prefill residual space and its triangulation (as `_residual_interpolator`)."""

    def __init__(self, cost: ProfileCost):
        d, p, c = cost.points[:, 0], cost.points[:, 1], cost.points[:, 2]
        k, s = cost.num_prefill_seqs, cost.prefill_context_len
        q = np.where(k > 0, p * p / np.maximum(k, 1.0), 0.0)
        cols = cost._cols
        space = np.stack([d, p, c] + ([q] if cols[0] else []) + ([p * s] if cols[1] else []), axis=-1)
        m = p > 0
        self.cols, self.quantum = cols, cost.ctx_quantum
        space = space[m]
        span = space.max(axis=0) - space.min(axis=0)
        self.dims = np.flatnonzero(span > 0)
        self.span = span
        self.tri = Delaunay(space[:, self.dims] / span[self.dims])
        self.d_max = float(d[m].max())
        self.k_max = float(k[m].max())

    def query(self, step: dict) -> np.ndarray:
        n = np.array([c[0] for c in step["chunks"]], dtype=np.float64)
        st = np.array([c[1] for c in step["chunks"]], dtype=np.float64)
        ctx = step["ctx"] + int(n.sum() + st.sum())
        ctx = ctx // self.quantum * self.quantum  # step_time's memo key
        v = [step["d"], step["p"], ctx] + ([float((n * n).sum())] if self.cols[0] else []) \
            + ([float((n * st).sum())] if self.cols[1] else [])
        return np.array(v, dtype=np.float64)

    def outside(self, step: dict) -> bool:
        z = self.query(step)[self.dims] / self.span[self.dims]
        return bool(self.tri.find_simplex(z[None, :])[0] < 0)

    def reasons(self, step: dict) -> list[str]:
        out = []
        if step["d"] > self.d_max:
            out.append("d>dmax")
        if step["d"] > 0 and step["p"] > 1024:
            out.append("packed")
        if len(step["chunks"]) > self.k_max:
            out.append("k>4")
        if len(step["chunks"]) > 1 and any(st for _, st in step["chunks"]):
            out.append("prefix+k")
        if (len(step["chunks"]) == 1 and step["chunks"][0][1] and 0 < step["d"] <= self.d_max):
            out.append("prefix1")
        return out or ["other"]


def model_ms(cost: ProfileCost, steps: list[dict]) -> dict[int, float]:
    """The model's ms at each live step (index -> ms), as `fidelity_cost_s16/step_table` charges it."""
    sys.path.insert(0, str(R / "fidelity_cost_s16"))
    from step_table import shares
    tau, window = cost.power_cap_tau_s, cost.power_cap_window_s
    w = []
    for s in steps:
        ctx = s["ctx"] + sum(n + st for n, st in s["chunks"])
        w.append(cost.cap_weight(s["d"], s["p"], ctx, s["chunks"] or None) if s["p"] else 0.0)
    out = {}
    for k, s in enumerate(steps):
        if not s["d"] and not s["p"]:
            continue
        chunks = s["chunks"] or None
        ctx = s["ctx"] + sum(n + st for n, st in s["chunks"])
        t = cost.step_time(s["d"], s["p"], ctx, chunks)
        if window is not None and (s["p"] or cost.caps_by_compute):
            f, g = shares(steps, k, w, tau, window)
            t *= (cost.prefill_slowdown(f, g, cost.compute_share(s["d"], s["p"], ctx, chunks))
                  if cost.caps_by_compute else cost.prefill_slowdown(f, g))
        if s["idle_before"] and cost.hides_launch:
            t += cost.launch_time(s["d"], s["p"])
        out[k] = 1e3 * t
    return out


def build(part: Path, cap_by_power: bool = False, profile: Path | None = None):
    """(the model, the step log's rows, the live steps, rebuild mismatches) of a part; `profile`:
    another profile than the part's own (a what-if)."""
    f = part_files(part)
    val = json.loads(f["validate"].read_text())
    terms = dict(val["profile"]["model_terms"])
    if cap_by_power and terms.get("power_cap"):  # as validate_replay --cap-by-power
        terms["cap_by_power"] = True
    cost = ProfileCost.from_json(profile or f["profile"], **terms)
    arr, batches = read_log(f["decisions"])
    rows = read_steps(f["steps"])
    steps, bad = live_steps(rows, {a.request_id: a.max_tokens for a in arr})
    label = {}
    for (_si, li), (ars, _bs) in run_arrivals(val, arr, batches).items():
        for a in ars:
            label[a.request_id] = val["loads"][li]["load_label"]
    cur = "warm-up"
    for row, s in zip(rows, steps, strict=True):
        if row["prefill"]:
            cur = label.get(str(row["prefill"][0][0]), "warm-up")
        s["load"] = cur
    return cost, rows, steps, bad


def key_of(row: dict) -> list:
    """The step's chunks as `LiveTimedCost` keys them: (request, tokens, start) each."""
    return sorted([str(r), int(n), int(st)] for r, n, st in row["prefill"])


def main() -> int:
    for name, part in PARTS.items():
        cost, rows, steps, bad = build(part, CAP_BY_POWER[name])
        hull = Hull(cost)
        model = model_ms(cost, steps)
        busy = sum(s["ms"] for s in steps)
        print(f"== {name} (cap_by_power {CAP_BY_POWER[name]}): {len(steps)} live steps ({bad} rebuild mismatches), busy {busy / 1e3:.2f} s; "
              f"prefill residual space dims {[('d', 'p', 'ctx', 'sum p_i^2', 'sum p_i s_i')[i] for i in hull.dims]}, "
              f"largest decode batch of a prefill point {hull.d_max:.0f}, k up to {hull.k_max:.0f}")
        groups: dict[tuple, list[int]] = {}
        keys = {"outside": [], "inside": [], **{r: [] for r in REASONS}}
        for i, s in enumerate(steps):
            if not s["p"]:
                continue
            out = hull.outside(s)
            rs = hull.reasons(s) if out else ["inside"]
            for r in rs:
                groups.setdefault(("all", r), []).append(i)
                groups.setdefault((s["load"], r), []).append(i)
            groups.setdefault(("all", "with prefill"), []).append(i)
            groups.setdefault((s["load"], "with prefill"), []).append(i)
            if out:
                groups.setdefault(("all", "outside (any)"), []).append(i)
                groups.setdefault((s["load"], "outside (any)"), []).append(i)
                keys["outside"].append(key_of(rows[i]))
            for r in rs:
                keys[r].append(key_of(rows[i]))
        busy_load = {}
        for s in steps:
            busy_load[s["load"]] = busy_load.get(s["load"], 0.0) + s["ms"]
        print(f"  {'load':8s} {'kind':14s} {'n':>6s} {'live s':>7s} {'busy %':>7s} {'model/live':>10s} "
              f"{'model-live s':>12s} {'p med':>6s} {'d med':>6s} {'k med':>6s}")
        for ld in ("all", "0.5x", "0.8x", "0.95x", "1.2x"):
            for kind in ("with prefill", "inside", "outside (any)") + REASONS:
                ix = groups.get((ld, kind))
                if not ix:
                    continue
                lv = sum(steps[i]["ms"] for i in ix)
                md = sum(model[i] for i in ix)
                tot = busy if ld == "all" else busy_load[ld]
                print(f"  {ld:8s} {kind:14s} {len(ix):6d} {lv / 1e3:7.2f} {100 * lv / tot:7.2f} {md / lv:10.4f} "
                      f"{(md - lv) / 1e3:+12.3f} {np.median([steps[i]['p'] for i in ix]):6.0f} "
                      f"{np.median([steps[i]['d'] for i in ix]):6.0f} "
                      f"{np.median([len(steps[i]['chunks']) for i in ix]):6.0f}")
        with gzip.open(HERE / f"hull_keys_{name}.json.gz", "wt") as fh:
            fh.write(json.dumps(keys) + "\n")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
