"""Issue 35, session 40: a part's busy steps with prefill and decodes, live over the paused profile (the model
with no power cap), by load and by the decodes beside the chunk.

Why: on the H100 33B bf16 the live mixed steps run 1.03 / 1.055 / 1.076 x the paused profile with 1-15 / 16-31 /
32-47 decodes beside the chunk (read/mixed_read.txt), and the loads run at different d. If the excess rises with
d inside one load, it is the step's shape (what the profile's points do not hold); if it rises with load at one
d, it is the board's power over the run (the cap). The hot patterns (prediction 32) ruled out the card's heat.

    python bench/results/pairs_s40/mixed_by_load_d.py PART_DIR [PART_DIR ...]
"""
import sys
from pathlib import Path

from bench.simulator import fidelity_steps as fs
from bench.simulator.validate import async_plan_lead, model_terms
from sims.profile_cost import ProfileCost

GAP_S = 1.0
D_BINS = [(1, 7), (8, 15), (16, 23), (24, 31), (32, 47), (48, 128)]


def main(argv: list[str]) -> None:
    acc: dict[tuple[str, tuple[int, int]], list[float]] = {}
    for arg in argv:
        part = Path(arg)
        prof, doc, steps = fs.part_live_steps(part)
        terms = {**model_terms(doc, async_plan_lead(doc, "cuda")), "power_cap": False}
        terms.pop("cap_by_power", None)
        paused = ProfileCost.from_json(prof, **terms)
        model = {i: t for i, t, _f in fs.model_step_ms(paused, steps)}
        labels = [load for load, _seed in fs.validate_run_labels(part)]
        runs = fs.runs_at_gaps(steps, GAP_S)
        if len(runs) != len(labels):
            print(f"{part}: {len(runs)} runs, {len(labels)} labels: runs left out")
            continue
        for load, idx in zip(labels, runs, strict=True):
            for i in idx:
                s = steps[i]
                if not (s["p"] and s["d"]) or i not in model:
                    continue
                b = next((r for r in D_BINS if r[0] <= s["d"] <= r[1]), None)
                if b is not None:
                    acc.setdefault((load, b), [0.0, 0.0, 0])
                    a = acc[(load, b)]
                    a[0] += s["ms"]
                    a[1] += model[i]
                    a[2] += 1
    loads = sorted({k[0] for k in acc}, key=lambda x: float(x.rstrip("x")))
    print("busy steps with prefill and decodes: live / paused model (n), by load and decodes beside the chunk")
    print(f"{'decodes':>8s} " + " ".join(f"{ld:>16s}" for ld in loads))
    for b in D_BINS:
        cells = []
        for ld in loads:
            a = acc.get((ld, b))
            cells.append(f"{a[0] / a[1]:7.3f} ({a[2]:5d})" if a and a[2] >= 10 else f"{'-':>16s}")
        print(f"{f'{b[0]}-{b[1]}':>8s} " + " ".join(cells))


if __name__ == "__main__":
    main(sys.argv[1:])
