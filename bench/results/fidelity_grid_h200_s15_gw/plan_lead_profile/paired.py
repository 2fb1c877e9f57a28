"""Per-seed paired difference of the simulated TTFT P50 error, --plan-lead profile-kinds minus
--plan-lead live (and minus the default single lead, H35G's replay_6.7b_<steps>_on.json), in points;
mean ± 95% t half-width over the 5 seeds.    python paired.py   (from this folder)"""
import json
from pathlib import Path

import numpy as np
from scipy import stats


def load(path):
    d = json.loads(Path(path).read_text())
    return {ld["load_label"]: {r["seed"]: r["compare_replay_path"]["ttft_p50"]["rel_err"] for r in ld["runs"]}
            for ld in d["loads"]}


for steps in ("live", "asrun"):
    k = load(f"replay_6.7b_{steps}_profile-kinds.json")
    for other, path in (("live lead", f"replay_6.7b_{steps}_live.json"),
                        ("default lead", f"../replay_6.7b_{steps}_on.json")):
        o = load(path)
        cells = []
        for lab, by_seed in k.items():
            d = 100 * np.array([by_seed[s] - o[lab][s] for s in sorted(by_seed)])
            hw = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
            cells.append(f"{lab} {d.mean():+.1f} ± {hw:.1f}")
        print(f"{steps:>5} steps, profile-kinds minus {other}: " + ", ".join(cells))
