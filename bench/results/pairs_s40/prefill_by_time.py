"""Issue 35, session 40: a part's steps with prefill, live over the paused profile, by time inside each run.

Why: on the 33B bf16 (H100) the live steps with prefill run 1.05 / 1.07 / 1.08 x the paused profile at
0.5 / 0.8 / 0.95x, ~4 points over the model without decode spells at every load (pairs_s39 section 1). A
level that grows over a run's seconds is the limiter's slow sag (board heat: the same clock draws more power
as the card warms); a level that is flat from the run's first seconds is the busy engine's state, which the
decode-spell or onset terms would have to carry. The table answers which, per run, in BIN_S bins.

    python bench/results/pairs_s40/prefill_by_time.py PART_DIR [BIN_S]
"""
import sys
from pathlib import Path

from bench.simulator import fidelity_steps as fs
from bench.simulator.validate import async_plan_lead, model_terms
from sims.profile_cost import ProfileCost

GAP_S = 1.0  # as pairs_s39/steps_by_run.py: runs are cut at idle gaps over a second


def main(argv: list[str]) -> None:
    part = Path(argv[0])
    bin_s = float(argv[1]) if len(argv) > 1 else 10.0
    tag = part.name
    prof, doc, steps = fs.part_live_steps(part)
    terms = {**model_terms(doc, async_plan_lead(doc, "cuda")), "power_cap": False}
    terms.pop("cap_by_power", None)
    paused = ProfileCost.from_json(prof, **terms)
    model = {i: t for i, t, _f in fs.model_step_ms(paused, steps)}
    runs = fs.runs_at_gaps(steps, GAP_S)
    print(f"== {tag}: live / paused model of the steps with prefill (and decode-only), by {bin_s:g} s of each run")
    for k, idx in enumerate(runs):
        t0 = steps[idx[0]]["start"]
        cells = []
        for b in range(int((steps[idx[-1]]["end"] - t0) // bin_s) + 1):
            sel = [i for i in idx if i in model and b * bin_s <= steps[i]["start"] - t0 < (b + 1) * bin_s]
            pre = [i for i in sel if steps[i]["p"]]
            dec = [i for i in sel if not steps[i]["p"]]
            if len(pre) < 10:
                continue
            rp = sum(steps[i]["ms"] for i in pre) / sum(model[i] for i in pre)
            rd = sum(steps[i]["ms"] for i in dec) / sum(model[i] for i in dec) if dec else float("nan")
            cells.append(f"{rp:.3f}/{rd:.3f}")
        print(f"run {k:2d} ({len(idx):5d} steps): " + "  ".join(cells))


if __name__ == "__main__":
    main(sys.argv[1:])
