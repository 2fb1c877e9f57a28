"""Issue 35, session 18 (H35G): the budget-filling packed point (`bench.engine.profile.step_shapes`,
`--budget-packed-points on`: on the validate's grid d 64, 4 x 496 tokens) on the committed H200 parts.

1. Its device time: the point's step time by each committed profile's own model (the validate's
   terms), and what measuring it adds as `scripts/fidelity_h200.sh` profiles (`--profile-warmup 1
   --profile-repeats 3`, pause 60 ms): (warmup + repeats) x (pause + wall step) timed, then repeats x
   (pause + 5 ms spin + step) device-timed (`measure_device`).
2. A stand-in (a WHAT-IF, not a measurement): each FP8 part's profile with the point added at the
   model's own time there x the live / model of the part's live packed steps (hull.txt: 6.7B FP8
   1 / 0.9353, 33B FP8 1 / 1.0113), i.e. the point measuring at d 64 the excess live showed at d
   27-90. Written as standin_profile_<part>_d<D>.json; the live packed steps' model / live with it
   (`hull.py`'s bins with that profile) shows how the interpolation carries the one point to them.

    [BUDGET_D=128] python budget_point.py   -> budget_point[_d128].txt, standin_profile_<part>_d<D>.json
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
sys.path.insert(0, str(HERE))

from hull import CAP_BY_POWER, PARTS, Hull, build, model_ms

from sims.profile_cost import ProfileCost

R = HERE.parent
PROFILES = {"6.7b-fp8_s16": R / "fidelity_grid_h200_s16/6.7b-fp8/profile_6.7b-fp8.json",
            "33b-fp8_s17": R / "fidelity_grid_h200_s17/33b-fp8/profile_33b-fp8.json",
            "6.7b_s16": R / "fidelity_grid_h200_s16/6.7b/profile_6.7b.json",
            "33b-seeds_s13": R / "fidelity_grid_h200_s13/33b-seeds/profile_33b-seeds.json"}
LIVE_OVER_MODEL = {"6.7b-fp8_s16": 1 / 0.9353, "33b-fp8_s17": 1 / 1.0113}  # hull.txt, packed, all loads
# the point on the validate's grid (IN 512: the first context 512); BUDGET_D=128: at d 128 instead
# (the largest packed d: a first version; it moved the live packed steps half as far)
D = int(os.environ.get("BUDGET_D", "64"))
P, K, C = (2048 - D) // 4 * 4, 4, 512
WARMUP, REPEATS, PAUSE_MS, SPIN_MS = 1, 3, 60.0, 5.0


def point_ms(prof: Path) -> tuple[float, float, float]:
    """(wall ms, device ms, launch ms) of the point by the profile's model: the wall time from the
    model without hidden launch, the device time from it with (the profile's fit of device times)."""
    ctx = D * C + P
    wall = ProfileCost.from_json(prof).step_time(D, P, ctx, [P // K] * K) * 1e3
    dev = ProfileCost.from_json(prof, hide_launch=True)
    return wall, dev.step_time(D, P, ctx, [P // K] * K) * 1e3, dev.launch_time(D, P) * 1e3


def main() -> int:
    print(f"1. the point ({D} decodes of context 512, 4 x {P // K} tokens) by each committed profile's model,"
          f" and its added device time ((warmup {WARMUP} + repeats {REPEATS}) x (pause {PAUSE_MS:.0f} + wall)"
          f" + {REPEATS} x (pause + {SPIN_MS:.0f} ms spin + device))")
    for name, prof in PROFILES.items():
        wall, dev, launch = point_ms(prof)
        added = ((WARMUP + REPEATS) * (PAUSE_MS + wall) + REPEATS * (PAUSE_MS + SPIN_MS + dev)) / 1e3
        pts = json.loads(prof.read_text())["points"]
        big = next(x for x in pts if x["num_decode_seqs"] == 0 and x["num_prefill_tokens"] == 2048
                   and x.get("num_prefill_seqs") == 4)
        print(f"  {name:14s} wall {wall:7.2f} ms, device {dev:7.2f} ms (launch {launch:.2f}); the (0, 2,048, k 4)"
              f" point measured {big['step_ms']:.2f} ms; added {added:.2f} s a profile")
    print("\n2. stand-in (WHAT-IF): the point added at the model's time x live / model of the live packed"
          " steps; those steps' model / live with it")
    for name, factor in LIVE_OVER_MODEL.items():
        prof = PROFILES[name]
        doc = json.loads(prof.read_text())
        wall, dev, launch = point_ms(prof)
        pt = {"num_decode_seqs": D, "num_prefill_tokens": P, "context_len": C, "num_prefill_seqs": K,
              "prefill_context_len": 0, "num_context_tokens": D * C + P,
              "step_ms": (dev * factor + launch), "step_ms_median": dev * factor + launch, "repeats": REPEATS,
              "launch_ms_median": launch, "device_ms_median": dev * factor,
              "whatif": f"stand-in: the model's time x {factor:.4f} (live / model of the live packed steps)"}
        doc = {**doc, "points": doc["points"] + [pt]}
        out = HERE / f"standin_profile_{name}_d{D}.json"
        out.write_text(json.dumps(doc, indent=1) + "\n")
        own_hull = None
        for label, path in (("own", prof), ("stand-in", out)):
            part = PARTS[name]
            cost, _rows, steps, _bad = build(part, CAP_BY_POWER[name], profile=path)
            hull = Hull(cost)
            own_hull = own_hull or hull
            model = model_ms(cost, steps)
            bins: dict[str, list[int]] = {}
            for i, s in enumerate(steps):
                if s["d"] and s["p"] > 1024:
                    key = "packed d <= 48" if s["d"] <= 48 else "packed d 49-80" if s["d"] <= 80 else "packed d > 80"
                    bins.setdefault(key, []).append(i)
                    bins.setdefault("packed, all", []).append(i)
                    bins.setdefault("packed, inside the hull" if not hull.outside(s) else "packed, outside", []).append(i)
                elif s["p"]:
                    bins.setdefault("other steps with prefill", []).append(i)
                    # by the own profile's hull: which of them the point moves
                    why = own_hull.reasons(s) if own_hull.outside(s) else ["inside"]
                    bins.setdefault(f"other, {why[0]}", []).append(i)
                    bins.setdefault(f"other, {why[0]}, now {'inside' if not hull.outside(s) else 'outside'}",
                                    []).append(i)
            print(f"  {name:14s} {label:9s}:")
            for k, ix in sorted(bins.items()):
                print(f"      {k:42s} {sum(model[i] for i in ix) / sum(steps[i]['ms'] for i in ix):.4f} (n {len(ix)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
