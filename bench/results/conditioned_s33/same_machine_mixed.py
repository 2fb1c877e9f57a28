"""Issue 35, session 33: the same-machine check's mixed steps (one chunk, not after idle) on the card that profiled
them: live over the paused replay, and the paused replay and live over the raw model at the decodes' contexts and at
their whole 64-token tiles (sims.profile_cost, "Whole tiles beside a chunk"), by the chunk's start and d.

    python bench/results/conditioned_s33/same_machine_mixed.py [SAME_MACHINE_DIR]
"""
import collections
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench/results/fidelity_grid_h100_s21/analysis"))
from prefill_bins import load


def main(S: Path) -> None:
    _steps, _bad, cost, _terms = load(S / "6.7b-fp8")
    comps = {s["i"]: s for s in json.loads((S / "compositions.json").read_text())["steps"]}
    rep = json.loads((S / "replay_zeros.json").read_text())
    g = collections.defaultdict(list)
    for r in rep["steps"]:
        s = comps[r["i"]]
        if not s["chunks"] or s["idle_before"] or len(s["chunks"]) != 1 or not s["d"]:
            continue
        c = np.array(s["ctxs"])
        n, st = s["chunks"][0]
        raw = 1e3 * cost.step_time(s["d"], n, int(c.sum()) + n + st, [(n, st)])
        tiles = 1e3 * cost.step_time(s["d"], n, int((np.ceil(c / 64) * 64).sum()) + n + st, [(n, st)])
        key = ("start 0" if st == 0 else "start > 0", "d < 16" if s["d"] < 16 else "d 16-31" if s["d"] < 32 else "d >= 32")
        g[key].append((s["live_device_ms"], r["paused_ms"], raw, tiles))
    print(f"{'chunk':10s} {'d':8s} {'n':>4s} {'live/paused':>11s} {'paused/raw':>10s} {'paused/tiles':>12s} "
          f"{'live/tiles':>10s}")
    for k in sorted(g):
        live, paused, raw, tiles = np.array(g[k]).sum(0)
        print(f"{k[0]:10s} {k[1]:8s} {len(g[k]):4d} {live / paused:11.4f} {paused / raw:10.4f} {paused / tiles:12.4f} "
              f"{live / tiles:10.4f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "h100_same_machine")
