"""Issue 35, session 27: a profile's pause-check `mixed_pattern_<n>` runs (the sustained_mixed step
with n decode steps between, back to back: their measured mixed / paused ratio) against what the
cost model charges them (`fidelity_grid_h200_s20/analysis/pattern_check.py`'s layout: model / the
model's own paused time) in three forms: spells (the default), nospells (`--decode-spells off`) and
fast (`--cap-onset fast`). Also the pattern's mixed step back to back against the model's paused
device time (the profile's own `device_ms_median` fit). Run from the repo root:

    python bench/results/fidelity_onset_s27/pattern_forms.py PROFILE.json [...]
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench/results/fidelity_grid_h200_s20/analysis"))
import pattern_check

from sims.profile_cost import ProfileCost


def main(paths: list[str]) -> None:
    for path in paths:
        doc = json.loads(Path(path).read_text())
        runs = [r for r in doc["pause_check"]["runs"] if r["run"].startswith("mixed_pattern_")]
        terms = {"hide_launch": True, "power_cap": True, "cap_by_power": True}
        costs = {"spells": ProfileCost.from_json(path, **terms),
                 "nospells": ProfileCost.from_json(path, **terms, decode_spells=False),
                 "fast": ProfileCost.from_json(path, **terms, cap_onset="fast")}
        on = costs["fast"].cap_onset
        print(f"== {Path(path).name}: fast onset {({k: round(v, 4) for k, v in on.items()} if on else None)}")
        for run in runs:
            meas = run["step_ms_median"] / run["paused_ms_median"]
            d, p, c = run["num_decode_seqs"], run["num_prefill_tokens"], run["decode_context_len"]
            dev = 1e3 * costs["spells"].step_time(d, p, d * c + p, [(p, 0)])
            print(f"   {run['run']}: measured {meas:.3f} x paused; model " + ", ".join(
                f"{k} {pattern_check.model_ratio(cst, run, True)[0]:.3f}" for k, cst in costs.items())
                + f"; back to back {run['step_ms_median']:.2f} ms (wall, launch included) against the "
                  f"paused device-time model {dev:.2f}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
