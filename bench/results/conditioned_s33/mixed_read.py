"""Issue 35, session 33: where the model's busy mixed steps fall short of live, on a grid part with the
conditioned profile (the decode-only steps now read 0.995 of live). The busy steps with prefill, the
model's charge (the simulator's, `fidelity_steps.model_step_ms`, every term) and its raw charge (the
profile's surface at the step's shape, no term) over live, split by where the step's chunk starts
(a prompt's first chunk at 0, or a later one after its prefix), and by decodes (the decodes' spread: spread_regression.py).

    python bench/results/conditioned_s33/mixed_read.py PART_DIR
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench/results/fidelity_grid_h100_s21/analysis"))
from prefill_bins import load

from bench.simulator import fidelity_steps

D_BINS = ((1, 15), (16, 31), (32, 47), (48, 256))


def main(part: Path) -> None:
    steps, bad, cost, terms = load(part)
    model = {i: t for i, t, _f in fidelity_steps.model_step_ms(cost, steps)}
    busy = [i for i, s in enumerate(steps) if s["p"] and s["d"] and not s["idle_before"] and i in model]
    raw = {i: 1e3 * cost.step_time(steps[i]["d"], steps[i]["p"], steps[i]["ctx"], steps[i]["chunks"])
           for i in busy}
    print(f"== {part.name}: {len(steps)} steps ({bad} rebuild mismatches), {len(busy)} busy steps with "
          f"prefill and decodes; terms {terms}")
    print(f"{'group':34s} {'n':>5s} {'live ms':>8s} {'model/live':>10s} {'raw/live':>9s}")

    def row(name, sel):
        if len(sel) < 10:
            return
        live = sum(steps[i]["ms"] for i in sel)
        print(f"{name:34s} {len(sel):5d} {live / len(sel):8.3f} {sum(model[i] for i in sel) / live:10.4f} "
              f"{sum(raw[i] for i in sel) / live:9.4f}")

    row("all", busy)
    first = [i for i in busy if all(st == 0 for _n, st in steps[i]["chunks"])]
    later = [i for i in busy if i not in set(first)]
    for name, grp in (("first chunk (start 0)", first), ("later chunk (start > 0)", later)):
        row(name, grp)
        for lo, hi in D_BINS:
            sel = [i for i in grp if lo <= steps[i]["d"] <= hi]
            row(f"  d {lo}-{hi}", sel)
    for k in (1, 2, 3):
        row(f"{k} chunk(s)", [i for i in busy if len(steps[i]["chunks"]) == k])


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
