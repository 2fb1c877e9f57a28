"""Issue 35, session 25: a part's live mixed steps (129-256 prefill tokens beside 1-32 decodes) charged by the
cost model at their own live history (the cap form, the default: `prefill_bins_forms.builder("cap")`), model /
live of each group's total time, grouped by the step before, by the chunks' start position (the prefix the chunk
attends to: the profile measures chunk starts 0 and 256 only), by chunk count and by token count; and the
median live - model by the step before's live duration (a check of the launch-hiding reading). Run from the root:

    python bench/results/fidelity_grid_h200_s25/analysis/chunk_start_bins.py PART_DIR
"""
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
for d in (ROOT, ROOT / "bench/results/fidelity_spread_s19", ROOT / "bench/results/fidelity_grid_h200_s20/analysis", HERE):
    sys.path.insert(0, str(d))
import prefill_bins
import prefill_bins_forms

from bench.simulator import fidelity_steps


def main(part: Path) -> None:
    prefill_bins.build = prefill_bins_forms.builder("cap")
    steps, bad, cost, terms = prefill_bins.load(part)
    res = {i: t for i, t, _f in fidelity_steps.model_step_ms(cost, steps)}
    pre = [i for i, s in enumerate(steps) if s["p"] and i in res and 129 <= s["p"] <= 256 and 1 <= s["d"] <= 32]
    print(f"== {part.name}: {len(pre)} mixed steps of 129-256 tokens beside 1-32 decodes; rebuild mismatches {bad}; "
          f"terms {terms}")

    def show(name: str, key) -> None:
        groups: dict[str, list[int]] = {}
        for i in pre:
            k = key(i)
            if k is not None:
                groups.setdefault(k, []).append(i)
        print(name)
        for k in sorted(groups):
            sel = groups[k]
            r = sum(res[i] for i in sel) / sum(steps[i]["ms"] for i in sel)
            print(f"   {k:28s} n {len(sel):5d}  model/live {r:.4f}")

    def before(i: int) -> str:
        if steps[i]["idle_before"]:
            return "idle before"
        return "after a step with prefill" if i and steps[i - 1]["p"] else "after a decode-only step"

    def start(i: int) -> str:
        st = max(s for _, s in steps[i]["chunks"])
        return ("start 0" if st == 0 else "start 1-511" if st < 512 else "start 512-1023" if st < 1024
                else "start >= 1024")

    def prev_ms(i: int) -> str | None:
        if steps[i]["idle_before"] or i == 0:
            return None
        pm = steps[i - 1]["ms"]
        return "prev < 6 ms" if pm < 6 else "prev 6-8 ms" if pm < 8 else "prev 8-12 ms" if pm < 12 else "prev >= 12 ms"

    show("by the step before", before)
    show("by the chunks' start (the longest prefix a chunk attends to)", start)
    show("by chunks", lambda i: f"{len(steps[i]['chunks'])} chunk(s)")
    show("by tokens", lambda i: "p < 256" if steps[i]["p"] < 256 else "p = 256")
    gaps: dict[str, list[float]] = {}
    for i in pre:
        k = prev_ms(i)
        if k is not None:
            gaps.setdefault(k, []).append(steps[i]["ms"] - res[i])
    print("live - model (ms), median, by the step before's live duration")
    for k in sorted(gaps):
        print(f"   {k:16s} n {len(gaps[k]):5d}  {np.median(gaps[k]):+.3f} ms")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
