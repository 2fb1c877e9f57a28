"""Issue 35, session 36: a part's live steps against the cost model at HEAD, by step kind, where the part's validate
JSON is missing (the H100 33B FP8 part: its JSON was lost to the timeout) or beside one that has it.

The model's terms are what `validate_replay` gives the part's profile (`model_terms` from the profile, the cap by
step kind where it has the mixed step's sustained run, the tiles terms at its tile-edge pairs); the steps are
rebuilt from the step and decision logs (`fidelity_steps.live_steps`). Prints model / live over the totals for
decode-only steps and steps with prefill, each by decode count bin (d) and, with prefill, by prefill tokens (p).

    python bench/results/pairs_s36/steps_vs_model.py PART_DIR [--tiles off]
"""
import collections
import json
import sys
from pathlib import Path

from bench.simulator import fidelity_steps as fs
from bench.simulator.validate import async_plan_lead, model_terms
from scheduler.decisions import read_log
from sims.profile_cost import ProfileCost
from sims.profile_terms import has_sustained_mixed

D_BINS = ((1, 8), (9, 32), (33, 64), (65, 256))
P_BINS = ((1, 128), (129, 256), (257, 512), (513, 1024), (1025, 4096))


def main(argv: list[str]) -> None:
    part = Path(argv[0])
    tiles_off = "--tiles" in argv and argv[argv.index("--tiles") + 1] == "off"
    tag = part.name
    prof = part / f"profile_{tag}.json"
    doc = json.loads(prof.read_text())
    terms = model_terms(doc, async_plan_lead(doc, "cuda"))
    if terms.get("power_cap") and has_sustained_mixed(doc):
        terms["cap_by_power"] = True
    if tiles_off:
        terms |= {"mixed_tiles": "off", "decode_tiles": "off"}
    cost = ProfileCost.from_json(prof, **terms)
    arr, _ = read_log(part / f"decisions_{tag}.jsonl.gz")
    steps, bad = fs.live_steps(fs.read_steps(part / f"steps_{tag}.jsonl.gz"), {a.request_id: a.max_tokens for a in arr})
    model = {i: t for i, t, _f in fs.model_step_ms(cost, steps)}
    print(f"== {tag}: {len(steps)} steps ({bad} rebuilt wrong); terms {terms}; tile fractions {cost.tile_fractions}")
    groups = collections.defaultdict(list)
    for i, s in enumerate(steps):
        if i not in model or not s["d"] and not s["p"]:
            continue
        kind = "prefill" if s["p"] else "decode"
        dbin = next((f"{lo}-{hi}" for lo, hi in D_BINS if lo <= s["d"] <= hi), "0")
        groups[(kind, dbin)].append((model[i], s["ms"]))
        groups[(kind, "all")].append((model[i], s["ms"]))
        if s["p"]:  # steps with prefill by their prefill tokens too (the chunks TTFT waits on)
            pbin = next(f"p {lo}-{hi}" for lo, hi in P_BINS if lo <= s["p"] <= hi)
            groups[(kind, pbin)].append((model[i], s["ms"]))
    print(f"{'kind':8s} {'bin':>10s} {'n':>6s} {'live ms':>8s} {'model/live':>10s}")
    for (kind, dbin), v in sorted(groups.items()):
        if len(v) < 10:
            continue
        m, live = sum(x for x, _ in v), sum(y for _, y in v)
        print(f"{kind:8s} {dbin:>10s} {len(v):6d} {live / len(v):8.3f} {m / live:10.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
