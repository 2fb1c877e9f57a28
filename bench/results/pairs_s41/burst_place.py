"""Issue 35, session 41: the live busy steps with prefill by their place in a run of steps with prefill back to back
(1st, 2nd, 3rd-4th, 5th-8th, 9th on), per load: live over the paused model (no cap), then model / live for the
default form, the stream anchors (`stream`), those with the limiter's fast onset (`stream_fast`) and the delayed
onset (`delay`, built from this read: sims.profile_cost, "The delayed onset").

Why (prediction 38): at 0.95x the H100 6.7B bf16's steps with prefill come 5-7 back to back on average (2.7 at 0.5x).
If the limiter answers such bursts, a burst's later steps run slower than its first at every load, and the load
slope of section 6 is the bursts' length. The default model charges the burst through its busy share (time constant
of the sustained trace); the model columns say which form follows the places.

    python bench/results/pairs_s41/burst_place.py PART_DIR [PART_DIR ...]
"""
import sys
from pathlib import Path

from bench.simulator import fidelity_steps as fs
from bench.simulator.validate import async_plan_lead, model_terms
from sims.profile_cost import ProfileCost

PLACES = ((1, 1), (2, 2), (3, 4), (5, 8), (9, 10_000))


def main(argv: list[str]) -> None:
    for arg in argv:
        part = Path(arg)
        prof, doc, steps = fs.part_live_steps(part)
        terms = model_terms(doc, async_plan_lead(doc, "cuda"))
        costs = {"default": ProfileCost.from_json(prof, **terms),
                 "stream": ProfileCost.from_json(prof, **terms, cap_anchors="stream"),
                 "stream_fast": ProfileCost.from_json(prof, **terms, cap_anchors="stream", cap_onset="fast"),
                 "delay": ProfileCost.from_json(prof, **terms, cap_onset="delay"),
                 "paused": ProfileCost.from_json(prof, **{**terms, "power_cap": False, "cap_by_power": False})}
        models = {n: {i: t for i, t, _f in fs.model_step_ms(c, steps)} for n, c in costs.items()}
        labels = [lo for lo, _seed in fs.validate_run_labels(part)]
        runs = fs.runs_at_gaps(steps, 1.0)
        acc: dict[tuple[str, int], list[float]] = {}
        for k, idx in enumerate(runs):
            load = labels[k] if len(labels) == len(runs) else ("0.5x", "0.8x", "0.95x")[k % 3]
            place = 0
            for i in idx:
                s = steps[i]
                place = place + 1 if s["p"] else 0
                if not s["p"] or s.get("idle_before") or i not in models["paused"]:
                    continue
                b = next(j for j, (lo, hi) in enumerate(PLACES) if lo <= place <= hi)
                a = acc.setdefault((load, b), [0.0, 0.0, 0.0, 0.0, 0.0, 0, 0.0])
                a[0] += s["ms"]
                a[1] += models["paused"][i]
                a[2] += models["default"][i]
                a[3] += models["stream"][i]
                a[4] += models["stream_fast"][i]
                a[5] += 1
                a[6] += models["delay"][i]
        print(f"== {part}: busy steps with prefill by place in their run back to back")
        print(f"{'load':6s} {'place':>6s} {'n':>6s} {'live/paused':>11s} {'default/live':>12s} {'stream/live':>11s} "
              f"{'fast/live':>10s} {'delay/live':>10s}")
        for load in ("0.5x", "0.8x", "0.95x"):
            for b, (lo, hi) in enumerate(PLACES):
                a = acc.get((load, b))
                if not a or a[5] < 20:
                    continue
                place = f"{lo}" if lo == hi else f"{lo}-{hi}" if hi < 10_000 else f"{lo}+"
                print(f"{load:6s} {place:>6s} {a[5]:6d} {a[0] / a[1]:11.4f} {a[2] / a[0]:12.4f} {a[3] / a[0]:11.4f} "
                      f"{a[4] / a[0]:10.4f} {a[6] / a[0]:10.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
