"""Issue 35, session 21: a part's live steps with one 129-256-token chunk, model / live of each bin's
total time by decodes and by their contexts' spread (max / mean), in three forms: the grid state's
model with --cap-by-power ("cap"), without it ("nocap": the simulator's default), and without it and
without the mixed steps' spread term ("nomixed": sims.profile_cost, "Unequal contexts beside a
chunk"). Run from the repo root:  python mixed_spread_bins.py PART_DIR"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from prefill_bins import load, spread

from bench.simulator import fidelity_steps as fs
from sims.profile_cost import ProfileCost

part = Path(sys.argv[1]); tag = part.name
steps, bad, cost, terms = load(part)
nocap_terms = {k: v for k, v in terms.items() if k != "cap_by_power"}
cost_nc = ProfileCost.from_json(part / f"profile_{tag}.json", **nocap_terms, decode_spread="measured")
cost_nm = ProfileCost.from_json(part / f"profile_{tag}.json", **nocap_terms, decode_spread="measured",
                                mixed_spread="off")
r1 = {i: t for i, t, f in fs.model_step_ms(cost, steps)}
r2 = {i: t for i, t, f in fs.model_step_ms(cost_nc, steps)}
r3 = {i: t for i, t, f in fs.model_step_ms(cost_nm, steps)}
print(tag, "terms", terms, "mixed spread kappas",
      [(m["num_decode_seqs"], round(m["kappa"], 2)) for m in cost_nc.mixed_point_kappas])
for lo, hi in ((1, 8), (9, 32), (33, 64), (65, 256)):
    for slo, shi in ((1.0, 1.5), (1.5, 2.0), (2.0, 3.0), (3.0, 99)):
        idx = [i for i, s in enumerate(steps) if 129 <= s["p"] <= 256 and len(s["chunks"]) == 1 and lo <= s["d"] <= hi and slo <= spread(s) < shi]
        if len(idx) < 15: continue
        l = sum(steps[i]["ms"] for i in idx)
        print(f"  d {lo:3d}-{hi:3d} spread {slo:.1f}-{shi:4.1f}: n {len(idx):4d}  cap {sum(r1[i] for i in idx) / l:.4f}"
              f"  nocap {sum(r2[i] for i in idx) / l:.4f}  nomixed {sum(r3[i] for i in idx) / l:.4f}")
