"""Issue 35, session 39: a part's steps with prefill per run (load, seed), live and in three forms of the power
cap, each over the paused profile (the model with no power cap: what the profile's points measured).

Forms: default (the cap by step kind with decode spells, `validate_replay`'s default), nospell (the same without
decode spells: `decode_spells=False`, sims.profile_cost "Decode spells"), nocap (`--cap-by-power off`: the cap with
every step with prefill at weight 1, no spells). Runs are cut at idle gaps over GAP_S, named in the validate log's
order. Also the busy share f the default form reads before each step (mean).

Why: the 33B cells on the current profiler read TTFT P50 +1 to +3 % at 0.5x and -2 % at 0.8-0.95x in the default
form; this says how the cap's charge on the steps that TTFT waits for moves with load, against live.

    python bench/results/pairs_s39/steps_by_run.py PART_DIR
"""
import sys
from pathlib import Path
from statistics import mean

from bench.simulator import fidelity_steps as fs
from bench.simulator.validate import async_plan_lead, model_terms
from sims.profile_cost import ProfileCost
from sims.profile_terms import has_sustained_mixed

GAP_S = 1.0  # the validate's runs are 2-4 s apart (scoring, the next run's start); inside a run the engine idles < 1 s


def main(argv: list[str]) -> None:
    part = Path(argv[0])
    tag = part.name
    prof, doc, steps = fs.part_live_steps(part)
    base = {k: v for k, v in model_terms(doc, async_plan_lead(doc, "cuda")).items() if k != "cap_by_power"}
    capped = base.get("power_cap") and has_sustained_mixed(doc)
    forms = {"default": {**base, **({"cap_by_power": True} if capped else {})},
             "nospell": {**base, **({"cap_by_power": True, "decode_spells": False} if capped else {})},
             "nocap": base,
             "paused": {**base, "power_cap": False}}
    models = {}
    for name, terms in forms.items():
        cost = ProfileCost.from_json(prof, **terms)
        models[name] = {i: (t, f) for i, t, f in fs.model_step_ms(cost, steps)}
    labels = [f"{load} seed {seed}" for load, seed in fs.validate_run_labels(part)]
    runs = fs.runs_at_gaps(steps, GAP_S)
    print(f"== {tag}: {len(runs)} runs cut at {GAP_S:g} s gaps, {len(labels)} in the log; steps with prefill, "
          f"totals over the paused profile's")
    print(f"{'run':16s} {'n':>5s} {'d mean':>6s} {'live':>7s} {'default':>7s} {'nospell':>7s} {'nocap':>7s} {'f':>6s}")
    for k, idx in enumerate(runs):
        label = labels[k] if len(runs) == len(labels) else f"run {k}"
        sel = [i for i in idx if steps[i]["p"] and i in models["paused"]]
        if not sel:
            continue
        paused = sum(models["paused"][i][0] for i in sel)
        ratio = {n: sum(models[n][i][0] for i in sel) / paused for n in ("default", "nospell", "nocap")}
        print(f"{label:16s} {len(sel):5d} {mean(steps[i]['d'] for i in sel):6.1f} "
              f"{sum(steps[i]['ms'] for i in sel) / paused:7.4f} {ratio['default']:7.4f} {ratio['nospell']:7.4f} "
              f"{ratio['nocap']:7.4f} {mean(models['default'][i][1] for i in sel):6.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
