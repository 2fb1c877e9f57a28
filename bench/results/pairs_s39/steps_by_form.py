"""Issue 35, session 39: a part's live steps against the cost model in six forms of the power cap, per load
(decode-only steps and steps with prefill: model total / live total over the load's runs).

Forms: default; onset_fast (`cap_onset="fast"`); anch_stream (`cap_anchors="stream"`); stream_fast (both);
nospell (`decode_spells=False`); nocap_kind (no cap by step kind: `--cap-by-power off`). Runs are cut at idle gaps
over 1 s and named by load in the validate log's order.

    python bench/results/pairs_s39/steps_by_form.py PART_DIR [PART_DIR ...]
"""
import sys
from pathlib import Path

from bench.simulator import fidelity_steps as fs
from bench.simulator.validate import async_plan_lead, model_terms
from sims.profile_cost import ProfileCost
from sims.profile_terms import has_sustained_mixed


def forms_of(doc: dict) -> dict[str, dict]:
    base = {k: v for k, v in model_terms(doc, async_plan_lead(doc, "cuda")).items() if k != "cap_by_power"}
    nocap = dict(base)
    if base.get("power_cap") and has_sustained_mixed(doc):
        base["cap_by_power"] = True
    return {"default": base, "onset_fast": {**base, "cap_onset": "fast"},
            "anch_stream": {**base, "cap_anchors": "stream"},
            "stream_fast": {**base, "cap_anchors": "stream", "cap_onset": "fast"},
            "nospell": {**base, "decode_spells": False}, "nocap_kind": nocap}


def main(argv: list[str]) -> None:
    for arg in argv:
        part = Path(arg)
        prof, doc, steps = fs.part_live_steps(part)
        models = {name: {i: t for i, t, _f in fs.model_step_ms(ProfileCost.from_json(prof, **terms), steps)}
                  for name, terms in forms_of(doc).items()}
        runs = fs.runs_at_gaps(steps, 1.0)
        loads = [load for load, _seed in fs.validate_run_labels(part)]
        totals: dict[tuple[str, str], dict[str, list[float]]] = {}
        for load, idx in zip(loads, runs):
            for kind in ("decode", "prefill"):
                sel = [i for i in idx if i in models["default"] and bool(steps[i]["p"]) == (kind == "prefill")]
                acc = totals.setdefault((kind, load), {n: [0.0, 0.0] for n in models})
                for n in models:
                    acc[n][0] += sum(models[n][i] for i in sel)
                    acc[n][1] += sum(steps[i]["ms"] for i in sel)
        print(f"== {part}: model / live; forms " + "  ".join(models))
        for (kind, load), acc in sorted(totals.items()):
            print(f"  {kind:7s} {load:5s} " + "  ".join(f"{acc[n][0] / acc[n][1]:.4f}" for n in models))


if __name__ == "__main__":
    main(sys.argv[1:])
