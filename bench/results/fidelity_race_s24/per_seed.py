"""Issue 35, session 24: the simulator against each live run of one workload, seed by seed.

Session 21's H100 call (6.7b-mixed-seeds, seeds 3-4) and this session's repeats of its seeds 3 and 4 on
another H100 (same rates to the last digit, same engine code: `git diff 4f9957d 2e30fd5 -- backend
scheduler gateway proto` is empty, the same profile: PROFILE_FROM). Each replay (`validate_replay`'s
default form, replay_*.json here) uses its own call's measured host paths (delivery, dispatch, gateway
loop). Prints, per seed and load, (sim - live) / live for TTFT / TPOT P50 and the prefill steps with the
same chunks, against each call.

Run from this folder:  python per_seed.py > per_seed.txt"""
import json
from pathlib import Path


def rows(path, seed):
    d = json.loads(Path(path).read_text())
    out = {}
    for ld in d["loads"]:
        for r in ld["runs"]:
            if int(r["seed"]) == seed:
                c = r["compare_replay_path"]
                out[f"{float(ld['load_fraction']):.2f}x"] = (100 * c["ttft_p50"]["rel_err"], 100 * c["tpot_p50"]["rel_err"],
                                                 100 * r["steps_path"]["same_prefill_step_share"],
                                                 c["ttft_p50"]["live"])
    return out


print("seed  load   | s21 call: TTFT P50  TPOT P50  same chunks  (live TTFT ms) | this session's repeat: "
      "TTFT P50  TPOT P50  same chunks  (live TTFT ms)")
for seed in (3, 4):
    a = rows("replay_s21_seeds34.json", seed)
    b = rows(f"replay_seed{seed}.json", seed)
    for load in a:
        x, y = a[load], b[load]
        print(f"{seed:>4}  {load:>5}  | {x[0]:+8.1f}% {x[1]:+8.1f}% {x[2]:10.1f}%  ({x[3]:6.2f})      | "
              f"{y[0]:+8.1f}% {y[1]:+8.1f}% {y[2]:10.1f}%  ({y[3]:6.2f})")
