"""Issue 35, session 30: `decode_exact.py`'s live / model by d bin, split by the SM clock nvidia-smi read
nearest the step (every 100 ms; within 60 ms of the step's middle): steps at >= FAST MHz (uncapped, as the
paused profile ran) apart from the slower ones. The raw model (`cost.step_time`, device time) charges no power
cap; the simulator charges decode-only steps for it (`sims.profile_cost`, `cap_by_compute`), so only the uncapped
steps say what the profile's pages (zeroed or filled) leave out. "sim" is the simulator's own charge at the step
(`fidelity_steps.model_step_ms`: the cap from the steps before it, launch hidden) against the step's wall time:
how much of the capped steps' excess the model's cap term already charges. Run from the repo root:
    python bench/results/fidelity_h100fp8_s29/decode_exact_clock.py PART_DIR [FAST_MHZ] [LIM]"""
import bisect
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from live_part import load_part

from bench.simulator import fidelity_steps as fs
from bench.simulator.h200_clocks import read_smi

part = Path(sys.argv[1])
FAST = float(sys.argv[2]) if len(sys.argv) > 2 else 1950.0
LIM = float(sys.argv[3]) if len(sys.argv) > 3 else 1.15
BINS = ((1, 8), (9, 16), (17, 32), (33, 48), (49, 64), (65, 128))
rows, steps, cost = load_part(part)
times, smi = read_smi(str(part / f"smi_{part.name}.csv.gz"))
times = np.array(times)
sim = {k: t for k, t, _f in fs.model_step_ms(cost, steps)}
out = {}
for i, s in enumerate(steps):
    if s["p"] or s["idle_before"] or max(s["ctxs"]) > LIM * s["ctx"] / s["d"]:
        continue
    r = rows[i]
    dv = r.get("device_ms")
    if dv is None or "t" not in r:
        continue
    mid = r["t"] + r["ms"] / 2e3
    j = int(np.clip(bisect.bisect_left(times, mid), 1, len(times) - 1))
    j = j if abs(times[j] - mid) < abs(times[j - 1] - mid) else j - 1
    if abs(times[j] - mid) > 0.06 or smi[j]["clocks.sm"] is None:
        continue
    b = next((f"{lo}-{hi}" for lo, hi in BINS if lo <= s["d"] <= hi), None)
    if b is None:
        continue
    fast = "fast" if smi[j]["clocks.sm"] >= FAST else "slow"
    out.setdefault((b, fast), []).append((dv, 1e3 * cost.step_time(s["d"], 0, s["ctx"]), smi[j]["clocks.sm"],
                                          s["ms"], sim.get(i, np.nan)))
print(f"# {part}: decode-only steps (not after idle, max / mean context <= {LIM}), SM clock nearest the step")
for lo, hi in BINS:
    b = f"{lo}-{hi}"
    cells = []
    for fast in ("fast", "slow"):
        a = np.array(out.get((b, fast), []))
        cells.append(f"{fast} n {len(a):4d} " + (f"live/model {a[:, 0].sum() / a[:, 1].sum():.4f} live/sim {a[:, 3].sum() / a[:, 4].sum():.4f} "
                                                   f"SM {np.median(a[:, 2]):5.0f}" if len(a) else " " * 42))
    print(f"d {b:7s}  " + "   ".join(cells))
