"""Issue 35, session 41: the first step of a run of steps with prefill, live over the paused model (no cap), by the
length of the decode-only spell before it (from the end of the last step with prefill to its start; steps after an
idle spell left out). Why: the delayed onset charges a run's first steps nothing, but on the 33B they read
1.02-1.045 live: is that the limiter not yet released after a short spell, or a level that stays?

    python bench/results/pairs_s41/first_after_spell.py PART_DIR [PART_DIR ...]
"""
import sys
from pathlib import Path

from bench.simulator import fidelity_steps as fs
from bench.simulator.validate import async_plan_lead, model_terms
from sims.profile_cost import ProfileCost

for arg in sys.argv[1:]:
    part = Path(arg)
    prof, doc, steps = fs.part_live_steps(part)
    terms = model_terms(doc, async_plan_lead(doc, "cuda"))
    paused = ProfileCost.from_json(prof, **{**terms, "power_cap": False, "cap_by_power": False})
    base = {i: t for i, t, _f in fs.model_step_ms(paused, steps)}
    bins = [(0, 0.03), (0.03, 0.06), (0.06, 0.1), (0.1, 0.2), (0.2, 10)]
    acc = {}
    prev_p, spell_start = False, None
    last_p_end = None
    for i, s in enumerate(steps):
        if not s["d"] and not s["p"]:
            continue
        if s["p"]:
            if not prev_p and last_p_end is not None and not s.get("idle_before") and i in base:
                gap = s["start"] - last_p_end
                b = next(j for j, (lo, hi) in enumerate(bins) if lo <= gap < hi)
                a = acc.setdefault(b, [0, 0, 0]); a[0] += s["ms"]; a[1] += base[i]; a[2] += 1
            last_p_end = s["end"]; prev_p = True
        else:
            prev_p = False
    print(part.name, " ".join(f"{lo*1e3:.0f}-{hi*1e3:.0f}ms: {a[0]/a[1]:.4f} ({a[2]})" for j, (lo, hi) in enumerate(bins) if (a := acc.get(j))))
