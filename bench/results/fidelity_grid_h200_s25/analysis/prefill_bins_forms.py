"""Issue 35, session 25: a part's live steps with prefill, binned by prefill tokens x decodes, each
charged by the cost model at the live step's own history (`fidelity_steps.model_step_ms`: the busy
shares from the live steps before it), in one of three forms: nocap (the default before session 25),
cap (--cap-by-power: the default since) or nospells (the cap without the decode-spells term).
The binning is ../../fidelity_grid_h200_s20/analysis/prefill_bins.py's. Run from the repo root:

    python bench/results/fidelity_grid_h200_s25/analysis/prefill_bins_forms.py PART_DIR nocap|cap|nospells
"""
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench/results/fidelity_grid_h200_s20/analysis"))
sys.path.insert(0, str(ROOT / "bench/results/fidelity_spread_s19"))
import prefill_bins

from sims.profile_cost import ProfileCost


def builder(form: str):
    def build(part: Path, spread):
        tag = part.name
        terms = dict(json.loads((part / f"validate_{tag}.json").read_text())["profile"]["model_terms"])
        terms.pop("cap_by_power", None)
        if form in ("cap", "nospells"):
            terms["cap_by_power"] = True
        if form == "nospells":
            terms["decode_spells"] = False
        return ProfileCost.from_json(part / f"profile_{tag}.json", **terms, decode_spread=spread), terms
    return build


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[2] not in ("nocap", "cap", "nospells"):
        sys.exit(__doc__)
    prefill_bins.build = builder(sys.argv[2])
    prefill_bins.main([sys.argv[1]])
