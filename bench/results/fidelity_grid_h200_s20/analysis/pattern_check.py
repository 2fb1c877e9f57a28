"""Issue 35, session 20 (for the next calls): a profile's pause-check `mixed_pattern_<n>` runs (the
sustained_mixed step with n decode steps of its decodes between, back to back) against what the cost
model charges that pattern, with and without the decode-spell term (sims.profile_cost, "Decode
spells"). Each pattern is laid out as live steps at its measured times (the second half of the run:
`pattern_t_ms` / `pattern_ms`) and charged by `bench.simulator.fidelity_steps.model_step_ms`; the
mixed steps' model / paused-model ratio is set beside their measured / paused ratio.
Run from the repo root:  python pattern_check.py PROFILE.json
"""
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from bench.simulator import fidelity_steps
from sims.profile_cost import ProfileCost


def pattern_steps(run: dict) -> list[dict]:
    """The run's steps as fidelity_steps' live steps (shapes from the run, times as measured)."""
    d, p, c = run["num_decode_seqs"], run["num_prefill_tokens"], run["decode_context_len"]
    out = []
    for t, ms, k in zip(run["pattern_t_ms"], run["pattern_ms"], run["pattern_kinds"], strict=True):
        mixed = k == "m"
        out.append({"d": d, "p": p if mixed else 0, "ctx": d * c, "ctxs": [c] * d,
                    "chunks": [(p, 0)] if mixed else [], "start": t / 1e3, "end": (t + ms) / 1e3,
                    "idle_before": False, "ms": ms})
    return out


def model_ratio(cost: ProfileCost, run: dict, spells: bool) -> tuple[float, float]:
    """(mixed, decode): the model's median over the run's second half, over the model's own time
    for the step paused (no cap)."""
    steps = pattern_steps(run)
    fn = fidelity_steps.model_step_ms
    if not spells:  # the model before the term: no kind weights in the scorer's f
        # (since session 25 the scorer reads `counts_decode_spells`, the switch ProfileCost(decode_spells=)
        # sets; both are patched so that this reads the same at any HEAD)
        saved = type(cost).weights_cap_by_power, getattr(type(cost), "counts_decode_spells", None)
        type(cost).weights_cap_by_power = property(lambda self: False)
        type(cost).counts_decode_spells = property(lambda self: False)
    try:
        rows = {k: ms for k, ms, _f in fn(cost, steps)}
    finally:
        if not spells:
            type(cost).weights_cap_by_power = saved[0]
            if saved[1] is None:
                del type(cost).counts_decode_spells
            else:
                type(cost).counts_decode_spells = saved[1]
    half = steps[-1]["start"] / 2
    d, p, c = run["num_decode_seqs"], run["num_prefill_tokens"], run["decode_context_len"]
    base_m = 1e3 * cost.step_time(d, p, d * c + p, [(p, 0)])
    base_d = 1e3 * cost.step_time(d, 0, d * c)
    m = [rows[k] for k, s in enumerate(steps) if s["p"] and s["start"] >= half]
    dd = [rows[k] for k, s in enumerate(steps) if not s["p"] and s["start"] >= half]
    return float(np.median(m)) / base_m, float(np.median(dd)) / base_d


def main(path: str) -> None:
    doc = json.loads(Path(path).read_text())
    runs = [r for r in (doc.get("pause_check") or {}).get("runs", []) if r["run"].startswith("mixed_pattern_")]
    if not runs:
        print(f"{path}: no mixed_pattern runs (profiles since session 20 have them)")
        return
    cost = ProfileCost.from_json(path, hide_launch=True, power_cap=True, cap_by_power=True)
    sus = next((r for r in doc["pause_check"]["runs"] if r["run"] == "sustained_mixed"), None)
    if sus is not None:
        print(f"sustained_mixed: {sus['step_ms_median'] / sus['paused_ms_median']:.3f} x paused")
    print(f"{'run':18s} {'measured mixed':>15s} {'model, spells':>14s} {'model, before':>14s} "
          f"{'measured decode':>16s} {'model decode':>13s}")
    for run in runs:
        meas_m = run["step_ms_median"] / run["paused_ms_median"]
        meas_d = run["decode_ms_median"] / run["decode_alone_ms_median"]
        with_m, with_d = model_ratio(cost, run, True)
        before_m, _ = model_ratio(cost, run, False)
        print(f"{run['run']:18s} {meas_m:15.3f} {with_m:14.3f} {before_m:14.3f} {meas_d:16.3f} {with_d:13.3f}")


if __name__ == "__main__":
    main(sys.argv[1])
