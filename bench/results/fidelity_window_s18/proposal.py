"""Issue 35, session 18 (H35W): the pause-check runs proposed to identify the power cap's window form
(README, "Proposal"), their step counts and device seconds from each committed H200 profile's own
step times: the pause check's 512-token step (paused median), the capped engine's mixed step
(d 32 beside a 256-token chunk: the "sustained_mixed" run's paused median where the profile has it,
else the grid point d 32 / p 256 nearest context 32 x 640) and the d 32 decode-only step.

Each proposed run is the existing "sustained" run's protocol (0.5 s idle, then traced: every step
timed, SM clock / power every 8 steps), IDLE_S + RUN_S of wall time, so its device seconds do not depend
on the step time; the step time sets how many steps each trace holds.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

R = Path(__file__).resolve().parent.parent
PROFILES = {
    "33b-s11": R / "fidelity_grid_h200_s11/33b/profile_33b.json",
    "33b-s13": R / "fidelity_grid_h200_s13/33b-seeds/profile_33b-seeds.json",
    "6.7b-s16": R / "fidelity_grid_h200_s16/6.7b/profile_6.7b.json",
    "6.7b-fp8-s16": R / "fidelity_grid_h200_s16/6.7b-fp8/profile_6.7b-fp8.json",
    "33b-fp8-s16": R / "fidelity_grid_h200_s16/33b-fp8/profile_33b-fp8.json",
    "33b-fp8-s17": R / "fidelity_grid_h200_s17/33b-fp8/profile_33b-fp8.json",
}
IDLE_S, RUN_S = 0.5, 2.0
DUTIES = (0.75, 0.5, 0.3)     # prefill-only and mixed step, idle pauses between steps
FILL = (1, 3)                 # the mixed step then n decode-only steps, back to back (never idle)


def nearest(points, d, p, ctx):
    """The step time of the grid point with d decodes and the measured p nearest p (the 33B bf16 grids of
    s11 / s13 measured no 256-token chunk: their 512), context nearest ctx."""
    c = [x for x in points if x["num_decode_seqs"] == d and (x["num_prefill_tokens"] > 0) == (p > 0)]
    pn = min({x["num_prefill_tokens"] for x in c}, key=lambda q: abs(q - p))
    c = [x for x in c if x["num_prefill_tokens"] == pn]
    return min(c, key=lambda x: abs(x["num_context_tokens"] - ctx))["step_ms_median"]


def main() -> int:
    print(f"runs: prefill-only and mixed step at duty {DUTIES} (pause = step x (1/D - 1)); mixed + n decode-only "
          f"steps, n in {FILL}; each {IDLE_S} s idle + {RUN_S} s traced\n")
    print(f"{'profile':13s} {'check ms':>8s} {'mixed ms':>8s} {'dec32 ms':>8s}  steps per trace: prefill-only @D | "
          f"mixed @D | mixed+n dec (duty)  runs  device s")
    for name, f in PROFILES.items():
        if not f.exists():
            print(f"{name}: no profile at {f}")
            continue
        doc = json.loads(f.read_text())
        runs = {r["run"]: r for r in doc["pause_check"]["runs"]}
        s = (runs["paused"]["step_ms_median"] + runs["paused_again"]["step_ms_median"]) / 2
        mixed = (runs["sustained_mixed"]["paused_ms_median"] if "sustained_mixed" in runs
                 else nearest(doc["points"], 32, 256, 32 * 640))
        dec = nearest(doc["points"], 32, 0, 32 * 640)
        pre = [int(RUN_S * 1e3 * D / s) for D in DUTIES]
        mix = [int(RUN_S * 1e3 * D / mixed) for D in DUTIES]
        fill = [(int(RUN_S * 1e3 / (mixed + n * dec)), mixed / (mixed + n * dec)) for n in FILL]
        n_runs = 2 * len(DUTIES) + len(FILL)
        print(f"{name:13s} {s:8.2f} {mixed:8.2f} {dec:8.2f}  {pre} | {mix} | "
              + " ".join(f"{k} ({dd:.2f})" for k, dd in fill) + f"  {n_runs:4d}  {n_runs * (IDLE_S + RUN_S):6.1f}"
              + ("" if "sustained" in runs and runs["sustained"].get("trace_ms") else
                 "   (+ the existing sustained / sustained_mixed runs: this profile has no trace)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
