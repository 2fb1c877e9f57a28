"""Issue 35, session 41: a part's busy steps with prefill, per run, live over the simulator's default charge
(`fidelity_steps.model_step_ms`: the power cap from the steps before each, launch hidden), split by the SM clock
nvidia-smi read nearest the step (within 60 ms of its middle; FAST MHz and over: the clock the paused profile ran).

Why: on the H100 6.7B bf16 (session 40's five seeds) the steps with prefill run 1.000 / 0.992 / 0.991 of the default
model at 0.5 / 0.8 / 0.95x, and inside one decode count their live / paused level rises with load by ~1 point
(`../pairs_s40/mixed_by_load_d.py`): the simulator's TTFT P50 at 0.95x is -5.3 % over 13 runs. If the slow-clock
share rises with load while live / model at either clock is flat, the missing charge is the clock (the cap's size);
if live / model falls with load at one clock, it is not the clock.

    python bench/results/pairs_s41/prefill_by_clock.py PART_DIR [FAST_MHZ]
"""
import bisect
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench/results/fidelity_h100fp8_s29"))
from live_part import load_part
from prefill_bins import load  # live_part put its folder on the path

from bench.simulator import fidelity_steps as fs
from bench.simulator.h200_clocks import read_smi
from sims.profile_cost import ProfileCost

GAP_S = 1.0


def main(argv: list[str]) -> None:
    part = Path(argv[0])
    fast_mhz = float(argv[1]) if len(argv) > 1 else 1950.0
    rows, steps, cost = load_part(part)
    _s, _b, _c, terms = load(part)
    # the model with no power cap: the paused profile, what the cap's charge is measured against
    paused = ProfileCost.from_json(str(part / f"profile_{part.name}.json"),
                                   **{k: v for k, v in terms.items() if k not in ("power_cap", "cap_by_power")})
    bare = {k: t for k, t, _f in fs.model_step_ms(paused, steps)}
    times, smi = read_smi(str(part / f"smi_{part.name}.csv.gz"))
    times = np.array(times)
    sim = {k: t for k, t, _f in fs.model_step_ms(cost, steps)}
    print(f"# {part}: busy steps with prefill, live / default model, by the SM clock nearest the step (fast >= {fast_mhz:.0f})")
    print(f"{'run':16s} {'n':>5s} {'all':>7s} {'slow %':>7s} {'SM p50':>7s} {'fast':>13s} {'slow':>13s} {'power W':>8s} {'model/paused':>12s} {'live/paused':>11s}")
    for label, idx in fs.labelled_runs(part, steps, GAP_S):
        acc = {"fast": [], "slow": []}
        allv, clocks, power = [], [], []
        for i in idx:
            s, r = steps[i], rows[i]
            if not s["p"] or s.get("idle_before") or i not in sim or "t" not in r:
                continue
            allv.append((s["ms"], sim[i], bare.get(i, np.nan)))
            mid = r["t"] + r["ms"] / 2e3
            j = int(np.clip(bisect.bisect_left(times, mid), 1, len(times) - 1))
            j = j if abs(times[j] - mid) < abs(times[j - 1] - mid) else j - 1
            if abs(times[j] - mid) > 0.06 or smi[j]["clocks.sm"] is None:
                continue
            clocks.append(smi[j]["clocks.sm"])
            power.append(smi[j].get("power.draw") or np.nan)
            acc["fast" if smi[j]["clocks.sm"] >= fast_mhz else "slow"].append((s["ms"], sim[i]))
        if not allv:
            continue
        a = np.array(allv)
        cells = []
        for f in ("fast", "slow"):
            v = np.array(acc[f])
            cells.append(f"{v[:, 0].sum() / v[:, 1].sum():.4f} ({len(v):3d})" if len(v) else " " * 13)
        n_clk = len(acc["fast"]) + len(acc["slow"])
        print(f"{label:16s} {len(a):5d} {a[:, 0].sum() / a[:, 1].sum():7.4f} "
              f"{100 * len(acc['slow']) / max(1, n_clk):7.1f} {np.median(clocks) if clocks else np.nan:7.0f} "
              f"{cells[0]} {cells[1]} {np.nanmedian(power) if power else np.nan:8.1f} "
              f"{a[:, 1].sum() / a[:, 2].sum():12.4f} {a[:, 0].sum() / a[:, 2].sum():11.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
