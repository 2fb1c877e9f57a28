"""Issue 35, session 26: a mixed-lengths part's live steps with decodes (1-63) and at most 256 prefill tokens, live -
model (the default form, each step at its own live history: `fidelity_steps.model_step_ms`) for one chunk against
two, the two-chunk steps grouped by the continuing chunk's start and by the new prompt's chunk size. Run from the
repo root:

    python bench/results/fidelity_prefix_s26/two_chunk_excess.py PART_DIR
"""
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
for d in (ROOT, ROOT / "bench/results/fidelity_grid_h200_s25/analysis", ROOT / "bench/results/fidelity_grid_h200_s20/analysis",
          ROOT / "bench/results/fidelity_spread_s19"):
    sys.path.insert(0, str(d))
import prefill_bins
import prefill_bins_forms

from bench.simulator import fidelity_steps


def main(part: Path) -> None:
    prefill_bins.build = prefill_bins_forms.builder("cap")
    steps, bad, cost, terms = prefill_bins.load(part)
    res = {i: t for i, t, _ in fidelity_steps.model_step_ms(cost, steps)}
    pre = [i for i, s in enumerate(steps) if s["p"] and i in res and 0 < s["d"] < 64 and s["p"] <= 256]
    one = [i for i in pre if len(steps[i]["chunks"]) == 1]
    two = [i for i in pre if len(steps[i]["chunks"]) == 2]
    print(f"== {part.name}: rebuild mismatches {bad}; terms {terms}")

    def show(name: str, sel: list[int]) -> None:
        if not sel:
            return
        g = np.array([steps[i]["ms"] - res[i] for i in sel])
        r = sum(res[i] for i in sel) / sum(steps[i]["ms"] for i in sel)
        print(f"   {name:42s} n {len(sel):5d}  live - model median {np.median(g):+.3f}  mean {g.mean():+.3f} ms"
              f"  model/live {r:.4f}")

    show("1 chunk, start 0", [i for i in one if steps[i]["chunks"][0][1] == 0])
    show("1 chunk, start > 0", [i for i in one if steps[i]["chunks"][0][1] > 0])
    for lo, hi in ((0, 0), (1, 511), (512, 1023), (1024, 1 << 30)):
        show(f"2 chunks, continuing chunk's start {lo}-{min(hi, 99999)}",
             [i for i in two if lo <= max(s for _, s in steps[i]["chunks"]) <= hi])
    for lo, hi in ((1, 16), (17, 64), (65, 128), (129, 255)):
        show(f"2 chunks, new prompt's chunk {lo}-{hi} tokens",
             [i for i in two if max(s for _, s in steps[i]["chunks"]) > 0
              and any(s == 0 and lo <= n <= hi for n, s in steps[i]["chunks"])])


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
