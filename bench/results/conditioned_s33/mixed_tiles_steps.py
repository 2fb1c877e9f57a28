"""Issue 35, session 33: the whole-tiles term at the live steps, without the schedule: per grid part, the cost model
(the grid state's, every term, `fidelity_steps.model_step_ms`) over live for the busy steps with prefill and decodes
and the decode-only ones, with `mixed_tiles` off and on.

    python bench/results/conditioned_s33/mixed_tiles_steps.py PART_DIR...
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench/results/fidelity_grid_h100_s21/analysis"))
from prefill_bins import load

from bench.simulator import fidelity_steps


def main(parts: list[Path]) -> None:
    print(f"{'part':55s} {'mixed n':>7s} {'off':>7s} {'on':>7s}  {'decode n':>8s} {'off':>7s} {'on':>7s}")
    for part in parts:
        steps, _bad, cost, _terms = load(part)
        mixed = [i for i, s in enumerate(steps) if s["p"] and s["d"] and not s["idle_before"]]
        dec = [i for i, s in enumerate(steps) if s["d"] and not s["p"] and not s["idle_before"]]
        out = []
        for on in (False, True):
            cost.mixed_tiles = on
            cost._memo.clear()
            m = {i: t for i, t, _ in fidelity_steps.model_step_ms(cost, steps)}
            out.append([sum(m[i] for i in sel) / sum(steps[i]["ms"] for i in sel) for sel in (mixed, dec)])
        name = str(part.resolve().relative_to(ROOT / "bench/results"))
        print(f"{name:55s} {len(mixed):7d} {out[0][0]:7.4f} {out[1][0]:7.4f}  {len(dec):8d} {out[0][1]:7.4f} "
              f"{out[1][1]:7.4f}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main([Path(x) for x in sys.argv[1:]])
