"""Issue 35, session 27: a part's live one-chunk mixed steps (129-256 prefill tokens beside 1-32
decodes, not after idle) charged by the cost model at their own live history
(`fidelity_steps.model_step_ms`), model / live of each group's total time, grouped by the decode-only
steps between the last step with prefill and this one, in three forms: "spells" (the default: the
power-by-kind weights, one time constant, the decode-spells term), "nospells" (`--decode-spells off`)
and "fast" (`--cap-onset fast`: the limiter's fast onset apart, no decode spell). A model right in
its power terms leaves every group at the same ratio. Run from the repo root:

    python bench/results/fidelity_onset_s27/history_bins.py PART_DIR
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench/results/fidelity_grid_h200_s20/analysis"))
sys.path.insert(0, str(ROOT / "bench/results/fidelity_spread_s19"))
import prefill_bins

from bench.simulator import fidelity_steps
from sims.profile_cost import ProfileCost

FORMS = {"spells": {}, "nospells": {"decode_spells": False}, "fast": {"cap_onset": "fast"}}


def builder(extra: dict):
    def build(part: Path, spread):
        tag = part.name
        terms = dict(json.loads((part / f"validate_{tag}.json").read_text())["profile"]["model_terms"])
        terms["cap_by_power"] = True
        return ProfileCost.from_json(part / f"profile_{tag}.json", **terms, **extra, decode_spread=spread), terms
    return build


def between(steps: list[dict], i: int) -> str:
    n, j = 0, i - 1
    while j >= 0 and not steps[j]["p"]:
        if steps[j]["idle_before"]:
            return "an idle spell since"
        n, j = n + 1, j - 1
    return f"{n} decode steps" if n < 6 else ">= 6 decode steps"


def main(part: Path) -> None:
    groups, ratio = {}, {}
    for form, extra in FORMS.items():
        prefill_bins.build = builder(extra)
        steps, _bad, cost, _terms = prefill_bins.load(part)
        res = {i: t for i, t, _f in fidelity_steps.model_step_ms(cost, steps)}
        sel = [i for i, s in enumerate(steps) if i in res and 129 <= s["p"] <= 256 and 1 <= s["d"] <= 32
               and len(s["chunks"]) == 1 and not s["idle_before"]]
        groups = {}
        for i in sel:
            groups.setdefault(between(steps, i), []).append(i)
        for k, g in groups.items():
            ratio[(k, form)] = sum(res[i] for i in g) / sum(steps[i]["ms"] for i in g)
        if form == "fast":
            onset = cost.cap_onset
    print(f"== {part.name}: one-chunk mixed steps by the decode steps since the last step with prefill; "
          f"fast onset {({k: round(v, 4) for k, v in onset.items()} if onset else None)}")
    print(f"   {'since':22s} {'n':>5s}  " + "  ".join(f"{f:>8s}" for f in FORMS))
    order = sorted(groups, key=lambda k: (k.startswith(">"), k.startswith("an"), k))
    for k in order:
        print(f"   {k:22s} {len(groups[k]):5d}  " + "  ".join(f"{ratio[(k, f)]:8.4f}" for f in FORMS))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
